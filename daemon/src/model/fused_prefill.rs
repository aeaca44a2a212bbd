//! A prefill chunk's attention through MLX's fused kernel (a GPU), padded to a few shapes.
//!
//! The fused kernel is built per shape: on CUDA each new (queries, keys) pair builds a cuDNN
//! graph (measured on an H200: 50-700 ms the first time, ~20 ms after), on Metal each alignment
//! is its own kernel. Every prompt length would be a new shape, and a burst of distinct prompts
//! spent most of its prefill building them (the quantized matmuls, too, are built per row
//! count: a CUDA warm-up of 45 distinct chunk sizes took 221 s on SmolLM2 Q4_1). So a chunk
//! runs a padded number of rows, a power of two ([`query_rows`], the model pads the tokens), and
//! its attention reads keys padded with zero rows to a multiple of [`KEY_STEP`] ([`key_rows`]);
//! the causal mask of the padded shape hides the padding from every real query (a key past a
//! query's position is masked, and every padded key lies past the chunk's last real position).
//! Padded queries see at least the real keys, so no row is all masked; their outputs are
//! dropped.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, fast, ops};

use crate::Result;

/// The fewest query rows a padded chunk has.
const MIN_QUERY_ROWS: i32 = 16;

/// Beyond this many query rows a chunk is padded to a multiple of it, not a power of two.
const MAX_POWER_ROWS: i32 = 512;

/// Keys are padded to a multiple of this many rows.
pub(super) const KEY_STEP: i32 = 256;

/// Query rows a chunk of `t` tokens is padded to (`t` itself for one token: a decode-shaped
/// query takes the kernel's vector path, built once).
pub(super) fn query_rows(t: i32) -> i32 {
    if t <= 1 {
        t
    } else if t <= MAX_POWER_ROWS {
        (t as u32).next_power_of_two().max(MIN_QUERY_ROWS as u32) as i32
    } else {
        round_up(t, MAX_POWER_ROWS)
    }
}

/// Key rows `s` keys are padded to (none for a one-token query, see [`query_rows`]).
pub(super) fn key_rows(t: i32, s: i32) -> i32 {
    if t <= 1 { s } else { round_up(s, KEY_STEP) }
}

/// What a warm-up prefills so that serving chunks of at most `chunk` tokens over at most twice
/// that many keys meets no shape it has not run: `(offset, tokens)` pairs, each a chunk of
/// `tokens` after `offset` stored ones, one per padded (queries, keys) shape. Longer contexts
/// build their shapes on first use (a few per 256 keys, once per process).
pub fn warm_shapes(chunk: usize) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1) as i32;
    let queries: std::collections::BTreeSet<i32> = (1..=chunk).map(query_rows).collect();
    let mut out = Vec::new();
    let mut keys = KEY_STEP;
    while keys <= round_up(2 * chunk, KEY_STEP) {
        for &t in queries.iter().filter(|&&t| t > 1) {
            // Queries and keys both padded (fewer rows than the shape) like most served chunks.
            let tokens = (t - 1).min(chunk).min(keys - 1);
            if tokens >= fewest_rows(t) {
                out.push(((keys - 1 - tokens) as usize, tokens as usize));
            }
        }
        keys += KEY_STEP;
    }
    if out.is_empty() {
        out.push((0, chunk as usize));
    }
    out
}

/// The fewest tokens (two or more) whose queries pad to `t` rows.
fn fewest_rows(t: i32) -> i32 {
    if t <= MIN_QUERY_ROWS {
        2
    } else if t <= MAX_POWER_ROWS {
        t / 2 + 1
    } else {
        t - MAX_POWER_ROWS + 1
    }
}

fn round_up(x: i32, step: i32) -> i32 {
    (x + step - 1) / step * step
}

/// Attention of one sequence's `t` queries (`[1, heads, t, head_dim]`, positions
/// `offset..offset + t`) over the keys and values in `spans` through the fused kernel, with
/// queries and keys padded to [`query_rows`] and [`key_rows`]. `mask` is the causal mask of
/// the padded shape (`[query_rows, key_rows]`; `None` only for one query over exactly its
/// keys). Returns `[1, heads, t, head_dim]`.
pub(super) fn attend(
    q: &Array,
    spans: &[(Array, Array)],
    scale: f32,
    mask: Option<&Array>,
) -> Result<Array> {
    let t = q.shape()[2];
    let s: i32 = spans.iter().map(|(k, _)| k.shape()[2]).sum();
    let (tp, sp) = (query_rows(t), key_rows(t, s));
    let q = padded(std::slice::from_ref(q), tp)?;
    let (ks, vs): (Vec<Array>, Vec<Array>) = spans.iter().cloned().unzip();
    let (k, v) = (padded(&ks, sp)?, padded(&vs, sp)?);
    let mask = mask.map(fast::ScaledDotProductAttentionMask::Array);
    let out = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, None)?;
    Ok(if tp == t {
        out
    } else {
        out.index((.., .., ..t))
    })
}

