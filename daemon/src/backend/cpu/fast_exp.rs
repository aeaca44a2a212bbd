//! Exponentials for MLX's CPU backend: the softmax of attention and the SiLU of the MLP.
//!
//! On x86-64 Linux the CPU backend's `exp` is scalar, ~12–16 ns an element: at a 512-token
//! prefill the softmax and the SiLU take over half the forward pass, more than every matmul
//! together. Here `2^y` is built from ops the backend runs fast (multiply, add, min/max, casts)
//! and compiled (`mlx::compile` fuses elementwise ops into generated loops; gcc does not
//! vectorise them, but one pass of ~20 scalar ops still costs ~3.4 ns an element):
//! `2^y = 2^n · 2^f` with `n = round(y)`, `2^f` a degree-6 polynomial on `|f| ≤ 1/2` (relative
//! error ≤ 4e-7; f32 rounding is 6e-8), `2^n` made from its exponent bits. Inputs are clamped to
//! ±126, so `-inf` (a masked score) gives ~1e-38 rather than 0, which a softmax cannot tell
//! from 0.
//!
//! Two fused loops, because reading the bits as an f32 is a view, which MLX does not fuse: one
//! makes the bits of `2^n`, the other recomputes `f` and multiplies. Attention works in base 2
//! (its queries are scaled by `log2 e` too), so softmax needs no extra multiply.
//!
//! Only for f32 on the CPU: the GPU keeps MLX's own kernels (and its fused attention).

use std::cell::RefCell;
use std::collections::HashSet;

use mlx_rs::error::Exception;
use mlx_rs::transforms::compile::compile;
use mlx_rs::{Array, Dtype, ops};

use crate::Result;

pub(super) const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// `ln(2)^k / k!` for k = 0..=6: the Taylor series of `2^f`, enough for f32 on `|f| ≤ 1/2`.
pub(super) const C: [f32; 7] = [
    1.0,
    std::f32::consts::LN_2,
    0.240_226_5,
    0.055_504_11,
    0.009_618_129,
    0.001_333_355_8,
    0.000_154_035_3,
];

/// Adding and subtracting 1.5 · 2^23 rounds an f32 of magnitude < 2^22 to an integer.
const ROUND: f32 = 12_582_912.0;

type Mlx<T> = std::result::Result<T, Exception>;

/// `y` clamped to ±126 and its nearest integer `n` (as an f32).
fn clamped_and_rounded(y: &Array) -> Mlx<(Array, Array)> {
    let f32c = Array::from_f32;
    let y = ops::minimum(ops::maximum(y, f32c(-126.0))?, f32c(126.0))?;
    let n = (&y + f32c(ROUND)) - f32c(ROUND);
    Ok((y, n))
}

/// The bits of `2^round(y)`: the biased exponent `n + 127` shifted into place (≤ 253 · 2^23
/// fits an i32).
fn pow2_bits(y: &Array) -> Mlx<Array> {
    let (_, n) = clamped_and_rounded(y)?;
    Ok((n + Array::from_f32(127.0)).as_dtype(Dtype::Int32)? * Array::from_int(1 << 23))
}

/// `2^y` from `y` and `2^round(y)`.
fn pow2_from(y: &Array, two_n: &Array) -> Mlx<Array> {
    let f32c = Array::from_f32;
    let (y, n) = clamped_and_rounded(y)?;
    let f = y - n;
    // Estrin's scheme keeps the chain short.
    let f2 = &f * &f;
    let f4 = &f2 * &f2;
    let a = f32c(C[0]) + &f * f32c(C[1]);
    let b = &f2 * (f32c(C[2]) + &f * f32c(C[3]));
    let c = f4 * ((f32c(C[4]) + &f * f32c(C[5])) + f2 * f32c(C[6]));
    Ok((a + b + c) * two_n)
}

fn pow2_graph((y, two_n): (&Array, &Array)) -> Mlx<Array> {
    pow2_from(y, two_n)
}

/// `silu(g) · u = g · u / (1 + e)` with `e = exp(-g)`.
fn silu_mul_graph((g, u, e): (&Array, &Array, &Array)) -> Mlx<Array> {
    Ok((g * u) / (Array::from_f32(1.0) + e))
}

type Unary = Box<dyn FnMut(&Array) -> Mlx<Array>>;
type Binary = Box<dyn for<'a> FnMut((&'a Array, &'a Array)) -> Mlx<Array>>;
type Ternary = Box<dyn for<'a> FnMut((&'a Array, &'a Array, &'a Array)) -> Mlx<Array>>;

/// Distinct element counts traced before the compiled functions are rebuilt: MLX keeps one
/// trace per input shape and looks them up one by one, so the list must stay short.
const MAX_TRACES: usize = 96;

/// The compiled functions of this thread. Not shapeless: there MLX reads each constant
/// through a pointer in a strided loop, twice as slow. Inputs are flattened, so only the
/// element count keys a trace.
struct Kernels {
    bits: Unary,
    pow2: Binary,
    silu_mul: Ternary,
    sizes: HashSet<i32>,
}

impl Kernels {
    fn new() -> Kernels {
        Kernels {
            bits: Box::new(compile(pow2_bits, false)),
            pow2: Box::new(compile(pow2_graph, false)),
            silu_mul: Box::new(compile(silu_mul_graph, false)),
            sizes: HashSet::new(),
        }
    }

