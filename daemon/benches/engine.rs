//! `make bench-engine`: the engine on this machine, measured and printed with how.
//!
//! - BLAS: f32/f16/bf16 1024² matmul GFLOP/s as linked (OpenBLAS on Linux), and f32 again in a
//!   child process with the mlx-cpu wheel's reference BLAS preloaded, for the comparison.
//! - The default model: load time, resident memory, prefill tok/s on a 512-token prompt, decode
//!   tok/s at batch 1 (dense K/V store and paged pool), and decode against the memory-bandwidth
//!   limit (weight bytes read per token vs a measured read bandwidth), and batched decode steps
//!   through the pool at B = 1, 4, 8 and 16.

use std::path::PathBuf;
use std::time::Instant;

use mlx_rs::{Dtype, ops, random};
use mlxcel_daemon::generate::{GenerateRequest, generate};
use mlxcel_daemon::kv::DenseKv;
use mlxcel_daemon::kv::GrowingKv;
use mlxcel_daemon::paged::PagedBatch;
use mlxcel_daemon::pool::{BlockPool, PoolShape};
use mlxcel_daemon::sampler::SamplingParams;
use mlxcel_daemon::scheduler::BlockTable;
use mlxcel_tests::knob;

const CHILD_FLAG: &str = "BENCH_MATMUL_ONLY";

fn matmul_gflops(dtype: Dtype) -> f64 {
    let n = 1024;
    let a = random::normal::<f32>(&[n, n], None, None, None)
        .and_then(|a| a.as_dtype(dtype))
        .expect("a");
    let b = random::normal::<f32>(&[n, n], None, None, None)
        .and_then(|b| b.as_dtype(dtype))
        .expect("b");
    ops::matmul(&a, &b).expect("warm-up").eval().expect("eval");
    let iters = if dtype == Dtype::Float32 { 20 } else { 3 };
    let t = Instant::now();
    for _ in 0..iters {
        ops::matmul(&a, &b).expect("matmul").eval().expect("eval");
    }
    2.0 * f64::from(n).powi(3) * f64::from(iters) / t.elapsed().as_secs_f64() / 1e9
}

fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// The reference BLAS the wheel ships, as mapped into this process.
fn wheel_blas() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("mlx_cpu.libs/libblas"))
        .map(str::to_string)
}

/// Read bandwidth, what a decode step's weights stream at: sums of a 512 MiB f32 buffer, split
/// over 1..=cores threads, the best of 5 runs at the best thread count, in bytes read per
/// second. (A copy counted as bytes read plus written reports about twice this here, reads
/// and writes streaming side by side: it is no bound on reading alone.)
fn read_gbs() -> (f64, usize) {
    let buf = vec![1f32; 128 << 20];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut best = (0.0, 1);
    for threads in 1..=cores {
        let per = buf.len() / threads;
        let mut fastest = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            let total: f32 = std::thread::scope(|scope| {
                let parts: Vec<_> = buf
                    .chunks(per)
                    .map(|part| scope.spawn(move || lane_sum(part)))
                    .collect();
                parts.into_iter().map(|p| p.join().unwrap_or(0.0)).sum()
            });
            std::hint::black_box(total);
            fastest = fastest.min(t.elapsed().as_secs_f64());
        }
        let gbs = (buf.len() * 4) as f64 / fastest / 1e9;
        if gbs > best.0 {
            best = (gbs, threads);
        }
    }
    best
}

/// A 256 MiB copy, counted as bytes read plus written, best of 5.
fn copy_gbs() -> f64 {
    let src = vec![1u8; 256 << 20];
    let mut dst = vec![0u8; 256 << 20];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * src.len() as f64 / best / 1e9
}

