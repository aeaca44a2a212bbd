//! A matmul for few rows (`y = x · Wᵀ` with `x` of 1–16 rows): the decode step's linear layers on
//! the CPU.
//!
//! MLX's CPU backend runs every matmul through BLAS `sgemm`, and OpenBLAS's `sgemm` packs the
//! whole weight into its panel layout on every call. With one or a few rows that packing is most
//! of the cost: measured here, SmolLM2-135M's 211 weight reads of one decode step took 83 ms as
//! `sgemm` against 17 ms to stream 513 MiB at this machine's copy bandwidth. This kernel streams
//! each weight row once and multiplies it with every row of `x` while it is in L1, on all
//! cores. It runs on x86-64 with AVX2 and FMA; elsewhere (and for prefill) MLX's matmul stays.

use mlx_rs::{Array, Dtype};
use rayon::prelude::*;

use super::super::{Epilogue, FewRows};
use crate::Result;

/// The most rows of `x` worth this kernel; above it `sgemm`'s packing pays for itself.
pub const MAX_ROWS: usize = 16;

/// Weight rows per block: one block's rows stay in L1 while every row of `x` passes over them.
const BLOCK: usize = 4;

/// A dense weight `[out, in]` in row-major order, kept for [`Skinny::forward`].
#[derive(Clone)]
pub struct Skinny {
    w: Array,
    out: usize,
    inner: usize,
}

impl Skinny {
    /// The kernel for weight `w` (`[out, in]`, float32, evaluated), if this CPU can run it.
    pub fn new(w: &Array) -> Option<Skinny> {
        if !available() || w.dtype() != Dtype::Float32 || w.ndim() != 2 {
            return None;
        }
        w.try_as_slice::<f32>().ok()?;
        let (out, inner) = (w.shape()[0] as usize, w.shape()[1] as usize);
        Some(Skinny {
            w: w.clone(),
            out,
            inner,
        })
    }

    /// `x · Wᵀ` for `x` of shape `[..., in]` with at most [`MAX_ROWS`] rows; `None` where `x`
    /// does not fit (the caller then runs MLX's matmul). Evaluates `x`.
    pub fn forward(&self, x: &Array) -> Result<Option<Array>> {
        let shape = x.shape();
        let Some((&last, lead)) = shape.split_last() else {
            return Ok(None);
        };
        let rows = x.size() / self.inner.max(1);
        if last as usize != self.inner || rows == 0 || rows > MAX_ROWS {
            return Ok(None);
        }
        if x.dtype() != Dtype::Float32 {
            return Ok(None);
        }
        let x = if x.try_as_slice::<f32>().is_ok() {
            x.clone()
        } else {
            let c = x.contiguous()?;
            c.eval()?;
            c
        };
        let (Ok(xs), Ok(ws)) = (x.try_as_slice::<f32>(), self.w.try_as_slice::<f32>()) else {
            return Ok(None);
        };
        // Transposed, `[out, rows]`, so that threads fill disjoint chunks; turned row-major below.
        let mut yt = vec![0f32; self.out * rows];
        let per_thread = self.out.div_ceil(rayon::current_num_threads().max(1));
        let chunk_rows = per_thread.div_ceil(BLOCK).max(1) * BLOCK;
        let k = self.inner;
        yt.par_chunks_mut(chunk_rows * rows)
            .enumerate()
            .for_each(|(i, y)| {
                let first = i * chunk_rows;
                let n = y.len() / rows;
                rows_times(xs, rows, k, &ws[first * k..(first + n) * k], y);
            });
        let y = if rows == 1 {
            yt
        } else {
            let mut y = vec![0f32; yt.len()];
            for (n, col) in yt.chunks_exact(rows).enumerate() {
                for (m, v) in col.iter().enumerate() {
                    y[m * self.out + n] = *v;
                }
            }
            y
        };
        let mut out_shape = lead.to_vec();
        out_shape.push(self.out as i32);
        Ok(Some(Array::from_slice(&y, &out_shape)))
    }
}

