//! Attention on the CPU as plain matmuls and a softmax (MLX's CPU backend has no fused kernel,
//! and this is far faster than its fallback). Keys and values may come
//! in spans read in place from the pool's slabs: scores per span, one softmax over all, one
//! product per span, summed.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, ops};

use super::fast_exp::{LOG2_E, softmax2_last};
use crate::Result;
use crate::kv::{BatchKeys, OwnKeys, first_positions};

/// Attention as two matmuls and a softmax, grouping query heads over shared K/V heads without
/// copying K/V. On MLX's CPU backend this is far faster than the fused kernel. `sinks`
/// (`[heads]`) add a column per head to the softmax that has no value.
pub fn explicit_attention(
    q: &Array,
    spans: &[(Array, Array)],
    scale: f32,
    mask: Option<&Array>,
    group: i32,
    sinks: Option<&Array>,
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
    let p = match sinks {
        None => softmax2_last(&scores)?,
        Some(s) => {
            // Scores are in base 2 (q carries log2 e): so is the sink column.
            let n = scores.shape()[3];
            let col = ops::multiply(&s.as_dtype(scores.dtype())?, Array::from_f32(LOG2_E))?
                .reshape(&[1, kv_heads, group, 1, 1])?;
            let col = ops::broadcast_to(&col, &[1, kv_heads, group, t, 1])?.reshape(&[
                1,
                kv_heads,
                group * t,
                1,
            ])?;
            softmax2_last(&ops::concatenate(&[scores, col], 3)?)?.index((.., .., .., ..n))
        }
    };
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

/// [`explicit_attention`] of a prefill chunk (queries at positions `offset..offset + t`) in
/// pieces of at most `piece` query rows: piece `[c0, c1)` reads only the first `offset + c1`
/// keys, which is all its causal mask (`[t, keys]`) lets it see. The same result, with the work
/// above the diagonal left out. Far into a long prompt a piece has fewer rows, so that its
/// scores stay within [`PIECE_SCORES`].
pub fn causal_attention(
    q: &Array,
    spans: &[(Array, Array)],
    scale: f32,
    mask: &Array,
    group: i32,
    offset: i32,
    piece: i32,
) -> Result<Array> {
    let (heads, t) = (q.shape()[1], q.shape()[2]);
    let mut outs = Vec::new();
    let mut c0 = 0;
    while c0 < t {
        let widest = offset + (c0 + piece).min(t);
        let rows = (PIECE_SCORES / (heads * widest).max(1)).clamp(MIN_PIECE.min(piece), piece);
        let c1 = (c0 + rows).min(t);
        let keys = offset + c1;
        let part = first_positions(spans, keys as usize);
        let m = mask.index((c0..c1, ..keys));
        let qp = q.index((.., .., c0..c1));
        let out = explicit_attention(&qp, &part, scale, Some(&m), group, None)?;
        // One piece at a time: evaluated together, every piece's scores and their softmax
        // temporaries were alive at once (measured: the daemon ~400 MiB above its pool late in a
        // 3.7k-token prefill); one by one, each piece reuses the buffers the one before freed.
        out.eval()?;
        outs.push(out);
        c0 = c1;
    }
    Ok(ops::concatenate(&outs, 2)?)
}

/// The most scores (query rows x keys x heads) one causal piece holds: 4 MiB of f32, a few
/// times over for the softmax's temporaries. Measured with 128-row pieces, a 3.7k-token prefill
/// held ~180 MiB beyond its pool at the end, against 64 MiB the footprint check allows.
const PIECE_SCORES: i32 = 1 << 20;

/// The fewest rows a piece has (each piece costs its own graph nodes and evaluation).
const MIN_PIECE: i32 = 16;

fn no_keys() -> crate::EngineError {
    crate::EngineError::Internal("attention over no keys".into())
}

/// Decode-step attention over [`BatchKeys`]: spans every row shares (read once for the whole
/// batch, in place) and each row's own keys, either gathered and padded (`[kv_heads, b, keys,
/// head_dim]`, masked by `mask`, `[b, 1, 1, own keys]`) or as each row's own spans, read in
/// place. Queries `[b, heads, 1, head_dim]`. One softmax for the whole batch over the scores of
/// both parts (a row's own scores padded with -inf to the longest row's). Returns `[b, 1,
/// heads * head_dim]`.
pub fn batch_attention(
    q: &Array,
    keys: &BatchKeys,
    scale: f32,
    mask: Option<&Array>,
    group: i32,
    sinks: Option<&Array>,
) -> Result<Array> {
    let qs = q.shape();
    let (b, heads, hd) = (qs[0], qs[1], qs[3]);
    let kv_heads = heads / group;
    let rows = b * group;
    // [b, heads, 1, hd] -> [kvh, b * g, hd], contiguous: row i's queries are i*g..(i+1)*g.
    let q = ops::multiply(q, Array::from_f32(scale * LOG2_E))?
        .reshape(&[b, kv_heads, group, hd])?
        .swap_axes(0, 1)?
        .reshape(&[kv_heads, rows, hd])?;
    let mut parts = Vec::with_capacity(keys.shared.len() + 1);
    for (k, _) in &keys.shared {
        // [kvh, b*g, hd] x [kvh, hd, n] -> [kvh, b*g, n]
        parts.push(ops::matmul(&q, &k.squeeze_axes(&[0])?.swap_axes(1, 2)?)?);
    }
    let (own_scores, lt) = own_scores(&q, &keys.own, mask, b, group)?;
    parts.push(own_scores);
    let mut scores = if parts.len() == 1 {
        parts.remove(0)
    } else {
        ops::concatenate(&parts, 2)?
    };
    let n = scores.shape()[2];
    if let Some(s) = sinks {
        // Row i * group + g of kv head h is query head h * group + g: its sink, in base 2.
        let col = ops::multiply(&s.as_dtype(scores.dtype())?, Array::from_f32(LOG2_E))?
            .reshape(&[kv_heads, 1, group])?;
        let col = ops::broadcast_to(&col, &[kv_heads, b, group])?.reshape(&[kv_heads, rows, 1])?;
        scores = ops::concatenate(&[scores, col], 2)?;
    }
    let mut p = softmax2_last(&scores)?;
    if sinks.is_some() {
        p = p.index((.., .., ..n));
    }
    let at = keys.shared_len as i32;
    let out = if keys.shared.is_empty() {
        None
    } else {
        Some(spans_product(&p, &keys.shared)?)
    };
    let pt = if at == 0 {
        p
    } else {
        p.index((.., .., at..at + lt))
    };
    let own = match &keys.own {
        OwnKeys::Padded(..) | OwnKeys::RowsFirst(..) => {
            let Some((_, tv)) = keys.own.heads_first()? else {
                return Err(no_keys());
            };
            ops::matmul(pt.reshape(&[kv_heads, b, group, lt])?, tv)?
                .reshape(&[kv_heads, rows, hd])?
        }
        OwnKeys::Tables(_) => return Err(no_keys()),
        OwnKeys::Spans(per_row) => {
            let mut outs = Vec::with_capacity(per_row.len());
            for (i, spans) in per_row.iter().enumerate() {
                let i = i as i32;
                let pi = pt.index((.., i * group..(i + 1) * group));
                outs.push(spans_product(&pi, spans)?);
            }
            ops::concatenate(&outs, 1)?
        }
    };
    let out = match out {
        Some(o) => ops::add(&o, &own)?,
        None => own,
    };
    Ok(out
        .reshape(&[kv_heads, b, group, hd])?
        .swap_axes(0, 1)?
        .reshape(&[b, 1, heads * hd])?)
}

/// Scores of each row's own keys, `[kv_heads, b * group, keys]`, and that number of keys.
fn own_scores(
    q: &Array,
    own: &OwnKeys,
    mask: Option<&Array>,
    b: i32,
    group: i32,
) -> Result<(Array, i32)> {
    let (kv_heads, hd) = (q.shape()[0], q.shape()[2]);
    match own {
        OwnKeys::Padded(..) | OwnKeys::RowsFirst(..) => {
            let Some((tk, _)) = own.heads_first()? else {
                return Err(no_keys());
            };
            let lt = tk.shape()[2];
            let q = q.reshape(&[kv_heads, b, group, hd])?;
            let mut s = ops::matmul(&q, &tk.swap_axes(2, 3)?)?; // [kvh, b, g, lt]
            if let Some(m) = mask {
                s = ops::add(&s, &m.reshape(&[1, b, 1, lt])?)?;
            }
            Ok((s.reshape(&[kv_heads, b * group, lt])?, lt))
        }
        OwnKeys::Tables(_) => Err(no_keys()),
        OwnKeys::Spans(per_row) => {
            let len = |spans: &Vec<(Array, Array)>| -> i32 {
                spans.iter().map(|(k, _)| k.shape()[2]).sum()
            };
            let lt = per_row.iter().map(len).max().unwrap_or(0);
            let mut rows = Vec::with_capacity(per_row.len());
            for (i, spans) in per_row.iter().enumerate() {
                let i = i as i32;
                let qi = q.index((.., i * group..(i + 1) * group)); // [kvh, g, hd]
                let mut s = Vec::with_capacity(spans.len() + 1);
                for (k, _) in spans {
                    s.push(ops::matmul(&qi, &k.squeeze_axes(&[0])?.swap_axes(1, 2)?)?);
                }
                let pad = lt - len(spans);
                if pad > 0 {
                    let inf = Array::from_f32(f32::NEG_INFINITY).as_dtype(q.dtype())?;
                    s.push(ops::broadcast_to(&inf, &[kv_heads, group, pad])?);
                }
                rows.push(if s.len() == 1 {
                    s.remove(0)
                } else {
                    ops::concatenate(&s, 2)?
                });
            }
            Ok((ops::concatenate(&rows, 1)?, lt))
        }
    }
}

/// `p` (`[kv_heads, g, keys]`, the first keys being those of `spans` in order) times the
/// values of `spans`: `[kv_heads, g, head_dim]`.
fn spans_product(p: &Array, spans: &[(Array, Array)]) -> Result<Array> {
    let mut out: Option<Array> = None;
    let mut at = 0;
    for (_, v) in spans {
        let n = v.shape()[2];
        let part = ops::matmul(p.index((.., .., at..at + n)), v.squeeze_axes(&[0])?)?;
        at += n;
        out = Some(match out {
            Some(o) => ops::add(&o, &part)?,
            None => part,
        });
    }
    out.ok_or_else(no_keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::masks::causal_mask;
    use mlx_rs::Dtype;

    #[test]
    fn causal_pieces_match_one_attention_over_every_key() {
        // A chunk of 40 queries after 13 stored positions, keys in two spans, GQA 3:1.
        let (kvh, group, hd, offset, t) = (2, 3, 8, 13, 40);
        let rand =
            |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, None).expect("random");
        let q = rand(&[1, kvh * group, t, hd]);
        let spans: Vec<(Array, Array)> = [24, 32]
            .iter()
            .map(|&n| (rand(&[1, kvh, n, hd]), rand(&[1, kvh, n, hd])))
            .collect();
        let mask = causal_mask(t, offset, 56, None, Dtype::Float32).expect("mask");
        let whole = explicit_attention(&q, &spans, 0.35, Some(&mask), group, None).expect("whole");
        for piece in [7, 16, 40] {
            let pieces =
                causal_attention(&q, &spans, 0.35, &mask, group, offset, piece).expect("pieces");
            assert_eq!(pieces.shape(), whole.shape());
            let diff = ops::abs(ops::subtract(&pieces, &whole).expect("sub"))
                .expect("abs")
                .max(None)
                .expect("max")
                .item_exact::<f32>();
            assert!(diff < 1e-5, "piece {piece}: max difference {diff}");
        }
    }
}
