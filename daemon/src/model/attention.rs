//! Attention on the CPU as plain matmuls and a softmax (MLX's CPU backend has no fused kernel,
//! and this is far faster than its fallback), and the additive masks. Keys and values may come
//! in spans read in place from the pool's slabs: scores per span, one softmax over all, one
//! product per span, summed.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype, ops};

use super::fast_exp::{LOG2_E, softmax2_last};
use crate::Result;
use crate::kv::BatchKeys;

/// Attention as two matmuls and a softmax, grouping query heads over shared K/V heads without
/// copying K/V. On MLX's CPU backend this is far faster than the fused kernel.
pub(super) fn explicit_attention(
    q: &Array,
    spans: &[(Array, Array)],
    scale: f32,
    mask: Option<&Array>,
    group: i32,
) -> Result<Array> {
    let qs = q.shape();
    let (heads, t, hd) = (qs[1], qs[2], qs[3]);
    let kv_heads = heads / group;
    // [1, kvh, g*t, hd] x [1, kvh, hd, n_i] -> [1, kvh, g*t, n_i], per span, then joined.
    let q = ops::multiply(q, Array::from_f32(scale * LOG2_E))?.reshape(&[
        1,
        kv_heads,
        group * t,
        hd,
    ])?;
    let parts = spans
        .iter()
        .map(|(k, _)| ops::matmul(&q, &k.swap_axes(2, 3)?))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut scores = if parts.len() == 1 {
        parts.into_iter().next().ok_or_else(no_keys)?
    } else {
        ops::concatenate(&parts, 3)?
    };
    if let Some(m) = mask {
        let s = scores.shape()[3];
        scores = ops::add(&scores.reshape(&[1, kv_heads, group, t, s])?, m)?.reshape(&[
            1,
            kv_heads,
            group * t,
            s,
        ])?;
    }
    let p = softmax2_last(&scores)?;
    let mut out: Option<Array> = None;
    let mut at = 0;
    for (_, v) in spans {
        let n = v.shape()[2];
        let part = if spans.len() == 1 {
            ops::matmul(&p, v)?
        } else {
            ops::matmul(p.index((.., .., .., at..at + n)), v)?
        };
        at += n;
        out = Some(match out {
            Some(o) => ops::add(&o, &part)?,
            None => part,
        });
    }
    Ok(out.ok_or_else(no_keys)?.reshape(&[1, heads, t, hd])?)
}

fn no_keys() -> crate::EngineError {
    crate::EngineError::Internal("attention over no keys".into())
}

/// `[b, 1, 1, keys]` additive mask of a decode step: row `i` sees keys `0..=lens[i]` (its
/// stored tokens and the new one), not the padding after them.
pub(super) fn padding_mask(lens: &[i32], keys: i32, dtype: Dtype) -> Result<Array> {
    let mut m = vec![0f32; lens.len() * keys as usize];
    for (row, &len) in lens.iter().enumerate() {
        for j in (len + 1)..keys {
            m[row * keys as usize + j as usize] = f32::NEG_INFINITY;
        }
    }
    Ok(Array::from_slice(&m, &[lens.len() as i32, 1, 1, keys]).as_dtype(dtype)?)
}

/// `[t, keys]` additive mask: position `offset + i` sees keys `0..=offset + i` (so neither later
/// positions nor a paged store's padding after `offset + t`).
pub(super) fn causal_mask(t: i32, offset: i32, keys: i32, dtype: Dtype) -> Result<Array> {
    let s = keys;
    let mut m = vec![0f32; (t * s) as usize];
    for i in 0..t {
        for j in (offset + i + 1)..s {
            m[(i * s + j) as usize] = f32::NEG_INFINITY;
        }
    }
    Ok(Array::from_slice(&m, &[t, s]).as_dtype(dtype)?)
}

/// Decode-step attention over [`BatchKeys`]: spans every row shares (read once for the whole
/// batch, in place) and each row's own tail, heads first (`[kv_heads, b, keys, head_dim]`, as
/// the pool gathers it). Queries `[b, heads, 1, head_dim]`; `mask` `[b, 1, 1, tail keys]`.
/// Scores of both parts are joined for one softmax. Returns `[b, 1, heads * head_dim]`.
pub(super) fn batch_attention(
    q: &Array,
    keys: &BatchKeys,
    scale: f32,
    mask: Option<&Array>,
    group: i32,
) -> Result<Array> {
    let qs = q.shape();
    let (b, heads, hd) = (qs[0], qs[1], qs[3]);
    let kv_heads = heads / group;
    let (tk, tv) = &keys.tail;
    let lt = tk.shape()[2];
    // [b, heads, 1, hd] -> [kvh, b, g, hd]
    let q = ops::multiply(q, Array::from_f32(scale * LOG2_E))?
        .reshape(&[b, kv_heads, group, hd])?
        .swap_axes(0, 1)?;
    let mut tail = ops::matmul(&q, &tk.swap_axes(2, 3)?)?; // [kvh, b, g, lt]
    if let Some(m) = mask {
        tail = ops::add(&tail, &m.reshape(&[1, b, 1, lt])?)?;
    }
    let rows = b * group;
    let mut parts = Vec::with_capacity(keys.shared.len() + 1);
    let q_all = q.reshape(&[kv_heads, rows, hd])?;
    for (k, _) in &keys.shared {
        // [kvh, b*g, hd] x [kvh, hd, n] -> [kvh, b*g, n]
        parts.push(ops::matmul(&q_all, &k.index(0).swap_axes(1, 2)?)?);
    }
    parts.push(tail.reshape(&[kv_heads, rows, lt])?);
    let scores = if parts.len() == 1 {
        parts.remove(0)
    } else {
        ops::concatenate(&parts, 2)?
    };
    let p = softmax2_last(&scores)?;
    let mut out: Option<Array> = None;
    let mut at = 0;
    for (_, v) in &keys.shared {
        let n = v.shape()[2];
        let part = ops::matmul(p.index((.., .., at..at + n)), v.index(0))?;
        at += n;
        out = Some(match out {
            Some(o) => ops::add(&o, &part)?,
            None => part,
        });
    }
    let pt = if at == 0 {
        p
    } else {
        p.index((.., .., at..at + lt))
    };
    let own = ops::matmul(pt.reshape(&[kv_heads, b, group, lt])?, tv)?; // [kvh, b, g, hd]
    let own = own.reshape(&[kv_heads, rows, hd])?;
    let out = match out {
        Some(o) => ops::add(&o, &own)?,
        None => own,
    };
    Ok(out
        .reshape(&[kv_heads, b, group, hd])?
        .swap_axes(0, 1)?
        .reshape(&[b, 1, heads * hd])?)
}
