//! Attention on the CPU, read straight from the K/V spans (views of the pool's slabs, or the
//! dense store's arrays): no scores tensor, no gathered copy, no graph nodes per span.
//!
//! MLX's CPU backend builds attention from plain ops: a matmul per span, the scores joined and
//! masked, a softmax on one core, a matmul per span again, and each slice of the probabilities
//! copied because BLAS wants it contiguous. Measured here, a 512-token chunk late in a
//! 3.7k-token prefill spent ~9 s of its ~13 s in those ops (1.9 GFLOP of attention per layer),
//! and a decode step at 8 rows ~95 ms of ~170 beyond its weight reads, most of it graph nodes.
//!
//! This is flash attention's loop on the host: per query vector a running maximum and sum, key
//! tiles of [`KT`] read once for the [`QB`] positions × the heads of a KV group that share
//! them, scores in base 2 (queries scaled by `log2 e`, as in `fast_exp`), on every core
//! (rayon, one task per row, KV head and block of positions). x86-64 with AVX2 and FMA only;
//! elsewhere, or for inputs it does not read (not f32, a head wider than [`MAX_HEAD`]), the
//! caller's MLX attention runs.

use mlx_rs::{Array, Dtype};
use rayon::prelude::*;

use crate::Result;
use crate::kv::{BatchKeys, OwnKeys};

#[cfg(target_arch = "x86_64")]
mod avx;

/// Query positions per task.
const QB: usize = 4;
/// Keys per tile.
pub(crate) const KT: usize = 16;
/// The widest head read (its accumulators are a stack array).
pub(crate) const MAX_HEAD: usize = 256;

/// One span's K or V for one sequence: `heads` rows of `n × head_dim`, `head` floats apart.
#[derive(Clone, Copy)]
struct Rows {
    ptr: *const f32,
    head: usize,
    n: usize,
}

// SAFETY: the pointers are into evaluated MLX arrays that `attend` keeps alive (borrowed) for
// the whole parallel section, and nothing writes them meanwhile (every task only reads).
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

impl Rows {
    /// Element `i` from the start.
    ///
    /// # Safety
    /// `i` must be within the array the pointer is into.
    unsafe fn read(&self, i: usize) -> f32 {
        // SAFETY: the caller's.
        unsafe { *self.ptr.add(i) }
    }
}

/// Whether this CPU runs the kernel: the same AVX2 + FMA check as the few-row matmul's.
pub use super::few_rows::available;

/// Attention of `q` (`[b, heads, t, head_dim]`) over `rows[i]`, row `i`'s K/V spans in order
/// (`[1, kv_heads, n, head_dim]` each), of which the first `valid[i]` positions are keys:
/// query position `p` of row `i` sees the first `valid[i] - (t - 1 - p)` of them (causal, the
/// queries being the last `t` keys). `group` query heads share a KV head. Returns
/// `[b, t, heads * head_dim]`, or `None` where the kernel does not read these inputs.
pub fn attend(
    q: &Array,
    rows: &[Vec<(Array, Array)>],
    valid: &[usize],
    scale: f32,
    group: usize,
) -> Result<Option<Array>> {
    let shape = q.shape();
    if !available() || q.dtype() != Dtype::Float32 || shape.len() != 4 || group == 0 {
        return Ok(None);
    }
    let [b, heads, t, hd] = [0, 1, 2, 3].map(|i| shape[i] as usize);
    if rows.len() != b || valid.len() != b || heads % group != 0 || hd % 8 != 0 || hd > MAX_HEAD {
        return Ok(None);
    }
    let kvh = heads / group;
    mlx_rs::transforms::eval(
        std::iter::once(q).chain(rows.iter().flatten().flat_map(|(k, v)| [k, v])),
    )?;
    let Some(qs) = strides_of(q) else {
        return Ok(None);
    };
    let mut spans: Vec<Vec<(Rows, Rows)>> = Vec::with_capacity(b);
    for row in rows {
        let mut out = Vec::with_capacity(row.len());
        for (k, v) in row {
            let (Some(k), Some(v)) = (rows_of(k, kvh, hd), rows_of(v, kvh, hd)) else {
                return Ok(None);
            };
            if k.n != v.n {
                return Ok(None);
            }
            out.push((k, v));
        }
        spans.push(out);
    }
    // SAFETY: `q` is evaluated, f32, and its strides were read above.
    let qp = Rows {
        ptr: unsafe { mlx_sys::mlx_array_data_float32(q.as_ptr()) },
        head: 0,
        n: 0,
    };
    let tasks: Vec<(usize, usize, usize)> = (0..b)
        .flat_map(|r| (0..kvh).flat_map(move |h| (0..t).step_by(QB).map(move |p| (r, h, p))))
        .collect();
    let fold = scale * super::fast_exp::LOG2_E;
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(r, h, p0)| {
            let qb = QB.min(t - p0);
            // Query vector `i * group + g`: position `p0 + i`, head `h * group + g`.
            let mut qv = vec![0f32; qb * group * hd];
            let mut vis = vec![0usize; qb * group];
            for i in 0..qb {
                for g in 0..group {
                    let at = r * qs[0] + (h * group + g) * qs[1] + (p0 + i) * qs[2];
                    let dst = &mut qv[(i * group + g) * hd..(i * group + g + 1) * hd];
                    for (d, x) in dst.iter_mut().enumerate() {
                        // SAFETY: `at + d` is element (r, head, p0 + i, d) of `q`, within it.
                        *x = unsafe { qp.read(at + d) } * fold;
                    }
                    vis[i * group + g] = valid[r].saturating_sub(t - 1 - (p0 + i));
                }
            }
            let mut out = vec![0f32; qv.len()];
            run(&qv, &vis, &spans[r], h, hd, &mut out);
            out
        })
        .collect();
    let mut y = vec![0f32; b * t * heads * hd];
    for (&(r, h, p0), part) in tasks.iter().zip(&parts) {
        for (n, v) in part.chunks_exact(hd).enumerate() {
            let (i, g) = (n / group, n % group);
            let at = ((r * t + p0 + i) * heads + h * group + g) * hd;
            y[at..at + hd].copy_from_slice(v);
        }
    }
    Ok(Some(Array::from_slice(
        &y,
        &[b as i32, t as i32, (heads * hd) as i32],
    )))
}

