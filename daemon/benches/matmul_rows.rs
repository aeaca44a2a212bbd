//! `cargo bench -p mlxcel-daemon --bench matmul_rows`: what a decode step's linear layers cost
//! the host and the device at 1–32 rows, through the engine's `Linear` (its few-row kernel where
//! the device's backend has one: on the CPU and on CUDA) against MLX's plain matmul.
//!
//! A chain of `MLXCEL_BENCH_LAYERS` (default 224, a 32-layer step's 7 projections) `[M, D] x
//! [D, D]` layers over 4 distinct weights (more than a GPU's L2), built and queued
//! (`async_eval`: the host's part, "encoded"), then waited on ("all"); medians of
//! `MLXCEL_BENCH_REPEATS` (default 20). `MLXCEL_BENCH_WIDTH` sets D (default 4096).
//!
//! `MLXCEL_BENCH_SHAPES=8b` runs a decode step's real projections instead: per layer the 8B-like
//! model's joined q/k/v (4096 to 6144), o (4096 to 4096), joined gate/up (4096 to 28672) and
//! down (14336 to 4096), 32 layers over 2 distinct sets of weights, with the weight bytes read
//! per GB/s of "all". With `MLX_MAX_OPS_PER_BUFFER` above the chain's node count MLX submits it
//! as one graph at the end, so "all" minus "encoded" is the device's time alone.

use std::time::Instant;

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, ops, random, transforms};
use mlxcel_daemon::backend::{self, Linear};
use mlxcel_daemon::device::{DeviceChoice, Placement};
use mlxcel_tests::{knob, knob_or};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let placement = Placement::choose(DeviceChoice::Auto).expect("a device");
    let (layers, repeats, d) = (
        knob_or("BENCH_LAYERS", 224usize),
        knob_or("BENCH_REPEATS", 20usize).max(1),
        knob_or("BENCH_WIDTH", 4096i32),
    );
    if knob("BENCH_SHAPES").as_deref() == Some("8b") {
        layer_shapes(placement, repeats);
        return;
    }
    let backend = backend::for_placement(placement);
    let weights: Vec<Array> = (0..4).map(|_| weight(placement, d, d)).collect();
    let linears: Vec<Linear> = weights
        .iter()
        .map(|w| Linear::dense(w.clone(), None, &*backend))
        .collect();
    let transposed: Vec<Array> = weights.iter().map(|w| w.t()).collect();
    println!(
        "matmul_rows on {}: {layers} chained [M, {d}] x [{d}, {d}] layers, medians of {repeats}",
        placement.describe()
    );
    for m in [1, 2, 4, 8, 16, 32] {
        let x = input(placement, m, d);
        for (label, engine) in [("engine Linear", true), ("MLX matmul", false)] {
            let (encoded, all) = timed(repeats, || {
                let mut y = x.clone();
                for i in 0..layers {
                    y = if engine {
                        linears[i % 4].forward(&y).expect("forward")
                    } else {
                        ops::matmul(&y, &transposed[i % 4]).expect("matmul")
                    };
                }
                y
            });
            println!("M={m:>2} {label:<13}: encoded {encoded:6.2} ms, all {all:6.2} ms");
        }
    }
}

/// A weight `[out, in]` of `placement`'s dtype, scaled to keep a chain's values finite.
fn weight(placement: Placement, out: i32, inner: i32) -> Array {
    let scale = Array::from_f32(1.0 / (inner as f32).sqrt());
    let w = random::normal::<f32>(&[out, inner], None, None, None).expect("weights");
    let w = ops::multiply(&w, &scale)
        .expect("scale")
        .as_dtype(placement.dtype)
        .expect("cast");
    w.eval().expect("eval");
    w
}

/// The 8B-like decode step's four projections per layer, 32 layers, at 1-32 rows.
fn layer_shapes(placement: Placement, repeats: usize) {
    let backend = backend::for_placement(placement);
    // (out, in) of q/k/v joined, o, gate/up joined, down.
    const SHAPES: [(i32, i32); 4] = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)];
    let sets: Vec<Vec<Linear>> = (0..2)
        .map(|_| {
            SHAPES
                .iter()
                .map(|&(o, i)| Linear::dense(weight(placement, o, i), None, &*backend))
                .collect()
        })
        .collect();
    let plain: Vec<Vec<Array>> = sets
        .iter()
        .map(|s| {
            s.iter()
                .filter_map(Linear::dense_weight)
                .map(|w| w.t())
                .collect()
        })
        .collect();
    let bytes: usize = SHAPES.iter().map(|&(o, i)| (o * i) as usize).sum::<usize>()
        * 32
        * mlxcel_daemon::pool::dtype_bytes(placement.dtype);
    println!(
        "matmul_rows on {}: 32 layers of the 8B-like projections ({:.2} GB of weights per step), medians of {repeats}",
        placement.describe(),
        bytes as f64 / 1e9
    );
    for m in [1, 2, 4, 8, 16, 32] {
        let x = input(placement, m, 4096);
        for (label, engine) in [("engine Linear", true), ("MLX matmul", false)] {
            let (encoded, all) = timed(repeats, || {
                let mut h = x.clone();
                for l in 0..32 {
                    let (lin, w) = (&sets[l % 2], &plain[l % 2]);
                    let mm = |i: usize, a: &Array| -> Array {
                        if engine {
                            lin[i].forward(a).expect("forward")
                        } else {
                            ops::matmul(a, &w[i]).expect("matmul")
                        }
                    };
                    let qkv = mm(0, &h);
                    let o = mm(1, &qkv.index((.., .., ..4096)));
                    let gu = mm(2, &o);
                    h = mm(3, &gu.index((.., .., ..14336)));
                }
                h
            });
            println!(
                "M={m:>2} {label:<13}: encoded {encoded:6.2} ms, all {all:6.2} ms, {:5.0} GB/s over all, device alone (all - encoded) {:6.2} ms",
                bytes as f64 / all / 1e6,
                all - encoded
            );
        }
    }
}

/// Activations `[m, 1, d]` of `placement`'s dtype, evaluated.
fn input(placement: Placement, m: i32, d: i32) -> Array {
    let x = random::normal::<f32>(&[m, 1, d], None, None, None)
        .and_then(|x| x.as_dtype(placement.dtype))
        .expect("input");
    x.eval().expect("eval");
    x
}

/// Medians (ms) of building and queuing `chain`'s graph ("encoded") and of that plus waiting
/// for it ("all"), over `repeats` runs after two that pay for compiling kernels.
fn timed(repeats: usize, chain: impl Fn() -> Array) -> (f64, f64) {
    let (mut encoded, mut all) = (Vec::new(), Vec::new());
    for _ in 0..repeats + 2 {
        let t = Instant::now();
        let y = chain();
        transforms::async_eval([&y]).expect("async_eval");
        encoded.push(t.elapsed().as_secs_f64() * 1e3);
        y.eval().expect("eval");
        all.push(t.elapsed().as_secs_f64() * 1e3);
    }
    (median(encoded[2..].to_vec()), median(all[2..].to_vec()))
}
