//! Warm-up: before the daemon listens, it runs the shapes the scheduler will use (prefill chunks:
//! on a GPU every padded row count and every attention shape up to a long context, on the CPU one
//! chunk; batched decode steps, masked and not, and their draws, at the largest batch and on a
//! GPU at each row count that chooses other kernels ([`Model::warm_up_batches`]); on CUDA a
//! step whose long row's keys are split into parts) so no user
//! waits on first-use costs (kernel builds on a GPU; BLAS work buffers and page faults on the
//! CPU), and so the memory an idle daemon holds is what it holds after serving, not less.

use std::cell::Cell;
use std::time::{Duration, Instant};

use super::Progress;
use crate::Result;
use crate::kv::GrowingKv;
use crate::model::Model;
use crate::paged::{OwnRead, PagedBatch, PagedChunks};
use crate::pool::BlockPool;
use crate::scheduler::BlockTable;
use crate::warm_workers::{Part, Share};

/// What a warm-up ran.
#[derive(Debug, Clone)]
pub struct Warmed {
    pub took: Duration,
    /// Prefill chunks run through the model.
    pub chunks: usize,
    /// Attention shapes built on their own (a GPU's).
    pub attention_shapes: usize,
    /// The batch sizes decode steps ran at (none where the pool had no room).
    pub batches: Vec<usize>,
    /// The most memory one prefill chunk's pass took beyond what it stored (its activations and
    /// work buffers; measured from MLX's peak, less the pool's growth): what a step frees.
    pub step_bytes: u64,
}

/// Runs the prefill chunks the model asks for ([`Model::warm_up_chunks`],
/// [`Model::warm_up_attention`]) and a decode step of `max_running` sequences, as far as the
/// pool's ceiling allows; gives every block back. A warm-up worker runs only its `share` of
/// these jobs ([`crate::warm_workers`]); the daemon all of them.
pub fn run(
    model: &Model,
    pool: &mut BlockPool,
    prefill_chunk: usize,
    max_running: usize,
    share: Share,
    progress: &Progress,
) -> Result<Warmed> {
    let started = Instant::now();
    let jobs = Jobs::of(share, Part::Prefill);
    let bt = pool.shape().block_tokens;
    let blocks = pool.free_blocks() as usize;
    let room = blocks.saturating_sub(1) * bt;
    // The attention shapes first: on CUDA the first builds cuDNN's state, which their stage's
    // time then shows apart from the chunks'.
    let attention_shapes = if jobs.mine() {
        stage(progress, "attention shapes", || {
            model.warm_up_attention(prefill_chunk, room)
        })?
    } else {
        0
    };
    let all_chunks = model.warm_up_chunks(prefill_chunk);
    let chunks: Vec<usize> = all_chunks.iter().copied().filter(|_| jobs.mine()).collect();
    let what = match chunks.len() {
        1 => "a prefill chunk".to_string(),
        n => format!("{n} prefill chunk sizes"),
    };
    let step_bytes = if share == Share::WHOLE {
        stage(progress, &what, || warm_chunks(model, pool, &chunks, room))?
    } else {
        // A worker's chunks one stage each: what one builds reaches the other workers sooner.
        let mut most = 0;
        for &c in &chunks {
            let what = format!("a {c}-token prefill chunk");
            most = most.max(stage(progress, &what, || {
                warm_chunks(model, pool, &[c], room)
            })?);
        }
        most
    };
    if model.placement.gathers_prefill_keys && jobs.mine() {
        stage(progress, "a prefill chunk reading gathered keys", || {
            warm_gathered_chunk(
                model,
                pool,
                all_chunks.first().copied().unwrap_or(0).min(room),
            )
        })?;
    }
    let jobs = Jobs::of(share, Part::Decode);
    // Each row ends at 3 tokens (the first row's 2 and a step; the others' 1 and two steps).
    let most = max_running.min(pool.free_blocks() as usize / 3usize.div_ceil(bt));
    let batches: Vec<usize> = if most > 0 {
        model.warm_up_batches(most)
    } else {
        Vec::new()
    };
    let batches: Vec<usize> = batches.into_iter().filter(|_| jobs.mine()).collect();
    if !batches.is_empty() {
        let what = match batches.as_slice() {
            [one] => format!("{one}-sequence decode steps and draws"),
            sizes => format!("decode steps and draws of {sizes:?} sequences"),
        };
        stage(progress, &what, || {
            batches
                .iter()
                .try_for_each(|&batch| warm_decode(model, pool, batch))
        })?;
    }
    if let Some(long) = model.split_decode_from()
        && jobs.mine()
    {
        stage(progress, "a decode step over split keys", || {
            warm_split_decode(model, pool, long, prefill_chunk)
        })?;
    }
    stage(progress, "giving back its buffers", || {
        mlx_rs::memory::clear_cache()?;
        crate::host_memory::trim_freed_memory();
        Ok(())
    })?;
    Ok(Warmed {
        took: started.elapsed(),
        chunks: chunks.len(),
        attention_shapes,
        batches,
        step_bytes,
    })
}

