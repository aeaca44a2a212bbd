//! `cargo bench -p mlxcel-daemon --bench steps`: the engine's two kinds of work, timed alone on
//! whatever device MLX picks (the GPU when there is one), with the pool laid out as the engine
//! lays it out there. For the GPU runs (`scripts/gpu_bench.sh` stages the binary), where the
//! served benchmark says how much and this says where.
//!
//! - Prefill: one chunk of each of a few prompt lengths into a fresh sequence, twice each. The
//!   first run of a shape may pay for compiling kernels or building a library's plans for it.
//!   Then a repeated prompt's new tokens: 7 after 4,096 stored ones whose blocks are scattered,
//!   one pass as the engine runs it, the keys read as spans and gathered, with the host's share.
//! - Decode: `B` sequences of `context` tokens each (distinct prompts), then batched decode
//!   steps; ms per step (median and best) and tok/s, and again with MLX's buffer cache cleared
//!   before each step (as the engine does after a prefill step). On a GPU, then the K/V path of those steps
//!   alone: every layer's write of the new rows and read of the keys (the CPU reads in place).
//!
//! Settings (environment, read through the test kit): `MLXCEL_BENCH_MODEL` (a GGUF file or a safetensors directory;
//! default: the default model), `MLXCEL_BENCH_CASES` (decode cases as `BxCONTEXT` or
//! `BxLO-HI`, contexts spread over LO..HI as a served batch's are, and an `s` after either for
//! a pool whose blocks are scattered as after serving many requests, comma separated; default
//! `1x200,8x200,32x200,32x200-700,1x4096,1x4096s,8x4096`), `MLXCEL_BENCH_STEPS` (default 20),
//! `MLXCEL_BENCH_POOL_BYTES` (the pool's ceiling; default: what the cases need; on a GPU set it
//! to the served ceiling, since a GPU pool's slab size follows the ceiling).

use std::path::PathBuf;
use std::time::Instant;

use mlx_rs::Array;
use mlxcel_daemon::kv::GrowingKv;
use mlxcel_daemon::kv::{BatchKv, OwnKeys};
use mlxcel_daemon::model::Model;
use mlxcel_daemon::paged::{OwnRead, PagedBatch, PagedChunks};
use mlxcel_daemon::pool::{BlockPool, PoolShape};
use mlxcel_daemon::scheduler::BlockTable;
use mlxcel_tests::knob;

/// The engine's default (`--block-tokens`).
const BLOCK_TOKENS: usize = 32;

fn main() {
    let path = knob("BENCH_MODEL").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        },
        PathBuf::from,
    );
    let cases: Vec<Case> = knob("BENCH_CASES")
        .unwrap_or_else(|| "1x200,8x200,32x200,32x200-700,1x4096,1x4096s,8x4096".into())
        .split(',')
        .filter_map(|c| {
            let (b, ctx) = c.trim().split_once('x')?;
            let (ctx, scattered) = match ctx.strip_suffix('s') {
                Some(ctx) => (ctx, true),
                None => (ctx, false),
            };
            let (lo, hi) = ctx.split_once('-').unwrap_or((ctx, ctx));
            Some(Case {
                b: b.parse().ok()?,
                lo: lo.parse().ok()?,
                hi: hi.parse().ok()?,
                scattered,
            })
        })
        .collect();
    let steps: usize = knob("BENCH_STEPS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let t = Instant::now();
    let loaded = mlxcel_daemon::load(&path).expect("load the model (MLXCEL_BENCH_MODEL)");
    let m = &loaded.model;
    println!(
        "model {} ({}) on {}, loaded in {:.1} s; {} layers, {}/{} heads, head_dim {}",
        loaded.model_id,
        path.display(),
        m.placement.describe(),
        t.elapsed().as_secs_f64(),
        m.config.layers,
        m.config.heads,
        m.config.kv_heads,
        m.config.head_dim
    );
    let seed = loaded
        .text
        .encode("The quick brown fox jumps over the lazy dog. ")
        .expect("encode");
    let most = cases
        .iter()
        .map(|c| (1 + c.scattered as usize) * c.b * (c.hi + c.b + 2 * steps + 2))
        .max();
    // The prefill cases need one sequence of up to ~4.1k tokens, scattered over twice that.
    let mut pool = pool_for(m, most.unwrap_or(0).max(8704));
    prefill_shapes(m, &mut pool, &seed);
    prefill_tail(m, &mut pool, &seed, steps);
    for case in cases {
        decode_steps(m, &mut pool, &seed, &case, steps);
    }
}