/// A sum in 16 independent lanes (so the compiler vectorizes it and the loads, not the adds'
/// latency, set the pace).
fn lane_sum(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for chunk in x.chunks_exact(16) {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    lanes.iter().sum()
}

fn main() {
    if knob(CHILD_FLAG).is_some() {
        println!("{:.1}", matmul_gflops(Dtype::Float32));
        return;
    }
    let threads = std::env::var("OPENBLAS_NUM_THREADS").unwrap_or_else(|_| "default".into());
    println!(
        "mlxcel engine benchmark ({} cores, OPENBLAS_NUM_THREADS={threads}, release build; run on a quiet machine)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let f32_gflops = matmul_gflops(Dtype::Float32);
    let f16_gflops = matmul_gflops(Dtype::Float16);
    let bf16_gflops = matmul_gflops(Dtype::Bfloat16);
    println!(
        "matmul 1024x1024x1024 as linked: f32 {f32_gflops:.1} GFLOP/s, f16 {f16_gflops:.1}, bf16 {bf16_gflops:.1}"
    );
    if let Some(blas) = wheel_blas() {
        let exe = std::env::current_exe().expect("exe");
        let out = std::process::Command::new(exe)
            .env(format!("MLXCEL_{CHILD_FLAG}"), "1")
            .env("LD_PRELOAD", &blas)
            .output();
        if let Ok(out) = out {
            let reference = String::from_utf8_lossy(&out.stdout).trim().to_string();
            println!(
                "matmul f32 with the wheel's reference BLAS preloaded ({blas}): {reference} GFLOP/s"
            );
        }
    }

    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let rss_before = rss_mib();
    let t = Instant::now();
    let loaded = mlxcel_daemon::load(&path).expect("run `make setup` for the default model");
    let load_s = t.elapsed().as_secs_f64();
    let m = &loaded.model;
    println!(
        "model {}: {} on {}, loaded in {load_s:.2} s, resident {:.0} MiB (before load {:.0} MiB)",
        loaded.model_id,
        path.display(),
        m.placement.describe(),
        rss_mib().unwrap_or(0.0),
        rss_before.unwrap_or(0.0)
    );

    if knob("BENCH_STEPS_ONLY").is_some() {
        // Only the batched decode steps (for a profiler): `MLXCEL_BENCH_STEPS_ONLY=1`.
        let seed_ids = loaded
            .text
            .encode("The quick brown fox jumps over the lazy dog. ");
        let b = knob("BENCH_B").and_then(|v| v.parse().ok());
        let seed_ids = seed_ids.expect("encode");
        if knob("BENCH_LONG").is_some() {
            long_context_decode(m, &seed_ids);
        }
        batched_steps(m, &seed_ids, 200, &[b.unwrap_or(8)], 60);
        return;
    }
    // Prefill: a 512-token prompt (the first chat prompt's tokens, repeated), one chunk.
    let seed_ids = loaded
        .text
        .encode("The quick brown fox jumps over the lazy dog. ")
        .expect("encode");
    let prompt: Vec<u32> = seed_ids.iter().copied().cycle().take(512).collect();
    let mut best_prefill = f64::MAX;
    for _ in 0..3 {
        let mut kv = DenseKv::new(m.config.layers);
        let t = Instant::now();
        m.forward(&prompt, &mut kv)
            .and_then(|l| l.eval().map_err(Into::into))
            .expect("prefill");
        best_prefill = best_prefill.min(t.elapsed().as_secs_f64());
    }
    println!(
        "prefill 512 tokens: {:.2} s = {:.0} tok/s (best of 3)",
        best_prefill,
        512.0 / best_prefill
    );

    let req = GenerateRequest {
        prompt: prompt[..32].to_vec(),
        max_tokens: 128,
        stop_ids: vec![],
        sampling: SamplingParams::default(),
        prefill_chunk: 512,
    };
    let (decode_tps, mut pool, mut seq) = dense_then_paged(m, &req, "");
    seq.free(&mut pool);

    long_context_decode(m, &seed_ids);
    batched_steps(m, &seed_ids, 200, &[1, 4, 8, 16], 8);
    batched_steps(m, &seed_ids, 512, &[1, 4, 8, 16], 8);

    let bytes = m.weight_bytes_per_token() as f64;
    let (bw, threads) = read_gbs();
    let limit = bw * 1e9 / bytes;
    let copy = copy_gbs();
    println!(
        "bandwidth bound: {:.0} MiB of weights read per token, read bandwidth {bw:.1} GB/s ({threads} threads) -> limit {limit:.1} tok/s; measured/limit = {:.2} (against a copy's {copy:.1} GB/s counted as bytes read plus written, as this line read before: {:.2})",
        bytes / (1 << 20) as f64,
        decode_tps / limit,
        decode_tps / (copy * 1e9 / bytes)
    );
}

/// Decode over a long context (the footprint benchmark's ~3.7k-token shared prefix): the dense
/// store against the paged pool, and what gathering every layer's K/V out of the pool costs alone.
fn long_context_decode(m: &mlxcel_daemon::model::Model, seed_ids: &[u32]) {
    let context = knob("BENCH_LONG").and_then(|v| v.parse().ok());
    let context: usize = context.unwrap_or(3_700);
    const TOKENS: usize = 32;
    let prompt: Vec<u32> = seed_ids.iter().copied().cycle().take(context).collect();
    let req = GenerateRequest {
        prompt,
        max_tokens: TOKENS,
        stop_ids: vec![],
        sampling: SamplingParams::default(),
        prefill_chunk: 512,
    };
    let (_, mut pool, mut seq) =
        dense_then_paged(m, &req, &format!(" after a {context}-token prompt"));
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        let plan = seq.gather(&pool, seq.len).expect("plan");
        for layer in 0..m.config.layers {
            let (k, v) = pool.gather(layer, &plan).expect("gather");
            k.eval().and_then(|_| v.eval()).expect("eval");
        }
    }
    let per_token = t.elapsed().as_secs_f64() / f64::from(reps);
    println!(
        "gathering {} tokens of K/V from the pool for all {} layers: {:.1} ms per decode step",
        seq.len,
        m.config.layers,
        per_token * 1e3
    );
    seq.free(&mut pool);
}

/// Decodes `req` with the dense store, then through a paged pool of 32-token blocks just large
/// enough; prints both (`case` completes "decode batch 1") and returns the dense tok/s, the pool
/// and the sequence, still holding its blocks.
fn dense_then_paged(
    m: &mlxcel_daemon::model::Model,
    req: &GenerateRequest,
    case: &str,
) -> (f64, BlockPool, BlockTable) {
    // Best of 3: this machine's speed drifts from minute to minute (other tenants).
    let g = (0..3)
        .map(|_| {
            let mut kv = DenseKv::new(m.config.layers);
            generate(m, &mut kv, req, |_| true).expect("decode")
        })
        .min_by(|a, b| a.decode_time.cmp(&b.decode_time))
        .expect("three runs");
    let dense_tps = g.tokens.len() as f64 / g.decode_time.as_secs_f64();
    println!(
        "decode batch 1{case}: {} tokens in {:.2} s = {dense_tps:.1} tok/s (best of 3; prefill of {} tokens {:.2} s)",
        g.tokens.len(),
        g.decode_time.as_secs_f64(),
        req.prompt.len(),
        g.prefill_time.as_secs_f64()
    );
    // The same decode through the paged pool: gathers K/V by block table.
    let shape = PoolShape {
        layers: m.config.layers,
        num_blocks: (req.prompt.len() + req.max_tokens).div_ceil(32) as u32 + 1,
        block_tokens: 32,
        kv_heads: m.config.kv_heads,
        head_dim: m.config.head_dim,
        dtype: m.placement.dtype,
    };
    let mut pool = BlockPool::new(shape).expect("pool");
    let mut seq = BlockTable::default();
    let g = generate(m, &mut seq.store(&mut pool), req, |_| true).expect("paged decode");
    let paged_tps = g.tokens.len() as f64 / g.decode_time.as_secs_f64();
    println!(
        "decode batch 1{case}, paged pool: {paged_tps:.1} tok/s ({:.2}x the dense store; prefill {:.2} s)",
        paged_tps / dense_tps,
        g.prefill_time.as_secs_f64()
    );
    (dense_tps, pool, seq)
}

/// Batched decode steps through the pool as the engine runs them: `b` sequences, each with a
/// ~`context`-token prompt prefilled, then `forward_batch` steps; ms per step and tok/s.
fn batched_steps(
    m: &mlxcel_daemon::model::Model,
    seed_ids: &[u32],
    context: usize,
    sizes: &[usize],
    steps: usize,
) {
    for &b in sizes {
        let shape = PoolShape {
            layers: m.config.layers,
            num_blocks: (b * (context + steps + 1)).div_ceil(32) as u32 + b as u32,
            block_tokens: 32,
            kv_heads: m.config.kv_heads,
            head_dim: m.config.head_dim,
            dtype: m.placement.dtype,
        };
        let mut pool = BlockPool::new(shape).expect("pool");
        let mut seqs: Vec<BlockTable> = (0..b).map(|_| BlockTable::default()).collect();
        for (i, seq) in seqs.iter_mut().enumerate() {
            // Distinct prompts of slightly different lengths, as distinct clients send.
            let prompt: Vec<u32> = seed_ids
                .iter()
                .copied()
                .cycle()
                .skip(i)
                .take(context + i)
                .collect();
            let mut kv = seq.store(&mut pool);
            kv.grow(prompt.len()).expect("room");
            m.forward(&prompt, &mut kv)
                .and_then(|l| l.eval().map_err(Into::into))
                .expect("prefill");
        }
        let tokens: Vec<u32> = (0..b).map(|i| seed_ids[i % seed_ids.len()]).collect();
        let mut best = f64::MAX;
        for step in 0..=steps {
            let t = Instant::now();
            for s in seqs.iter_mut() {
                s.grow(&mut pool, 1).expect("room");
            }
            let mut kv = PagedBatch::new(seqs.iter_mut().collect(), &mut pool);
            m.forward_batch(&tokens, &mut kv)
                .and_then(|l| l.eval().map_err(Into::into))
                .expect("batched step");
            if step > 0 {
                best = best.min(t.elapsed().as_secs_f64());
            }
        }
        println!(
            "batched decode step, B={b} at ~{context} tokens each: {:.1} ms/step = {:.1} tok/s (best of {steps})",
            best * 1e3,
            b as f64 / best
        );
        for s in seqs.iter_mut() {
            s.free(&mut pool);
        }
    }
}
