//! A prefill chunk's attention through MLX's fused kernel (a GPU), on CUDA padded to a few
//! shapes.
//!
//! On CUDA the fused kernel is built per shape: each new (queries, keys) pair builds a cuDNN
//! graph (measured on an H200: 50-700 ms the first time, ~20 ms after), in every process anew.
//! (Metal's kernels are specialized by alignment only, so Metal runs exact shapes:
//! `Placement::pads_prefill`.) Every prompt length would be a new shape, and a burst of distinct
//! prompts spent most of its prefill building them (the quantized matmuls, too, are built per
//! row count: a CUDA warm-up of 45 distinct chunk sizes took 221 s on SmolLM2 Q4_1). So a chunk
//! runs a padded number of rows, a power of two ([`query_rows`], the model pads the tokens), and
//! its attention reads keys padded with zero rows to a few buckets ([`key_rows`]: up to
//! [`SHORT_KEYS`] one bucket, then a power of two), its queries to [`FEW_ROWS`] or at least
//! [`MAX_POWER_ROWS`] ([`attention_rows`]): a handful of shapes, which the warm-up builds
//! before the daemon listens. Attention is a small part of a chunk's work (a 512-token chunk of
//! an 8B model over 4k keys: ~34 GFLOP of attention against ~8 TFLOP of projections), so the
//! padding costs little; [`Pad::Shapes`]`{ fine: true }` (`MLXCEL_CUDA_FINE_ATTENTION_SHAPES=1`)
//! pads less and builds more shapes ([`KEY_STEP`] multiples, two buckets a doubling). The causal
//! mask of the padded shape hides the padding from every real query (a key past a query's
//! position is masked, and every padded key lies past the chunk's last real position). Padded
//! queries see at least the real keys, so no row is all masked; their outputs are dropped.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, fast, ops};

use super::llama::Model;
use crate::Result;
use crate::device::Placement;

/// The fewest query rows a padded chunk has.
const MIN_QUERY_ROWS: i32 = 16;

/// Beyond this many query rows a chunk is padded to a multiple of it, not a power of two.
const MAX_POWER_ROWS: i32 = 512;

/// Up to this many keys are one bucket; beyond it, keys are padded to a power of two. With
/// [`Pad::Shapes`]`{ fine: true }`, up to it every padded (queries, keys) shape has its own
/// kernel, and beyond it the queries are padded to at least [`MAX_POWER_ROWS`] rows.
const SHORT_KEYS: i32 = 1024;

/// With [`Pad::Shapes`]`{ fine: true }`, up to [`SHORT_KEYS`] keys are padded to a multiple of
/// this many rows; beyond, to two buckets per doubling (1536, 2048, 3072, 4096, 6144, ...).
const KEY_STEP: i32 = 256;

/// The most keys a warm-up builds shapes for; longer contexts build theirs on first use.
pub const WARM_KEYS: usize = 16384;

/// With [`Pad::Shapes`]`{ few_rows: true }`, a chunk of at most this many query rows keeps them
/// past [`SHORT_KEYS`] keys instead of running [`MAX_POWER_ROWS`]: the few new tokens of a
/// prompt whose prefix is cached. One more shape per key bucket.
pub const FEW_ROWS: i32 = 16;

/// How a prefill chunk's attention is shaped: exact (Metal, the CPU), or padded to a few shapes
/// (CUDA), optionally keeping [`FEW_ROWS`] query rows over long keys, in the fine buckets or
/// the default coarse ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pad {
    Exact,
    Shapes { few_rows: bool, fine: bool },
}

impl Pad {
    /// What `placement` runs.
    pub fn of(placement: &Placement) -> Self {
        if placement.pads_prefill {
            Pad::Shapes {
                few_rows: placement.few_query_rows,
                fine: placement.fine_attention_shapes,
            }
        } else {
            Pad::Exact
        }
    }

    /// The (query rows, key rows) the attention of `t` queries over `s` keys runs.
    pub fn shape(self, t: i32, s: i32) -> (i32, i32) {
        match self {
            Pad::Exact => (t, s),
            Pad::Shapes { few_rows, fine } => {
                (attention_rows(t, s, few_rows, fine), key_rows(t, s, fine))
            }
        }
    }
}

/// Rows a chunk of `t` tokens runs as (`t` itself for one token: a decode-shaped query takes
/// the kernel's vector path, built once).
pub(super) fn query_rows(t: i32) -> i32 {
    if t <= 1 {
        t
    } else if t <= MAX_POWER_ROWS {
        (t as u32).next_power_of_two().max(MIN_QUERY_ROWS as u32) as i32
    } else {
        round_up(t, MAX_POWER_ROWS)
    }
}

/// Key rows the attention of `t` queries over `s` keys reads (`s` itself for one query), in the
/// `fine` buckets or the coarse ones.
fn key_rows(t: i32, s: i32, fine: bool) -> i32 {
    if t <= 1 {
        s
    } else if !fine {
        (s.max(SHORT_KEYS) as u32).next_power_of_two() as i32
    } else if s <= SHORT_KEYS {
        round_up(s, KEY_STEP)
    } else {
        let octave = 1 << (31 - (s - 1).leading_zeros());
        round_up(s, octave / 2)
    }
}

