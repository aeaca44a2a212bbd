//! `cargo bench -p mlxcel-daemon --bench matmul_rows`: what a decode step's linear layers cost
//! the host and the device at 1–32 rows, through the engine's `Linear` (its few-row kernel where
//! the device has one: `skinny` on the CPU, `skinny_cuda` on CUDA with `MLXCEL_CUDA_FEW_ROWS=1`)
//! against MLX's plain matmul.
//!
//! A chain of `MLXCEL_BENCH_LAYERS` (default 224, a 32-layer step's 7 projections) `[M, D] x
//! [D, D]` layers over 4 distinct weights (more than a GPU's L2), built and queued
//! (`async_eval`: the host's part, "encoded"), then waited on ("all"); medians of
//! `MLXCEL_BENCH_REPEATS` (default 20). `MLXCEL_BENCH_WIDTH` sets D (default 4096).

use std::time::Instant;

use mlx_rs::{Array, ops, random, transforms};
use mlxcel_daemon::device::{DeviceChoice, Placement};
use mlxcel_daemon::model::weights::Linear;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let placement = Placement::choose(DeviceChoice::Auto).expect("a device");
    let (layers, repeats, d) = (
        setting("MLXCEL_BENCH_LAYERS", 224),
        setting("MLXCEL_BENCH_REPEATS", 20).max(1),
        setting("MLXCEL_BENCH_WIDTH", 4096) as i32,
    );
    let scale = Array::from_f32(1.0 / (d as f32).sqrt());
    let weights: Vec<Array> = (0..4)
        .map(|_| {
            let w = random::normal::<f32>(&[d, d], None, None, None).expect("weights");
            let w = ops::multiply(&w, &scale)
                .expect("scale")
                .as_dtype(placement.dtype)
                .expect("cast");
            w.eval().expect("eval");
            w
        })
        .collect();
    let linears: Vec<Linear> = weights
        .iter()
        .map(|w| Linear::dense(w.clone(), None, placement))
        .collect();
    let transposed: Vec<Array> = weights.iter().map(|w| w.t()).collect();
    println!(
        "matmul_rows on {}: {layers} chained [M, {d}] x [{d}, {d}] layers, medians of {repeats}",
        placement.describe()
    );
    for m in [1, 2, 4, 8, 16, 32] {
        let x = random::normal::<f32>(&[m, 1, d], None, None, None)
            .and_then(|x| x.as_dtype(placement.dtype))
            .expect("input");
        x.eval().expect("eval");
        for (label, engine) in [("engine Linear", true), ("MLX matmul", false)] {
            let (mut encoded, mut all) = (Vec::new(), Vec::new());
            for _ in 0..repeats + 2 {
                let t = Instant::now();
                let mut y = x.clone();
                for i in 0..layers {
                    y = if engine {
                        linears[i % 4].forward(&y).expect("forward")
                    } else {
                        ops::matmul(&y, &transposed[i % 4]).expect("matmul")
                    };
                }
                transforms::async_eval([&y]).expect("async_eval");
                let queued = t.elapsed().as_secs_f64() * 1e3;
                y.eval().expect("eval");
                encoded.push(queued);
                all.push(t.elapsed().as_secs_f64() * 1e3);
            }
            // The first two runs pay for compiling kernels.
            let (encoded, all) = (median(encoded[2..].to_vec()), median(all[2..].to_vec()));
            println!("M={m:>2} {label:<13}: encoded {encoded:6.2} ms, all {all:6.2} ms");
        }
    }
}