    /// Ready for inputs of `n` elements (dropping the old functions drops their traces).
    fn sized(&mut self, n: i32) -> &mut Kernels {
        if self.sizes.insert(n) && self.sizes.len() > MAX_TRACES {
            *self = Kernels::new();
            self.sizes.insert(n);
        }
        self
    }

    /// `2^y` of a flat f32 `y`.
    fn pow2(&mut self, y: &Array) -> Result<Array> {
        let k = self.sized(y.size() as i32);
        let two_n = (k.bits)(y)?.view_dtype(Dtype::Float32)?;
        Ok((k.pow2)((y, &two_n))?)
    }
}

thread_local! {
    // Compiled once per thread: a compiled function is not `Send`.
    static KERNELS: RefCell<Kernels> = RefCell::new(Kernels::new());
}

/// `2^y` elementwise, for f32 `y`.
pub(super) fn pow2(y: &Array) -> Result<Array> {
    if y.dtype() != Dtype::Float32 {
        return Ok(ops::exp(ops::multiply(
            y,
            Array::from_f32(std::f32::consts::LN_2),
        )?)?);
    }
    let flat = y.flatten(None, None)?;
    let out = KERNELS.with(|k| k.borrow_mut().pow2(&flat))?;
    Ok(out.reshape(y.shape())?)
}

/// Softmax over the last axis of scores in base 2 (`2^s / Σ 2^s`), computed in f32.
pub(super) fn softmax2_last(s: &Array) -> Result<Array> {
    let max = s.max_axis(-1, true)?;
    let e = pow2(&ops::subtract(s, &max)?)?;
    let sum = e.sum_axis(-1, true)?;
    Ok(ops::divide(&e, &sum)?)
}

/// `silu(g) * u`, the SwiGLU of the MLP, for same-shaped f32 `g` and `u`.
pub(super) fn silu_mul(g: &Array, u: &Array) -> Result<Array> {
    if g.dtype() != Dtype::Float32 || u.dtype() != Dtype::Float32 || g.shape() != u.shape() {
        return Ok(ops::multiply(&mlx_rs::nn::silu(g)?, u)?);
    }
    let (gf, uf) = (g.flatten(None, None)?, u.flatten(None, None)?);
    let y = ops::multiply(&gf, Array::from_f32(-LOG2_E))?;
    let out = KERNELS.with(|k| -> Result<Array> {
        let mut k = k.borrow_mut();
        let e = k.pow2(&y)?;
        Ok((k.silu_mul)((&gf, &uf, &e))?)
    })?;
    Ok(out.reshape(g.shape())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(a: &Array) -> Vec<f32> {
        a.eval().expect("eval");
        a.as_slice::<f32>().to_vec()
    }

    #[test]
    fn pow2_matches_the_exact_one_within_a_few_ulps() {
        let xs: Vec<f32> = (-12_000..=12_000).map(|i| i as f32 / 100.0).collect();
        let got = host(&pow2(&Array::from_slice(&xs, &[xs.len() as i32])).expect("pow2"));
        for (x, y) in xs.iter().zip(got) {
            let want = f64::from(*x).exp2();
            let rel = ((f64::from(y) - want) / want).abs();
            assert!(rel < 4e-7, "2^{x} = {y}, want {want} (rel {rel:e})");
        }
    }

    #[test]
    fn masked_and_extreme_inputs_stay_finite_and_ordered() {
        let xs = [f32::NEG_INFINITY, -1e30, -200.0, 0.0, 200.0];
        let got = host(&pow2(&Array::from_slice(&xs, &[5])).expect("pow2"));
        assert!(
            got[0] < 1e-37 && got[1] < 1e-37 && got[2] < 1e-37,
            "{got:?}"
        );
        assert_eq!(got[3], 1.0);
        assert!(got[4].is_finite() && got[4] > 1e37, "{got:?}");
    }

    #[test]
    fn many_distinct_sizes_rebuild_the_traces_and_stay_exact() {
        for n in 1..=(2 * MAX_TRACES as i32 + 5) {
            let xs: Vec<f32> = (0..n).map(|i| (i % 13) as f32 - 6.0).collect();
            let got = host(&pow2(&Array::from_slice(&xs, &[n])).expect("pow2"));
            for (x, y) in xs.iter().zip(got) {
                assert!((f64::from(y) - f64::from(*x).exp2()).abs() < 1e-6 * f64::from(*x).exp2());
            }
        }
        KERNELS.with(|k| assert!(k.borrow().sizes.len() <= MAX_TRACES));
    }

    #[test]
    fn softmax_and_silu_agree_with_mlx() {
        let xs: Vec<f32> = (0..3 * 70)
            .map(|i| ((i * 37) % 101) as f32 / 7.0 - 7.0)
            .collect();
        let mut masked = xs.clone();
        masked[5] = f32::NEG_INFINITY;
        let x = Array::from_slice(&masked, &[3, 70]);
        let base2 = ops::multiply(&x, Array::from_f32(LOG2_E)).expect("scale");
        let ours = host(&softmax2_last(&base2).expect("softmax"));
        let theirs = host(&ops::softmax_axis(&x, -1, true).expect("mlx softmax"));
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-6 * b.max(1e-3), "{a} vs {b}");
        }
        assert!(ours[5] < 1e-30);
        let g = Array::from_slice(&xs, &[3, 70]);
        let u = ops::add(&g, Array::from_f32(0.5)).expect("u");
        let ours = host(&silu_mul(&g, &u).expect("silu"));
        let theirs = host(&ops::multiply(mlx_rs::nn::silu(&g).expect("silu"), &u).expect("mul"));
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
}