/// Query rows the attention of `t` queries over `s` keys runs: [`query_rows`] padded to at
/// least [`MAX_POWER_ROWS`], except [`FEW_ROWS`] rows over short keys and, with `few_rows`,
/// over any keys; with `fine`, every row count stays over short keys.
fn attention_rows(t: i32, s: i32, few_rows: bool, fine: bool) -> i32 {
    let rows = query_rows(t);
    let few = rows <= FEW_ROWS;
    let padded = if key_rows(t, s, fine) > SHORT_KEYS {
        !(few_rows && few)
    } else {
        !fine && !few
    };
    if rows > 1 && padded {
        rows.max(MAX_POWER_ROWS)
    } else {
        rows
    }
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
/// `max_keys` keys run under `pad`, for a warm-up to build.
pub(super) fn attention_shapes(chunk: usize, max_keys: usize, pad: Pad) -> Vec<(i32, i32)> {
    let rows: std::collections::BTreeSet<i32> = row_shapes(chunk)
        .into_iter()
        .map(|t| query_rows(t as i32))
        .filter(|&r| r > 1)
        .collect();
    let mut shapes = std::collections::BTreeSet::new();
    let mut s = 2;
    loop {
        let keys = pad.shape(2, s).1;
        for &r in &rows {
            // A chunk that runs as r rows has at least fewest_tokens(r) keys.
            if fewest_tokens(r) <= keys {
                shapes.insert(pad.shape(r, keys));
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

/// Runs the fused attention once at each of `shapes` (zeros, `heads` / `kv_heads` of
/// `head_dim`, in `dtype`) so that its kernels are built before a user needs them.
pub(super) fn warm(
    shapes: &[(i32, i32)],
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
    dtype: mlx_rs::Dtype,
    pad: Pad,
) -> Result<()> {
    for &(rows, keys) in shapes {
        let started = std::time::Instant::now();
        let q = ops::zeros_dtype(&[1, heads, rows, head_dim], dtype)?;
        let k = ops::zeros_dtype(&[1, kv_heads, keys, head_dim], dtype)?;
        let mask = super::attention::causal_mask(rows, (keys - rows).max(0), keys, dtype)?;
        attend(&q, &[(k.clone(), k)], 1.0, Some(&mask), pad)?.eval()?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(rows, keys, ms, "attention shape built");
    }
    Ok(())
}

impl Model {
    /// The chunk sizes a warm-up runs through the model so that serving chunks of at most
    /// `chunk` tokens meets no row count it has not run: where prefill is padded (CUDA) one per
    /// padded row count, elsewhere (kernels not built per shape) the chunk itself.
    pub fn warm_up_chunks(&self, chunk: usize) -> Vec<usize> {
        if self.placement.pads_prefill {
            row_shapes(chunk)
        } else {
            vec![chunk]
        }
    }

    /// Where prefill is padded (CUDA), builds the fused attention's kernels for every shape
    /// chunks of at most `chunk` tokens take over at most `max_keys` keys (capped at the context
    /// and `WARM_KEYS`), and says how many; nothing elsewhere.
    pub fn warm_up_attention(&self, chunk: usize, max_keys: usize) -> Result<usize> {
        if !self.placement.pads_prefill {
            return Ok(0);
        }
        let c = &self.config;
        let keys = max_keys.min(c.context_length).min(WARM_KEYS);
        let pad = Pad::of(&self.placement);
        let shapes = attention_shapes(chunk, keys, pad);
        warm(
            &shapes,
            c.heads as i32,
            c.kv_heads as i32,
            c.head_dim as i32,
            self.placement.dtype,
            pad,
        )?;
        Ok(shapes.len())
    }
}

/// Attention of one sequence's `t` queries (`[1, heads, t, head_dim]`, positions
/// `offset..offset + t`) over the keys and values in `spans` through the fused kernel. With
/// [`Pad::Shapes`], queries and keys are padded to [`attention_rows`] and [`key_rows`] and laid
/// out contiguously; `mask` is the causal mask of that shape (`[attention_rows, key_rows]`, or
/// of the exact one with [`Pad::Exact`]; `None` only for one query over exactly its keys). Returns
/// `[1, heads, t, head_dim]`.
pub(super) fn attend(
    q: &Array,
    spans: &[(Array, Array)],
    scale: f32,
    mask: Option<&Array>,
    pad: Pad,
) -> Result<Array> {
    let t = q.shape()[2];
    let s: i32 = spans.iter().map(|(k, _)| k.shape()[2]).sum();
    let (tp, sp) = pad.shape(t, s);
    let canonical = pad != Pad::Exact;
    let q = padded(std::slice::from_ref(q), tp, canonical)?;
    let (ks, vs): (Vec<Array>, Vec<Array>) = spans.iter().cloned().unzip();
    let (k, v) = (padded(&ks, sp, canonical)?, padded(&vs, sp, canonical)?);
    let mask = mask.map(fast::ScaledDotProductAttentionMask::Array);
    let out = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, None)?;
    Ok(if tp == t {
        out
    } else {
        out.index((.., .., ..t))
    })
}

/// `parts` (`[1, n, rows_i, d]`) joined along the rows and padded with zero rows to `rows`;
/// with `canonical`, always in a contiguous layout.
fn padded(parts: &[Array], rows: i32, canonical: bool) -> Result<Array> {
    let Some(first) = parts.first() else {
        return Err(crate::EngineError::Internal(
            "attention over no keys".into(),
        ));
    };
    let have: i32 = parts.iter().map(|p| p.shape()[2]).sum();
    let mut all = parts.to_vec();
    if have < rows {
        let s = first.shape();
        all.push(ops::zeros_dtype(
            &[s[0], s[1], rows - have, s[3]],
            first.dtype(),
        )?);
    }
    Ok(match all.as_slice() {
        // A canonical layout: CUDA's kernel is built per shape and per stride.
        [one] if canonical => one.contiguous()?,
        [one] => one.clone(),
        _ => ops::concatenate(&all, 2)?,
    })
}

#[cfg(test)]
mod tests;