/// A decode case: `b` sequences of `lo..=hi` tokens; `scattered`: in a pool where every other
/// block is held (as after serving many requests), so no two of a sequence's blocks adjoin.
struct Case {
    b: usize,
    lo: usize,
    hi: usize,
    scattered: bool,
}

/// A pool of at least `tokens` tokens, or `MLXCEL_BENCH_POOL_BYTES` (the engine's ceiling,
/// which sets a GPU pool's slab size), laid out as the engine lays it out on the model's device.
fn pool_for(m: &Model, tokens: usize) -> BlockPool {
    let mut shape = PoolShape {
        layers: m.config.layers,
        num_blocks: (tokens.div_ceil(BLOCK_TOKENS) + 64) as u32,
        block_tokens: BLOCK_TOKENS,
        kv_heads: m.config.kv_heads,
        head_dim: m.config.head_dim,
        dtype: m.placement.dtype,
    };
    let ceiling: Option<usize> = knob("BENCH_POOL_BYTES").and_then(|v| v.parse().ok());
    if let Some(bytes) = ceiling {
        let blocks = (bytes / shape.block_bytes()) as u32;
        shape.num_blocks = shape.num_blocks.max(blocks);
    }
    println!(
        "pool: {} blocks of {} tokens, {} MiB",
        shape.num_blocks,
        BLOCK_TOKENS,
        (shape.num_blocks as usize * shape.block_bytes()) >> 20
    );
    if m.placement.gpu && ceiling.is_none() {
        // A GPU pool's slabs are 1/32 of the ceiling (at least 64 MiB): sized to the cases
        // alone, a batch's blocks spread over more slabs than a step reads by table, and the
        // step gathers instead of reading in place as a served one does.
        println!(
            "note: MLXCEL_BENCH_POOL_BYTES is unset: the slabs are smaller than a served pool's, \
             so decode steps of several rows may gather; set it to the served ceiling"
        );
    }
    BlockPool::for_device(shape, m.placement.gpu).expect("pool")
}

/// A pass of `tokens` over `seq` alone, grown for them first.
fn alone(
    m: &Model,
    seq: &mut BlockTable,
    pool: &mut BlockPool,
    tokens: &[u32],
) -> mlxcel_daemon::Result<Array> {
    let mut kv = seq.store(pool);
    kv.grow(tokens.len())?;
    m.forward(tokens, &mut kv)
}

fn prompt(seed: &[u32], skip: usize, len: usize) -> Vec<u32> {
    seed.iter().copied().cycle().skip(skip).take(len).collect()
}

/// One prefill chunk of each length after `offset` stored tokens of a fresh sequence, twice:
/// ms of the first and second. On a GPU each new padded shape costs its kernel build once.
fn prefill_shapes(m: &Model, pool: &mut BlockPool, seed: &[u32]) {
    let cases = [
        (0, 512),
        (0, 300),
        (0, 301),
        (0, 437),
        (0, 512),
        (192, 128),
        (192, 129),
        (100, 200),
        (512, 300),
        (3584, 512),
        (4000, 100),
    ];
    for (offset, len) in cases {
        let mut ms = Vec::new();
        for run in 0..2 {
            let mut seq = BlockTable::default();
            let tokens = prompt(seed, run, offset + len);
            for piece in tokens[..offset].chunks(512) {
                alone(m, &mut seq, pool, piece)
                    .and_then(|l| l.eval().map_err(Into::into))
                    .expect("prefill");
            }
            let t = Instant::now();
            alone(m, &mut seq, pool, &tokens[offset..])
                .and_then(|l| l.eval().map_err(Into::into))
                .expect("prefill");
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            seq.free(pool);
        }
        println!(
            "prefill chunk of {len} tokens after {offset}: first {:.1} ms, again {:.1} ms ({:.0} tok/s)",
            ms[0],
            ms[1],
            len as f64 / ms[1] * 1e3
        );
    }
}