/// `parts` (`[1, n, rows_i, d]`) joined along the rows and padded with zero rows to `rows`.
fn padded(parts: &[Array], rows: i32) -> Result<Array> {
    let have: i32 = parts.iter().map(|p| p.shape()[2]).sum();
    let mut all = parts.to_vec();
    if have < rows {
        let s = parts[0].shape();
        all.push(ops::zeros_dtype(
            &[s[0], s[1], rows - have, s[3]],
            parts[0].dtype(),
        )?);
    }
    Ok(match all.as_slice() {
        // A canonical layout: the kernel is built per shape and per stride.
        [one] => one.contiguous()?,
        _ => ops::concatenate(&all, 2)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_pad_to_few_shapes() {
        assert_eq!(query_rows(1), 1);
        assert_eq!(query_rows(2), 16);
        assert_eq!(query_rows(17), 32);
        assert_eq!(query_rows(300), 512);
        assert_eq!(query_rows(512), 512);
        assert_eq!(query_rows(513), 1024);
        assert_eq!(query_rows(1500), 1536);
        let distinct: std::collections::BTreeSet<i32> = (1..=512).map(query_rows).collect();
        assert_eq!(distinct.len(), 7, "{distinct:?}");
    }

    #[test]
    fn keys_pad_to_steps_but_not_for_one_query() {
        assert_eq!(key_rows(1, 37), 37);
        assert_eq!(key_rows(300, 300), 256 * 2);
        assert_eq!(key_rows(64, 4096), 4096);
        assert_eq!(key_rows(64, 4097), 4096 + 256);
    }

    #[test]
    fn warm_up_covers_every_shape_of_short_prompts() {
        for chunk in [1usize, 7, 100, 512, 700] {
            let warmed: std::collections::BTreeSet<(i32, i32)> = warm_shapes(chunk)
                .into_iter()
                .map(|(o, t)| {
                    assert!(t <= chunk.max(2), "{chunk}: a warm-up chunk of {t}");
                    let (o, t) = (o as i32, t as i32);
                    (query_rows(t), key_rows(t, o + t))
                })
                .collect();
            let limit = 2 * chunk as i32;
            for offset in 0..limit {
                for t in 2..=(chunk as i32).min(limit - offset) {
                    let shape = (query_rows(t), key_rows(t, offset + t));
                    assert!(
                        warmed.contains(&shape),
                        "{chunk}: {offset}+{t} -> {shape:?}"
                    );
                }
            }
        }
        assert_eq!(warm_shapes(512).len(), 5 + 6 + 6 + 6);
    }

    /// The padded shape gives every real query the attention of the unpadded one (on any
    /// device: the CPU runs MLX's reference of the fused kernel).
    #[test]
    fn padding_changes_no_real_query() {
        use crate::model::attention::causal_mask;
        let r = |shape: &[i32]| mlx_rs::random::normal::<f32>(shape, None, None, None).expect("r");
        let (heads, kv_heads, hd) = (4, 2, 8);
        for (offset, t) in [(0, 5), (0, 16), (37, 20), (250, 9), (300, 300)] {
            let s = offset + t;
            let q = r(&[1, heads, t, hd]);
            // Two spans, as the pool hands them out.
            let cut = s / 3;
            let spans = vec![
                (r(&[1, kv_heads, cut, hd]), r(&[1, kv_heads, cut, hd])),
                (
                    r(&[1, kv_heads, s - cut, hd]),
                    r(&[1, kv_heads, s - cut, hd]),
                ),
            ];
            let (ks, vs): (Vec<Array>, Vec<Array>) = spans.iter().cloned().unzip();
            let (k, v) = (
                ops::concatenate(&ks, 2).expect("k"),
                ops::concatenate(&vs, 2).expect("v"),
            );
            let exact = causal_mask(t, offset, s, mlx_rs::Dtype::Float32).expect("mask");
            let want = fast::scaled_dot_product_attention(
                &q,
                &k,
                &v,
                0.3,
                Some(fast::ScaledDotProductAttentionMask::Array(&exact)),
                None,
            )
            .expect("want");
            let (tp, sp) = (query_rows(t), key_rows(t, s));
            let padded_mask = causal_mask(tp, offset, sp, mlx_rs::Dtype::Float32).expect("mask");
            let got = attend(&q, &spans, 0.3, Some(&padded_mask)).expect("got");
            assert_eq!(got.shape(), want.shape());
            let diff = ops::abs(ops::subtract(&got, &want).expect("d"))
                .expect("abs")
                .max(None)
                .expect("max")
                .item_exact::<f32>();
            assert!(diff < 1e-5, "{offset}+{t}: {diff}");
        }
    }
}