/// A part of the warm-up's jobs in order, and whether each is this process's ([`Share`]).
struct Jobs {
    share: Share,
    part: Part,
    next: Cell<usize>,
}

impl Jobs {
    fn of(share: Share, part: Part) -> Jobs {
        Jobs {
            share,
            part,
            next: Cell::new(0),
        }
    }

    /// Whether the next job is this process's to run.
    fn mine(&self) -> bool {
        let job = self.next.get();
        self.next.set(job + 1);
        self.share.runs(self.part) && self.share.takes(job)
    }
}

/// Takes the kernels other processes published, runs `work`, publishes the kernels it built (a
/// first start on a GPU can take minutes, and one cut short, by a supervisor's timeout or
/// Ctrl-C, leaves the next start less to build) and logs what it took: a long warm-up says
/// where its time goes.
fn stage<T>(progress: &Progress, what: &str, work: impl FnOnce() -> Result<T>) -> Result<T> {
    progress.report(&format!("warm-up: {what}"));
    // What other processes (warm-up workers) built meanwhile is then not built again here.
    crate::jit_cache::reseed();
    let started = Instant::now();
    let out = work();
    let built = crate::jit_cache::publish();
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        kernels_built = built.len(),
        "warm-up: {what}"
    );
    if !built.is_empty() {
        tracing::debug!(names = ?built, "warm-up: {what}: the kernels it built");
    }
    out
}

/// Ordinary token ids (not special ones), so a pass is like a real prompt's.
fn ids(n: usize) -> Vec<u32> {
    (0..n).map(|i| 1000 + (i % 4000) as u32).collect()
}

/// One prefill chunk of each of `chunks` tokens (at most `room`); the most memory one took
/// beyond what it stored ([`Warmed::step_bytes`]).
fn warm_chunks(model: &Model, pool: &mut BlockPool, chunks: &[usize], room: usize) -> Result<u64> {
    let mut step_bytes = 0;
    for &tokens in chunks {
        let tokens = tokens.min(room);
        if tokens == 0 {
            continue;
        }
        let started = Instant::now();
        let (active, stored) = (mlx_rs::memory::active_memory()?, pool.measured_bytes());
        mlx_rs::memory::reset_peak_memory()?;
        let mut seq = BlockTable::default();
        let out = forward(model, &mut seq, pool, &ids(tokens));
        let grown = pool.measured_bytes().saturating_sub(stored);
        let peak = mlx_rs::memory::peak_memory()? as u64;
        step_bytes = step_bytes.max(peak.saturating_sub(active as u64 + grown));
        seq.free(pool);
        out?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(tokens, ms, "warm-up: prefill chunk");
    }
    Ok(step_bytes)
}

/// A prefill chunk of `tokens` that reads its keys gathered from the pool, as a GPU's pass does
/// where a prompt's blocks are scattered (a pool that has served requests), which the chunks
/// above, over fresh consecutive blocks, do not: the gather is a kernel of its own.
fn warm_gathered_chunk(model: &Model, pool: &mut BlockPool, tokens: usize) -> Result<()> {
    if tokens == 0 {
        return Ok(());
    }
    let mut seq = BlockTable::default();
    let out = grow(&mut seq, pool, tokens).and_then(|()| {
        let mut kv = PagedChunks::new(vec![&mut seq], pool).reading(OwnRead::Gather);
        let l = model.forward_packed(&[&ids(tokens)], &mut kv)?;
        Ok(l.eval()?)
    });
    seq.free(pool);
    out
}

/// A decode step of `batch` sequences and its draws, then one of all but the first: the first
/// row is one token longer, so the step over all rows is masked and the step over the rest (one
/// length) is not; on a GPU those are different kernels. The second step's tokens are the
/// first's draws, picked by row (a gather), as a step after a row ended reads them.
fn warm_decode(model: &Model, pool: &mut BlockPool, batch: usize) -> Result<()> {
    let mut seqs: Vec<BlockTable> = (0..batch).map(|_| BlockTable::default()).collect();
    let result = decode_steps(model, pool, &mut seqs);
    seqs.iter_mut().for_each(|s| {
        s.free(pool);
    });
    result
}