/// [`attend`] of a decode step (`q` `[b, heads, 1, head_dim]`) whose rows read their own keys as
/// spans: each row's keys are the shared spans, then its own. `[b, 1, heads * head_dim]`, or
/// `None` (own keys padded, or inputs the kernel does not read).
pub fn attend_batch(
    q: &Array,
    keys: &BatchKeys,
    scale: f32,
    group: usize,
) -> Result<Option<Array>> {
    let OwnKeys::Spans(own) = &keys.own else {
        return Ok(None);
    };
    let rows: Vec<Vec<(Array, Array)>> = own
        .iter()
        .map(|o| keys.shared.iter().chain(o).cloned().collect())
        .collect();
    let valid: Vec<usize> = rows
        .iter()
        .map(|r| r.iter().map(|(k, _)| k.shape()[2] as usize).sum())
        .collect();
    attend(q, &rows, &valid, scale, group)
}

/// Element strides of an evaluated `[b, heads, t, head_dim]` query whose last axis is
/// contiguous.
fn strides_of(q: &Array) -> Option<[usize; 3]> {
    let s = q.strides();
    (s.len() == 4 && s[3] == 1).then(|| [s[0], s[1], s[2]])
}

/// An evaluated f32 span `[1, kv_heads, n, head_dim]` whose positions are `head_dim` apart.
fn rows_of(a: &Array, kvh: usize, hd: usize) -> Option<Rows> {
    let (shape, s) = (a.shape(), a.strides());
    let fits = a.dtype() == Dtype::Float32
        && shape.len() == 4
        && shape[0] == 1
        && shape[1] as usize == kvh
        && shape[3] as usize == hd
        && s[3] == 1
        && (s[2] == hd || shape[2] == 1);
    let n = shape.get(2).copied().unwrap_or(0) as usize;
    (fits && n > 0).then(|| Rows {
        // SAFETY: `a` is evaluated and f32 (checked above).
        ptr: unsafe { mlx_sys::mlx_array_data_float32(a.as_ptr()) },
        head: s[1],
        n,
    })
}

/// Query vectors `qv` (`vis[j]` keys visible to vector `j`) of KV head `h` over `spans`, into
/// `out` (one `hd` row per vector).
fn run(qv: &[f32], vis: &[usize], spans: &[(Rows, Rows)], h: usize, hd: usize, out: &mut [f32]) {
    let nq = vis.len();
    let widest = vis.iter().copied().max().unwrap_or(0);
    let mut state = vec![(f32::NEG_INFINITY, 0f32); nq];
    let mut scores = vec![[0f32; KT]; nq];
    let mut j0 = 0;
    'spans: for (k, v) in spans {
        let mut at = 0;
        while at < k.n {
            if j0 >= widest {
                break 'spans;
            }
            let kt = KT.min(k.n - at);
            // SAFETY: rows `at..at + kt` of head `h` lie within the span (`k.n`, `v.n` rows).
            let (kp, vp) = unsafe {
                (
                    k.ptr.add(h * k.head + at * hd),
                    v.ptr.add(h * v.head + at * hd),
                )
            };
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `attend` runs only where `available()`; `kp`/`vp` hold `kt` rows of `hd`.
            unsafe {
                avx::scores(qv, hd, kp, kt, &mut scores);
                for j in 0..nq {
                    let e = vis[j].saturating_sub(j0).min(kt);
                    if e > 0 {
                        let acc = &mut out[j * hd..(j + 1) * hd];
                        avx::absorb(&mut scores[j], e, &mut state[j], acc, vp, hd);
                    }
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (qv, kp, vp, &mut scores, &mut state);
            at += kt;
            j0 += kt;
        }
    }
    for (j, acc) in out.chunks_exact_mut(hd).enumerate() {
        let l = state[j].1;
        if l > 0.0 {
            acc.iter_mut().for_each(|x| *x /= l);
        }
    }
}

#[cfg(test)]
mod tests;
