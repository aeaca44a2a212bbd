//! A matmul for few rows on CUDA (`y = x · Wᵀ` with `x` of 2–16 rows): a decode step's
//! projections, with what follows them where that is one more op ([`Epilogue`]: the residual
//! add after o and down, SwiGLU after the joined gate/up). On by default on CUDA;
//! `MLXCEL_CUDA_FEW_ROWS=0` leaves every matmul to MLX, `MLXCEL_CUDA_FUSED_EPILOGUES=0` keeps the
//! kernel but runs the epilogues as MLX ops. It can also take the RMS norm before a projection
//! ([`RmsNorm`], [`CudaSkinny::forward_normed`]; opt-in, [`fuses_norms`]).
//!
//! MLX's CUDA backend runs a one-row matmul through its own gemv kernel (~5 µs of host time per
//! call) but sends every matmul of 2 rows or more to cuBLAS, ~20 µs of host time per call
//! (`bench/results/2026-12-04-gpu-h200-joined/`). This kernel never reaches cuBLAS: a block of 8
//! warps computes 16 outputs with tensor-core MMAs (m16n8k16, f16 or bf16 in, f32 accumulators),
//! each warp over an eighth of the inner dimension, summed in shared memory; weights are read
//! once and nothing is converted. It is an MLX custom kernel (`cuda_kernel`), compiled by NVRTC
//! once per dtype, tile count and epilogue.
//!
//! Measured on an H100 (`bench/results/2026-12-06-gpu-h100-few-rows-fused/`): a 32-layer
//! 8B-like step's four projections at 8 rows cost the host 2.0 ms to encode against 3.6 through
//! cuBLAS, and the device 5.5 ms against 5.1 (its weights streamed at ~2.55 TB/s against
//! ~2.73); since a served decode step is bound by the host, 8 clients were served 13% faster
//! (524 and 528 against 479 and 454 tok/s, interleaved) and 32 clients 7%. With the epilogues
//! (four kernels and a split fewer per layer), 8 clients ran 2% faster on a second H100 and 35%
//! on a third whose host was slower (its 32-client runs rose by 37% from first to last, so they
//! say nothing of it). At 29bb617 on an H200 it had made steps slower (B = 8: 11.9–12.7 ms with it, 10.8–11.7
//! without; `bench/results/2026-12-04-gpu-h200-kernels/`), and it stayed opt-in until this.
use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use super::cuda_kernel::{Constant, CudaKernel, switch};
use crate::Result;

mod source;
use source::{BODY, HEADER, REDUCE, SWIGLU, placeholders};

/// The most rows this kernel takes; above it cuBLAS costs less per row.
pub const MAX_ROWS: i32 = 16;

/// Threads per block: 8 warps, each over an eighth of the inner dimension.
const THREADS: i32 = 256;

/// Weight rows (outputs) per block: one MMA tile's 16.
const TILE_ROWS: i32 = 16;

/// Whether the engine's dense layers run the kernel (on by default; `MLXCEL_CUDA_FEW_ROWS=0`
/// leaves every matmul to MLX).
pub fn wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    switch(&WANTED, "MLXCEL_CUDA_FEW_ROWS", true)
}

/// Whether the kernel also takes the work after a projection (on by default;
/// `MLXCEL_CUDA_FUSED_EPILOGUES=0` runs those as MLX ops).
pub fn fuses() -> bool {
    static FUSES: OnceLock<bool> = OnceLock::new();
    switch(&FUSES, "MLXCEL_CUDA_FUSED_EPILOGUES", true)
}

/// Whether a decode step's RMS norms run inside the projection after them:
/// `MLXCEL_CUDA_FUSED_NORMS=1` (and the fused epilogues on); off, MLX's kernel norms. Correct on
/// an H100 (`tests/few_rows_cuda.rs`), but served 8 clients no faster there (600 and 604 tok/s
/// against 600 and 597 with the RoPE/KV kernel, `bench/results/2026-12-07-gpu-h100-norms-rope-kv`),
/// so opt-in.
pub fn fuses_norms() -> bool {
    static FUSES: OnceLock<bool> = OnceLock::new();
    switch(&FUSES, "MLXCEL_CUDA_FUSED_NORMS", false)
}

