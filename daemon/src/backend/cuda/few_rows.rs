//! A matmul for few rows on CUDA (`y = x · Wᵀ` with `x` of 2–16 rows): a decode step's
//! projections, with what follows them where that is one more op ([`Epilogue`]: the residual
//! add after o and down, SwiGLU after the joined gate/up).
//!
//! Why: MLX's CUDA backend runs a one-row matmul through its own gemv kernel but sends every
//! matmul of 2 rows or more to cuBLAS, at ~20 µs of host time per call, and a served decode step
//! on a GPU is bound by the host's encoding. This kernel never reaches cuBLAS: a block of 8 warps
//! computes 16 outputs with tensor-core MMAs (m16n8k16, f16 or bf16 in, f32 accumulators), each
//! warp over an eighth of the inner dimension, summed in shared memory; weights are read once and
//! nothing is converted. It is an MLX custom kernel (`cuda_kernel`), compiled by NVRTC once per
//! dtype, tile count and epilogue. Measurements: `docs/gpu.md`.
use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use super::super::{Epilogue, FewRows};
use super::kernel::{Constant, CudaKernel};
use crate::Result;

mod source;
use source::{BODY, HEADER, REDUCE, SWIGLU};

/// The most rows this kernel takes; above it cuBLAS costs less per row.
pub const MAX_ROWS: i32 = 16;

/// Threads per block: 8 warps, each over an eighth of the inner dimension.
const THREADS: i32 = 256;

/// Weight rows (outputs) per block: one MMA tile's 16.
const TILE_ROWS: i32 = 16;

/// The kernel of each [`Epilogue`].
fn kernel(epilogue: &Epilogue) -> Option<&'static CudaKernel> {
    static KERNELS: [OnceLock<Option<CudaKernel>>; 3] = [const { OnceLock::new() }; 3];
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
        let source = format!("{BODY}{end}");
        CudaKernel::new(name, inputs, &["y"], &source, HEADER, true)
    };
    KERNELS[slot].get_or_init(make).as_ref()
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
        self.forward_with(x, &Epilogue::Plain)
    }

    /// [`CudaSkinny::forward`] with `epilogue`; `None` also where it does not fit (a residual
    /// of another shape or dtype, an odd row count for [`Epilogue::SwiGlu`]).
    pub fn forward_with(&self, x: &Array, epilogue: &Epilogue) -> Result<Option<Array>> {
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
        let fits = match epilogue {
            Epilogue::Plain => true,
            Epilogue::Add(r) => r.shape() == out_shape.as_slice() && r.dtype() == x.dtype(),
            Epilogue::SwiGlu => self.out % 2 == 0,
        };
        let Some(kernel) = kernel(epilogue).filter(|_| fits) else {
            return Ok(None);
        };
        // Rows of `x` are the MMA's columns: 8 per tile, one or two tiles.
        let bucket = if rows <= 8 { 8 } else { MAX_ROWS };
        // A block's tile is 16 weight rows: 16 outputs, or 8 gate/up pairs.
        let per_block = if glu { TILE_ROWS / 2 } else { TILE_ROWS };
        let blocks = (outputs + per_block - 1) / per_block;
        let dtype = x.dtype();
        let inputs: Vec<&Array> = match epilogue {
            Epilogue::Add(r) => vec![x, &self.w, r],
            _ => vec![x, &self.w],
        };
        let constants = [
            Constant::Type(c"T", dtype),
            Constant::Int(c"MB", bucket),
            Constant::Bool(c"BF", dtype == Dtype::Bfloat16),
            Constant::Bool(c"GLU", glu),
        ];
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

impl FewRows for CudaSkinny {
    fn forward(&self, x: &Array, epilogue: &Epilogue) -> Result<Option<Array>> {
        self.forward_with(x, epilogue)
    }
}
