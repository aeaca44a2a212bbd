//! The additive masks of attention through plain ops or MLX's fused kernel: 0 where a query
//! sees a key, -inf where it does not.

use mlx_rs::{Array, Dtype};

use crate::Result;

/// `[b, 1, 1, keys]` additive mask of a decode step: row `i` sees keys `0..=lens[i]` (its
/// stored tokens and the new one), not the padding after them; with a `window`, only the last
/// `window` of them.
pub fn padding_mask(lens: &[i32], keys: i32, window: Option<i32>, dtype: Dtype) -> Result<Array> {
    let mut m = vec![0f32; lens.len() * keys as usize];
    for (row, &len) in lens.iter().enumerate() {
        let first = window.map_or(0, |w| (len + 1 - w).max(0));
        for j in (0..first).chain((len + 1)..keys) {
            m[row * keys as usize + j as usize] = f32::NEG_INFINITY;
        }
    }
    Ok(Array::from_slice(&m, &[lens.len() as i32, 1, 1, keys]).as_dtype(dtype)?)
}

/// `[t, keys]` additive mask: position `offset + i` sees keys `0..=offset + i` (so neither later
/// positions nor a paged store's padding after `offset + t`); with a `window`, only the last
/// `window` of them.
pub fn causal_mask(
    t: i32,
    offset: i32,
    keys: i32,
    window: Option<i32>,
    dtype: Dtype,
) -> Result<Array> {
    let s = keys;
    let mut m = vec![0f32; (t * s) as usize];
    for i in 0..t {
        let first = window.map_or(0, |w| (offset + i + 1 - w).max(0)).min(s);
        for j in (0..first).chain((offset + i + 1)..s) {
            m[(i * s + j) as usize] = f32::NEG_INFINITY;
        }
    }
    Ok(Array::from_slice(&m, &[t, s]).as_dtype(dtype)?)
}