/// RMS norm over `x`'s last axis, as the kernel applies it before the product:
/// `x / sqrt(mean(x²) + eps) * weight`.
#[derive(Clone, Copy)]
pub struct RmsNorm<'a> {
    /// The norm's weight, `[in]`, in `x`'s dtype.
    pub weight: &'a Array,
    pub eps: f32,
}

impl RmsNorm<'_> {
    /// The norm alone, as MLX's op: where the kernel does not take it.
    pub fn apply(&self, x: &Array) -> Result<Array> {
        Ok(mlx_rs::fast::rms_norm(x, Some(self.weight), self.eps)?)
    }
}

/// What the kernel does with each output before storing it.
pub enum Epilogue<'a> {
    /// Stores it.
    Plain,
    /// Adds `r` (the residual stream, shaped as the output) to it: `r + x · Wᵀ`.
    Add(&'a Array),
    /// The weight is a gate's rows then an up projection's, as many each: stores
    /// `silu(gate) * up`, half as many outputs.
    SwiGlu,
}

/// The kernel of each [`Epilogue`], with or without an RMS norm of `x` first (its own inputs,
/// so its own source).
fn kernel(epilogue: &Epilogue, normed: bool) -> Option<&'static CudaKernel> {
    static KERNELS: [OnceLock<Option<CudaKernel>>; 6] = [const { OnceLock::new() }; 6];
    // Its slot, name, inputs, and how the reduction stores (None: the SwiGLU epilogue).
    let (slot, name, inputs, store): (_, _, &[&str], _) = match epilogue {
        Epilogue::Plain => (
            0,
            "mlxcel_few_rows",
            &["x", "w"],
            Some("static_cast<T>(sum)"),
        ),
        Epilogue::Add(_) => (
            1,
            "mlxcel_few_rows_add",
            &["x", "w", "r"],
            Some("static_cast<T>(static_cast<float>(r[at]) + sum)"),
        ),
        Epilogue::SwiGlu => (2, "mlxcel_few_rows_swiglu", &["x", "w"], None),
    };
    let make = || {
        let end = store.map_or_else(|| SWIGLU.to_string(), |s| REDUCE.replace("STORE", s));
        let source = placeholders(&format!("{BODY}{end}"), normed);
        let mut inputs = inputs.to_vec();
        let name = if normed {
            inputs.push("nw");
            format!("{name}_normed")
        } else {
            name.to_string()
        };
        CudaKernel::new(&name, &inputs, &["y"], &source, HEADER, true)
    };
    KERNELS[slot + 3 * usize::from(normed)]
        .get_or_init(make)
        .as_ref()
}

/// A dense weight `[out, in]` (row-major, evaluated, f16 or bf16, `in` a multiple of 8) kept
/// for [`CudaSkinny::forward`].
#[derive(Clone)]
pub struct CudaSkinny {
    w: Array,
    out: i32,
    inner: i32,
}

impl CudaSkinny {
    /// The kernel for `w`, if it reads it (a 2-D f16 or bf16 row-major weight whose rows are
    /// whole 16-byte loads). f32 stays with MLX (the tensor cores' f32 input is
    /// TF32, and a GPU placement computes in f16 anyway).
    pub fn new(w: &Array) -> Option<CudaSkinny> {
        let half = matches!(w.dtype(), Dtype::Float16 | Dtype::Bfloat16);
        if !half || w.ndim() != 2 || w.shape()[1] % 8 != 0 || w.eval().is_err() {
            return None;
        }
        let mut rows_contiguous = false;
        // SAFETY: `w` is a live, evaluated array; the call reads its flags.
        let read =
            unsafe { mlx_sys::_mlx_array_is_row_contiguous(&mut rows_contiguous, w.as_ptr()) };
        // A weight that is not row-major would be copied on every call: MLX's matmul keeps it.
        if read != 0 || !rows_contiguous {
            return None;
        }
        Some(CudaSkinny {
            w: w.clone(),
            out: w.shape()[0],
            inner: w.shape()[1],
        })
    }

