//! CUDA's prefill shapes: MLX builds a CUDA kernel per exact shape (a cuDNN graph per attention
//! shape, 50-700 ms the first time on an H200; the quantized matmuls per row count), in every
//! process anew, so every prompt length would be a new shape and a burst of distinct prompts
//! would spend its prefill building them. (Metal's kernels are specialized by alignment only, so
//! Metal runs exact shapes.)
//!
//! So a chunk runs a padded number of rows ([`query_rows`]: a power of two, at least
//! [`MIN_QUERY_ROWS`]; past [`MAX_POWER_ROWS`] a multiple of it), and its attention reads keys
//! padded with zero rows to a few buckets ([`shape`]: up to [`SHORT_KEYS`] one bucket, then a
//! power of two) with its queries padded to at least [`MAX_POWER_ROWS`], except a chunk of at
//! most [`FEW_ROWS`] rows (the new tokens of a prompt whose prefix is cached), which keeps them.
//! That is a handful of shapes, which the warm-up builds before the daemon listens. Attention is
//! a small part of a chunk's work (a 512-token chunk of an 8B model over 4k keys: ~34 GFLOP of
//! attention against ~8 TFLOP of projections), so the padding costs little. The causal mask of
//! the padded shape hides the padding from every real query (a key past a query's position is
//! masked, and every padded key lies past the chunk's last real position); padded queries see at
//! least the real keys, so no row is all masked; their outputs are dropped.

use mlx_rs::ops;

use super::super::Heads;
use super::super::gpu::fused_attend;
use super::super::masks::causal_mask;
use crate::Result;

/// The fewest query rows a padded chunk has.
const MIN_QUERY_ROWS: i32 = 16;

/// Beyond this many query rows a chunk is padded to a multiple of it, not a power of two.
const MAX_POWER_ROWS: i32 = 512;

/// Up to this many keys are one bucket; beyond it, keys are padded to a power of two.
const SHORT_KEYS: i32 = 1024;

/// The most keys a warm-up builds shapes for; longer contexts build theirs on first use.
pub const WARM_KEYS: usize = 16384;

/// A chunk of at most this many query rows keeps them over any keys instead of running
/// [`MAX_POWER_ROWS`]: one more shape per key bucket.
pub const FEW_ROWS: i32 = 16;

/// Rows a chunk of `t` tokens runs as (`t` itself for one token: a decode-shaped query takes
/// the kernel's vector path, built once).
pub fn query_rows(t: i32) -> i32 {
    if t <= 1 {
        t
    } else if t <= MAX_POWER_ROWS {
        (t as u32).next_power_of_two().max(MIN_QUERY_ROWS as u32) as i32
    } else {
        round_up(t, MAX_POWER_ROWS)
    }
}

/// The (query rows, key rows) the attention of `t` queries over `s` keys runs.
pub fn shape(t: i32, s: i32) -> (i32, i32) {
    if t <= 1 {
        return (t, s);
    }
    let rows = query_rows(t);
    let keys = (s.max(SHORT_KEYS) as u32).next_power_of_two() as i32;
    let rows = if rows <= FEW_ROWS {
        rows
    } else {
        rows.max(MAX_POWER_ROWS)
    };
    (rows, keys)
}

/// The chunk sizes a warm-up runs through the whole model so that every row count a chunk of at
/// most `chunk` tokens runs as is built: one per [`query_rows`] bucket.
pub fn row_shapes(chunk: usize) -> Vec<usize> {
    let chunk = chunk.max(1) as i32;
    let mut by_rows = std::collections::BTreeMap::new();
    for t in (1..=chunk).rev() {
        by_rows.entry(query_rows(t)).or_insert(t as usize);
    }
    by_rows.into_values().collect()
}

/// Every (attention rows, key rows) shape chunks of at most `chunk` tokens over at most
/// `max_keys` keys run, for a warm-up to build.
pub fn attention_shapes(chunk: usize, max_keys: usize) -> Vec<(i32, i32)> {
    let rows: std::collections::BTreeSet<i32> = row_shapes(chunk)
        .into_iter()
        .map(|t| query_rows(t as i32))
        .filter(|&r| r > 1)
        .collect();
    let mut shapes = std::collections::BTreeSet::new();
    let mut s = 2;
    loop {
        let keys = shape(2, s).1;
        for &r in &rows {
            // A chunk that runs as r rows has at least fewest_tokens(r) keys.
            if fewest_tokens(r) <= keys {
                shapes.insert(shape(r, keys));
            }
        }
        if keys >= max_keys as i32 {
            break;
        }
        s = keys + 1;
    }
    shapes.into_iter().collect()
}

/// The fewest tokens (two or more) that run as `rows` rows.
fn fewest_tokens(rows: i32) -> i32 {
    if rows <= MIN_QUERY_ROWS {
        2
    } else if rows <= MAX_POWER_ROWS {
        rows / 2 + 1
    } else {
        rows - MAX_POWER_ROWS + 1
    }
}

fn round_up(x: i32, step: i32) -> i32 {
    (x + step - 1) / step * step
}

/// Runs the fused attention once at each of `shapes` (zeros of `heads`, in `dtype`) so that its
/// kernels are built before a user needs them.
pub fn warm(shapes: &[(i32, i32)], heads: Heads, dtype: mlx_rs::Dtype) -> Result<()> {
    for &(rows, keys) in shapes {
        let started = std::time::Instant::now();
        let q = ops::zeros_dtype(&[1, heads.heads, rows, heads.head_dim], dtype)?;
        let k = ops::zeros_dtype(&[1, heads.kv_heads, keys, heads.head_dim], dtype)?;
        let mask = causal_mask(rows, (keys - rows).max(0), keys, None, dtype)?;
        fused_attend(
            &q,
            &[(k.clone(), k)],
            1.0,
            Some(&mask),
            (rows, keys),
            true,
            None,
        )?
        .eval()?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(rows, keys, ms, "attention shape built");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