/// Every other block of `blocks` pairs held (as after serving many requests): the held ones,
/// to release at the end.
fn scatter(pool: &mut BlockPool, blocks: usize) -> Vec<u32> {
    let all = pool.allocate(2 * blocks).expect("room to scatter");
    let (held, free): (Vec<u32>, Vec<u32>) = all.iter().partition(|&&id| id % 2 == 0);
    free.into_iter().for_each(|id| pool.release(id));
    held
}

/// A repeated prompt's new tokens: a prefill pass of 7 tokens after 4,096 stored ones whose
/// blocks are scattered, as the engine runs it (`forward_packed` over `PagedChunks`), the keys
/// read as spans and gathered: median ms to build the graph, to encode and submit it, in all,
/// over `steps` passes after one untimed.
fn prefill_tail(m: &Model, pool: &mut BlockPool, seed: &[u32], steps: usize) {
    let (prefix, tail): (usize, usize) = (4096, 7);
    let held = scatter(pool, (prefix + tail).div_ceil(BLOCK_TOKENS));
    let tokens = prompt(seed, 0, prefix + tail);
    let mut seq = BlockTable::default();
    for chunk in tokens[..prefix].chunks(512) {
        alone(m, &mut seq, pool, chunk)
            .and_then(|l| l.eval().map_err(Into::into))
            .expect("prefill");
    }
    seq.grow(&mut *pool, tail).expect("room for the tail");
    let runs = pool.span_count(&seq.blocks);
    for (name, read) in [("spans", OwnRead::Spans), ("gathered", OwnRead::Gather)] {
        let mut pass = || -> [f64; 3] {
            let t = Instant::now();
            let logits = {
                let mut kv = PagedChunks::new(vec![&mut seq], &mut *pool).reading(read);
                m.forward_packed(&[&tokens[prefix..]], &mut kv)
                    .expect("the tail's pass")
            };
            let built = t.elapsed().as_secs_f64() * 1e3;
            mlx_rs::transforms::async_eval([&logits]).expect("submit");
            let submitted = t.elapsed().as_secs_f64() * 1e3;
            logits.eval().expect("the tail's pass");
            seq.len = prefix;
            [built, submitted - built, t.elapsed().as_secs_f64() * 1e3]
        };
        pass();
        let runs_ms: Vec<[f64; 3]> = (0..steps).map(|_| pass()).collect();
        let median = |i: usize| {
            let mut x: Vec<f64> = runs_ms.iter().map(|r| r[i]).collect();
            x.sort_by(f64::total_cmp);
            x[x.len() / 2]
        };
        println!(
            "prefill of {tail} tokens after {prefix} stored in {runs} runs of blocks, keys as \
             {name}: median {:.2} ms; on the host: graph built in {:.2} ms, encoded and \
             submitted in {:.2} ms",
            median(2),
            median(0),
            median(1)
        );
    }
    seq.free(pool);
    held.into_iter().for_each(|id| pool.release(id));
}