    /// `x · Wᵀ` for `x` of shape `[..., in]` with 2 to [`MAX_ROWS`] rows, as a graph node (not
    /// evaluated); `None` where `x` does not fit (one row, more than [`MAX_ROWS`], another
    /// dtype): the caller then runs MLX's matmul.
    pub fn forward(&self, x: &Array) -> Result<Option<Array>> {
        self.forward_with(x, Epilogue::Plain)
    }

    /// [`CudaSkinny::forward`] with `epilogue`; `None` also where it does not fit (a residual
    /// of another shape or dtype, an odd row count for [`Epilogue::SwiGlu`]).
    pub fn forward_with(&self, x: &Array, epilogue: Epilogue) -> Result<Option<Array>> {
        self.run(x, None, epilogue)
    }

    /// [`CudaSkinny::forward_with`] of `norm` applied to `x`, in the same one kernel; `None`
    /// also where the norm's weight is not `[in]` in `x`'s dtype.
    pub fn forward_normed(
        &self,
        x: &Array,
        norm: RmsNorm,
        epilogue: Epilogue,
    ) -> Result<Option<Array>> {
        if norm.weight.shape() != [self.inner] || norm.weight.dtype() != x.dtype() {
            return Ok(None);
        }
        self.run(x, Some(norm), epilogue)
    }

    fn run(&self, x: &Array, norm: Option<RmsNorm>, epilogue: Epilogue) -> Result<Option<Array>> {
        let shape = x.shape();
        let Some((&last, lead)) = shape.split_last() else {
            return Ok(None);
        };
        let rows: i32 = lead.iter().product();
        if last != self.inner || !(2..=MAX_ROWS).contains(&rows) || x.dtype() != self.w.dtype() {
            return Ok(None);
        }
        let glu = matches!(epilogue, Epilogue::SwiGlu);
        let outputs = if glu { self.out / 2 } else { self.out };
        let mut out_shape = lead.to_vec();
        out_shape.push(outputs);
        let fits = match &epilogue {
            Epilogue::Plain => true,
            Epilogue::Add(r) => r.shape() == out_shape.as_slice() && r.dtype() == x.dtype(),
            Epilogue::SwiGlu => self.out % 2 == 0,
        };
        let Some(kernel) = kernel(&epilogue, norm.is_some()).filter(|_| fits) else {
            return Ok(None);
        };
        // Rows of `x` are the MMA's columns: 8 per tile, one or two tiles.
        let bucket = if rows <= 8 { 8 } else { MAX_ROWS };
        // A block's tile is 16 weight rows: 16 outputs, or 8 gate/up pairs.
        let per_block = if glu { TILE_ROWS / 2 } else { TILE_ROWS };
        let blocks = (outputs + per_block - 1) / per_block;
        let dtype = x.dtype();
        let mut inputs: Vec<&Array> = match &epilogue {
            Epilogue::Add(r) => vec![x, &self.w, r],
            _ => vec![x, &self.w],
        };
        let mut constants = vec![
            Constant::Type(c"T", dtype),
            Constant::Int(c"MB", bucket),
            Constant::Bool(c"BF", dtype == Dtype::Bfloat16),
            Constant::Bool(c"GLU", glu),
        ];
        if let Some(norm) = norm {
            inputs.push(norm.weight);
            // The bits of an f32, read back by `__int_as_float`.
            constants.push(Constant::Int(c"EPS", norm.eps.to_bits() as i32));
        }
        let mut y = kernel.apply(
            &inputs,
            &[(&out_shape, dtype)],
            [blocks * THREADS, 1, 1],
            [THREADS, 1, 1],
            &constants,
        )?;
        Ok(y.pop())
    }
}
