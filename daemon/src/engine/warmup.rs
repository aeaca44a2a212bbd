//! Warm-up: before the daemon listens, it runs the shapes the scheduler will use (one prefill
//! chunk, one batched decode step at the largest batch) so no user waits on first-use costs
//! (kernel compilation on a GPU; BLAS work buffers and page faults on the CPU), and so the
//! memory an idle daemon holds is what it holds after serving, not less.

use std::time::{Duration, Instant};

use crate::Result;
use crate::model::Model;
use crate::paged::{PagedBatch, PagedSeq};
use crate::pool::BlockPool;

/// Runs the prefill chunks the model asks for ([`Model::warm_up_chunks`]) and a decode step of `max_running` sequences, as far as
/// the pool's ceiling allows; gives every block back. Returns how long it took.
pub fn run(
    model: &Model,
    pool: &mut BlockPool,
    prefill_chunk: usize,
    max_running: usize,
) -> Result<Duration> {
    let started = Instant::now();
    let bt = pool.shape().block_tokens;
    let blocks = pool.free_blocks() as usize;
    // Ordinary token ids (not special ones), so the pass is like a real prompt's.
    let ids = |n: usize| -> Vec<u32> { (0..n).map(|i| 1000 + (i % 4000) as u32).collect() };
    let room = blocks.saturating_sub(1) * bt;
    for (offset, tokens) in model.warm_up_chunks(prefill_chunk) {
        let tokens = tokens.min(room.saturating_sub(offset));
        if tokens == 0 {
            continue;
        }
        let mut seq = PagedSeq::default();
        let out = prefill(
            model,
            pool,
            &mut seq,
            &ids(offset + tokens),
            offset,
            prefill_chunk,
        )
        .and_then(|()| model.forward(&ids(tokens), &mut seq.store(pool)));
        seq.free(pool);
        out?.eval()?;
    }
    let batch = max_running.min(pool.free_blocks() as usize);
    if batch > 0 {
        let mut seqs: Vec<PagedSeq> = (0..batch).map(|_| PagedSeq::default()).collect();
        let mut result = Ok(());
        for s in seqs.iter_mut() {
            result = model
                .forward(&ids(1), &mut s.store(pool))
                .and_then(|l| Ok(l.eval()?));
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            let mut kv = PagedBatch::new(seqs.iter_mut().collect(), pool);
            result = model
                .forward_batch(&ids(batch), &mut kv)
                .and_then(|l| Ok(l.eval()?));
        }
        seqs.iter_mut().for_each(|s| s.free(pool));
        result?;
    }
    mlx_rs::memory::clear_cache()?;
    crate::host_memory::trim_freed_memory();
    crate::jit_cache::publish();
    Ok(started.elapsed())
}

/// Stores the first `n` of `ids` in `seq`, `chunk` tokens at a time, as the scheduler would.
fn prefill(
    model: &Model,
    pool: &mut BlockPool,
    seq: &mut PagedSeq,
    ids: &[u32],
    n: usize,
    chunk: usize,
) -> Result<()> {
    for piece in ids[..n].chunks(chunk.max(1)) {
        model.forward(piece, &mut seq.store(pool))?.eval()?;
    }
    Ok(())
}