/// `b` sequences of ~`context` tokens, then `steps` batched decode steps after one untimed.
fn decode_steps(m: &Model, pool: &mut BlockPool, seed: &[u32], case: &Case, steps: usize) {
    let &Case { b, lo, hi, .. } = case;
    let held: Vec<u32> = if case.scattered {
        scatter(pool, (b * (hi + b + 2 * steps + 2)).div_ceil(BLOCK_TOKENS))
    } else {
        Vec::new()
    };
    let mut seqs: Vec<BlockTable> = (0..b).map(|_| BlockTable::default()).collect();
    let t = Instant::now();
    for (i, seq) in seqs.iter_mut().enumerate() {
        // Lengths spread evenly over lo..=hi (and all distinct), as a served batch's are.
        let len = lo + (hi - lo) * i / b.saturating_sub(1).max(1) + i;
        let tokens = prompt(seed, i, len);
        for chunk in tokens.chunks(512) {
            alone(m, seq, pool, chunk)
                .and_then(|l| l.eval().map_err(Into::into))
                .expect("prefill");
        }
    }
    let prefill_s = t.elapsed().as_secs_f64();
    let context = match (lo == hi, case.scattered) {
        (true, false) => format!("~{lo}"),
        (false, false) => format!("{lo}-{hi}"),
        (true, true) => format!("~{lo} (blocks scattered)"),
        (false, true) => format!("{lo}-{hi} (blocks scattered)"),
    };
    let tokens: Vec<u32> = (0..b).map(|i| seed[i % seed.len()]).collect();
    // Ms to build the step's graph, to encode and submit it (`async_eval` returns), in all.
    let mut step = |clear: bool| -> [f64; 3] {
        if clear {
            mlx_rs::memory::clear_cache().expect("clear the cache");
        }
        let t = Instant::now();
        for s in seqs.iter_mut() {
            s.grow(&mut *pool, 1).expect("room");
        }
        let mut kv = PagedBatch::new(seqs.iter_mut().collect(), &mut *pool);
        let logits = m.forward_batch(&tokens, &mut kv).expect("batched step");
        let built = t.elapsed().as_secs_f64() * 1e3;
        mlx_rs::transforms::async_eval([&logits]).expect("submit");
        let submitted = t.elapsed().as_secs_f64() * 1e3;
        logits.eval().expect("batched step");
        [built, submitted - built, t.elapsed().as_secs_f64() * 1e3]
    };
    step(false);
    let runs: Vec<[f64; 3]> = (0..steps).map(|_| step(false)).collect();
    let part = |i: usize| {
        let mut x: Vec<f64> = runs.iter().map(|r| r[i]).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let (built, encoded) = (part(0), part(1));
    let mut times: Vec<f64> = runs.iter().map(|r| r[2]).collect();
    // The engine clears MLX's buffer cache after each prefill step of 256 tokens or more; at
    // many clients most decode steps follow one.
    let mut cleared: Vec<f64> = (0..steps).map(|_| step(true)[2]).collect();
    times.sort_by(f64::total_cmp);
    cleared.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "decode B={b} at {context} tokens: median {median:.2} ms/step, best {:.2} = {:.0} tok/s \
         ({steps} steps; the prompts' prefill {prefill_s:.1} s); after clearing MLX's buffer \
         cache: median {:.2} ms/step",
        times[0],
        b as f64 / median * 1e3,
        cleared[cleared.len() / 2]
    );
    println!(
        "  on the host: graph built in {built:.2} ms, encoded and submitted in {encoded:.2} ms \
         (medians; the rest of a step waits on the device)"
    );
    // The CPU's span kernel reads the pool in place: only a GPU step has this path apart.
    if m.placement.gpu {
        let kv_ms = kv_path(m, pool, &mut seqs, steps);
        println!("  its K/V path alone (write and read, every layer): median {kv_ms:.2} ms/step");
    }
    for s in seqs.iter_mut() {
        s.free(pool);
    }
    held.into_iter().for_each(|id| pool.release(id));
}

/// Median ms of writing one new row per sequence and reading the keys back, every layer, as
/// the model's decode step does on a GPU (padded own keys, or by table: then the writes
/// alone), without the model.
fn kv_path(m: &Model, pool: &mut BlockPool, seqs: &mut [BlockTable], steps: usize) -> f64 {
    let (b, kvh, hd) = (
        seqs.len() as i32,
        m.config.kv_heads as i32,
        m.config.head_dim as i32,
    );
    let row = mlx_rs::ops::zeros_dtype(&[b, kvh, 1, hd], m.placement.dtype).expect("row");
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        let t = Instant::now();
        for s in seqs.iter_mut() {
            s.grow(&mut *pool, 1).expect("room");
        }
        let lens: Vec<i32> = seqs.iter().map(|s| s.len as i32).collect();
        let layout = m.backend().step_attention(m.heads(), &lens).layout();
        let mut kv = PagedBatch::new(seqs.iter_mut().collect(), pool);
        let mut outs: Vec<Array> = Vec::new();
        for layer in 0..m.config.layers {
            let keys = kv
                .append_all(layer, row.clone(), row.clone(), layout)
                .expect("append");
            match keys.own {
                // Read in place by the attention kernel: the writes alone.
                OwnKeys::Tables(t) => outs.extend(t.slabs),
                own => outs.extend(
                    own.rows_first()
                        .expect("keys")
                        .into_iter()
                        .flat_map(|(k, v)| [k, v]),
                ),
            }
            outs.extend(keys.shared.into_iter().flat_map(|(k, v)| [k, v]));
        }
        mlx_rs::transforms::eval(outs.iter()).expect("eval");
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