/// [`warm_decode`]'s work over `seqs` (new, empty), which the caller frees whatever happens.
fn decode_steps(model: &Model, pool: &mut BlockPool, seqs: &mut [BlockTable]) -> Result<()> {
    for (i, s) in seqs.iter_mut().enumerate() {
        forward(model, s, pool, &ids(1 + usize::from(i == 0)))?;
    }
    let batch = seqs.len();
    for s in seqs.iter_mut() {
        grow(s, pool, 1)?;
    }
    let logits = model.forward_batch(
        &ids(batch),
        &mut PagedBatch::new(seqs.iter_mut().collect(), pool),
    )?;
    let tokens = warm_draws(&logits, batch)?;
    if batch > 1 {
        let rest: Vec<i32> = (1..batch as i32).collect();
        let ids = tokens.take_axis(mlx_rs::Array::from_slice(&rest, &[rest.len() as i32]), 0)?;
        for s in seqs.iter_mut().skip(1) {
            grow(s, pool, 1)?;
        }
        let mut kv = PagedBatch::new(seqs.iter_mut().skip(1).collect(), pool);
        model.forward_step(&ids, &mut kv)?.eval()?;
    }
    Ok(())
}

/// A decode step of two rows, one `long` tokens (prefilled in chunks of `chunk`), one a token:
/// on CUDA few long rows split their keys into parts, which are two more kernels. Skipped
/// where the pool has no room for it.
fn warm_split_decode(model: &Model, pool: &mut BlockPool, long: usize, chunk: usize) -> Result<()> {
    let bt = pool.shape().block_tokens;
    if (long + 1).div_ceil(bt) + 1 > pool.free_blocks() as usize || chunk == 0 {
        return Ok(());
    }
    let mut seqs = [BlockTable::default(), BlockTable::default()];
    let mut result = Ok(());
    while result.is_ok() && seqs[0].len < long {
        let n = chunk.min(long - seqs[0].len);
        let at = seqs[0].len;
        result = timed(&format!("the long row's chunk of {n} at {at}"), || {
            forward(model, &mut seqs[0], pool, &ids(n))
        });
    }
    if result.is_ok() {
        result = timed("the short row", || {
            forward(model, &mut seqs[1], pool, &ids(1))
        });
    }
    if result.is_ok() {
        result = timed("the step", || {
            for s in seqs.iter_mut() {
                grow(s, pool, 1)?;
            }
            let mut kv = PagedBatch::new(seqs.iter_mut().collect(), pool);
            Ok(model.forward_batch(&ids(2), &mut kv)?.eval()?)
        });
    }
    seqs.iter_mut().for_each(|s| {
        s.free(pool);
    });
    result
}

/// Allocates room for `tokens` more tokens in `seq` (the warm-up's own sequences, before it
/// serves: the scheduler allocates once it does).
fn grow(seq: &mut BlockTable, pool: &mut BlockPool, tokens: usize) -> Result<()> {
    match seq.grow(pool, tokens) {
        Some(_) => Ok(()),
        None => Err(crate::EngineError::PoolExhausted {
            needed_tokens: tokens,
            free_blocks: pool.free_blocks(),
        }),
    }
}

/// A pass of `tokens` over `seq` alone, grown for them first.
fn forward(
    model: &Model,
    seq: &mut BlockTable,
    pool: &mut BlockPool,
    tokens: &[u32],
) -> Result<()> {
    let mut kv = seq.store(pool);
    kv.grow(tokens.len())?;
    Ok(model.forward(tokens, &mut kv)?.eval()?)
}

/// Runs `work` and logs what it took (debug): a stage's parts.
fn timed(what: &str, work: impl FnOnce() -> Result<()>) -> Result<()> {
    let started = Instant::now();
    let out = work();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(ms, "warm-up: split keys: {what}");
    out
}

/// Draws a step's tokens from `logits` (`[rows, vocab]`) greedily and sampled with every filter,
/// so that the device's draw kernels are built too; the sampled draw's tokens (`[rows]`, u32).
fn warm_draws(logits: &mlx_rs::Array, rows: usize) -> Result<mlx_rs::Array> {
    use crate::batch_draw::{RowDraw, draw};
    let greedy = RowDraw::new(&Default::default(), 0.0);
    let sampled = RowDraw {
        temperature: 1.0,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        uniform: 0.5,
    };
    // A constrained row's draw adds its bias row (a grammar's mask, logit biases).
    let bias = mlx_rs::ops::zeros_like(logits)?;
    let drawn = |row: RowDraw, bias: Option<&mlx_rs::Array>| -> Result<mlx_rs::Array> {
        let drawn = draw(logits, bias, &vec![row; rows], true)?;
        mlx_rs::transforms::eval(drawn.logprobs.iter().chain([&drawn.tokens]))?;
        Ok(drawn.tokens)
    };
    drawn(greedy, None)?;
    drawn(greedy, Some(&bias))?;
    drawn(sampled, Some(&bias))?;
    drawn(sampled, None)
}