impl FewRows for Skinny {
    /// The plain product only: the epilogues run as MLX ops after it.
    fn forward(&self, x: &Array, epilogue: &Epilogue) -> Result<Option<Array>> {
        match epilogue {
            Epilogue::Plain => Skinny::forward(self, x),
            Epilogue::Add(_) | Epilogue::SwiGlu => Ok(None),
        }
    }
}

/// Whether this CPU has what the kernel needs (AVX2 and FMA on x86-64).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `yt[n * rows + m] = x[m] · w[n]` for the `w.len() / k` weight rows of `w`.
fn rows_times(x: &[f32], rows: usize, k: usize, w: &[f32], yt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `Skinny::new` checked that the CPU has AVX2 and FMA; the slices' lengths are
        // what `kernel` reads (`x`: rows × k, `w`: n × k, `yt`: n × rows).
        unsafe { avx::rows_times(x, rows, k, w, yt) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        for (n, wr) in w.chunks_exact(k).enumerate() {
            for m in 0..rows {
                yt[n * rows + m] = x[m * k..(m + 1) * k]
                    .iter()
                    .zip(wr)
                    .map(|(a, b)| a * b)
                    .sum();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// Rows of `x` that one pass multiplies with a block: 3 × 4 accumulators, the three `x`
    /// vectors and one weight vector fill the 16 AVX registers, and each weight load feeds three
    /// FMAs (one row at a time, the loads of `w` from L1 were the limit at eight rows).
    const X_ROWS: usize = 3;

    /// Rows of `x` up to which each weight row is streamed alone ([`stream_dot`]).
    const STREAM_ROWS: usize = 2;

    /// See [`super::rows_times`]: blocks of four weight rows, each against every row of `x`,
    /// three rows of `x` at a time.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_times(x: &[f32], rows: usize, k: usize, w: &[f32], yt: &mut [f32]) {
        let n = w.len() / k;
        if rows <= STREAM_ROWS {
            for (r, wr) in w.chunks_exact(k).enumerate() {
                // SAFETY: AVX2 and FMA are enabled here; `x` is rows × k, `wr` k.
                let d = unsafe { stream_dot(x, rows, wr) };
                yt[r * rows..(r + 1) * rows].copy_from_slice(&d[..rows]);
            }
            return;
        }
        let mut r = 0;
        while r < n {
            let block = (n - r).min(super::BLOCK);
            let wb = &w[r * k..(r + block) * k];
            if block < super::BLOCK {
                for m in 0..rows {
                    let xr = &x[m * k..(m + 1) * k];
                    for b in 0..block {
                        yt[(r + b) * rows + m] = dot(xr, &wb[b * k..(b + 1) * k]);
                    }
                }
                r += block;
                continue;
            }
            let mut m = 0;
            while m < rows {
                let take = (rows - m).min(X_ROWS);
                let xs = &x[m * k..(m + take) * k];
                // SAFETY: AVX2 and FMA are enabled here; `xs` is take × k, `wb` 4 × k.
                let out = unsafe {
                    if take == X_ROWS {
                        dot4x3(xs, wb, k, m == 0)
                    } else {
                        let mut o = [[0f32; super::BLOCK]; X_ROWS];
                        for (i, oi) in o.iter_mut().enumerate().take(take) {
                            *oi = dot4(&xs[i * k..(i + 1) * k], wb, k);
                        }
                        o
                    }
                };
                for (i, oi) in out.iter().enumerate().take(take) {
                    for (b, v) in oi.iter().enumerate() {
                        yt[(r + b) * rows + m + i] = *v;
                    }
                }
                m += take;
            }
            r += block;
        }
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(p, q)| p * q).sum()
    }

    /// Three rows of `x` (each `k` long, one after another) against four rows of `w`:
    /// `out[i][b] = x_i · w_b`. With `ahead`, the next block of `w` is prefetched meanwhile
    /// (measured, three A/B runs: 4 rows 73 -> 62 ms per step of weights, 8 rows 93 -> 78).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)] // register arrays, indexed by constants once unrolled
    unsafe fn dot4x3(x: &[f32], w: &[f32], k: usize, ahead: bool) -> [[f32; 4]; X_ROWS] {
        let lanes = k / 8 * 8;
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 4]; X_ROWS];
        let mut c = 0;
        while c < lanes {
            if ahead {
                // The next block (the 4 k floats after this one), 32 floats an iteration.
                let next = wp.wrapping_add(4 * k + 4 * c);
                _mm_prefetch::<_MM_HINT_T0>(next as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(16) as *const i8);
            }
            // SAFETY: c + 8 <= k, so every load is inside `x` (3 k) and `w` (4 k).
            unsafe {
                let xv = [
                    _mm256_loadu_ps(xp.add(c)),
                    _mm256_loadu_ps(xp.add(k + c)),
                    _mm256_loadu_ps(xp.add(2 * k + c)),
                ];
                for b in 0..4 {
                    let wv = _mm256_loadu_ps(wp.add(b * k + c));
                    for i in 0..X_ROWS {
                        acc[i][b] = _mm256_fmadd_ps(wv, xv[i], acc[i][b]);
                    }
                }
            }
            c += 8;
        }
        let mut out = [[0f32; 4]; X_ROWS];
        for i in 0..X_ROWS {
            for b in 0..4 {
                out[i][b] = hsum(acc[i][b])
                    + dot(
                        &x[i * k + lanes..(i + 1) * k],
                        &w[b * k + lanes..(b + 1) * k],
                    );
            }
        }
        out
    }

    /// One weight row against one or two rows of `x` (`x` is `rows × w.len()`), reading the
    /// weight row front to back, 32 lanes a step: one stream per thread, which the prefetcher
    /// follows best (measured on the lm_head at one row: 17-19 GB/s, against 12-14 for
    /// four rows read side by side).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)] // register arrays, indexed by constants once unrolled
    unsafe fn stream_dot(x: &[f32], rows: usize, w: &[f32]) -> [f32; STREAM_ROWS] {
        let k = w.len();
        let lanes = k / 32 * 32;
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 4]; STREAM_ROWS];
        let mut c = 0;
        while c < lanes {
            // SAFETY: c + 32 <= k: every load is inside `w` (k) and each row of `x` (k).
            unsafe {
                let wv = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(wp.add(c + o)));
                for m in 0..STREAM_ROWS {
                    if m < rows {
                        for j in 0..4 {
                            let xv = _mm256_loadu_ps(xp.add(m * k + c + 8 * j));
                            acc[m][j] = _mm256_fmadd_ps(wv[j], xv, acc[m][j]);
                        }
                    }
                }
            }
            c += 32;
        }
        let mut out = [0f32; STREAM_ROWS];
        for m in 0..rows {
            let a = acc[m];
            let s = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
            out[m] = hsum(s) + dot(&x[m * k + lanes..(m + 1) * k], &w[lanes..]);
        }
        out
    }

    /// One row of `x` against four rows of `w` (each `k` long).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot4(x: &[f32], w: &[f32], k: usize) -> [f32; 4] {
        let lanes = k / 8 * 8;
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut c = 0;
        while c < lanes {
            // SAFETY: c + 8 <= k, so every load is inside `x` (k) and `w` (4 k).
            unsafe {
                let xv = _mm256_loadu_ps(xp.add(c));
                for (b, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(b * k + c)), xv, *a);
                }
            }
            c += 8;
        }
        let mut out = [0f32; 4];
        for (b, o) in out.iter_mut().enumerate() {
            *o = hsum(acc[b]) + dot(&x[lanes..k], &w[b * k + lanes..(b + 1) * k]);
        }
        out
    }

    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests;
