//! A matmul for few rows on CUDA (`y = x · Wᵀ` with `x` of 2–16 rows): the decode step's linear
//! layers at batch sizes above one.
//!
//! MLX's CUDA backend runs a one-row matmul through its own gemv kernel (~5 µs of host time per
//! call) but sends every matmul of 2 rows or more to cuBLAS, ~20 µs of host time per call.
//! Measured on an H200 (`bench/results/2026-12-04-gpu-h200-joined/`): 224 chained
//! `[M, 4096] × [4096, 4096]` f16 matmuls took the host 1.0–1.5 ms to encode at M = 1 and
//! 4–6 ms at M = 2..8, and a decode step at 8 rows is host-bound. This kernel is the gemv's
//! shape widened to a few rows: one warp per weight row, 16-byte loads, every row of `x`
//! multiplied while the weight's slice is in registers, f32 accumulators, one warp reduction per
//! output. It is an MLX custom kernel (`mlx_fast_cuda_kernel`), compiled once per dtype and row
//! bucket by NVRTC. One row stays with MLX's gemv; Metal and the CPU never come here.
//! `MLXCEL_CUDA_FEW_ROWS=0` turns it off, for A/B runs.

use std::ffi::CString;
use std::sync::OnceLock;

use mlx_rs::{Array, Dtype, Stream};

use crate::{EngineError, Result};

/// The most rows this kernel takes; above it cuBLAS costs less per row.
pub const MAX_ROWS: i32 = 16;

/// Output rows (weight rows) per thread block: one warp each.
const WARPS: i32 = 8;

/// The kernel's body; MLX writes its signature (`x`, its shape and rank, `w`, its shape, `y`)
/// and the template constants `T` (the dtype) and `MB` (the most rows, a compile-time bound).
const SOURCE: &str = r#"
  const int K = w_shape[1];
  const int N = w_shape[0];
  int rows = 1;
  for (int i = 0; i + 1 < x_ndim; ++i) rows *= x_shape[i];
  const int lane = threadIdx.x;
  const int n = blockIdx.y * blockDim.y + threadIdx.y;
  if (n >= N) return;
  constexpr int V = 16 / sizeof(T);
  const T* wr = w + (size_t)n * K;
  float acc[MB];
#pragma unroll
  for (int m = 0; m < MB; ++m) acc[m] = 0.f;
  const bool vec = ((((size_t)wr) | ((size_t)x)) & 15) == 0 && (K % V) == 0;
  if (vec) {
#pragma unroll 2
    for (int k = lane * V; k < K; k += 32 * V) {
      uint4 wq = *reinterpret_cast<const uint4*>(wr + k);
      const T* wv = reinterpret_cast<const T*>(&wq);
      float wf[V];
#pragma unroll
      for (int j = 0; j < V; ++j) wf[j] = static_cast<float>(wv[j]);
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        if (m < rows) {
          uint4 xq = *reinterpret_cast<const uint4*>(x + (size_t)m * K + k);
          const T* xv = reinterpret_cast<const T*>(&xq);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[m] += wf[j] * static_cast<float>(xv[j]);
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
      const float wk = static_cast<float>(wr[k]);
#pragma unroll
      for (int m = 0; m < MB; ++m) {
        if (m < rows) acc[m] += wk * static_cast<float>(x[(size_t)m * K + k]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MB; ++m) {
    float s = acc[m];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == m && m < rows) y[(size_t)m * N + n] = static_cast<T>(s);
  }
"#;

/// The compiled-on-first-use kernel object (MLX keeps the NVRTC modules).
struct Kernel(mlx_sys::mlx_fast_cuda_kernel);

// SAFETY: the handle is an immutable MLX kernel description (a name, a source, argument names);
// applying it builds a new graph node and touches no shared state of the handle.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

/// Whether the kernel is wanted: yes, unless `MLXCEL_CUDA_FEW_ROWS=0`.
pub fn wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    *WANTED.get_or_init(|| std::env::var("MLXCEL_CUDA_FEW_ROWS").as_deref() != Ok("0"))
}

fn kernel() -> Option<&'static Kernel> {
    static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            let names = |list: &[&str]| -> Option<mlx_sys::mlx_vector_string> {
                // SAFETY: a new, empty vector; each appended string is copied by mlx-c.
                unsafe {
                    let v = mlx_sys::mlx_vector_string_new();
                    for s in list {
                        let c = CString::new(*s).ok()?;
                        if mlx_sys::mlx_vector_string_append_value(v, c.as_ptr()) != 0 {
                            return None;
                        }
                    }
                    Some(v)
                }
            };
            let (inputs, outputs) = (names(&["x", "w"])?, names(&["y"])?);
            let (name, source, header) = (
                CString::new("mlxcel_few_rows").ok()?,
                CString::new(SOURCE).ok()?,
                CString::new("").ok()?,
            );
            // SAFETY: all pointers are valid C strings and vectors for the call's duration; mlx-c
            // copies what it keeps.
            let k = unsafe {
                let k = mlx_sys::mlx_fast_cuda_kernel_new(
                    name.as_ptr(),
                    inputs,
                    outputs,
                    source.as_ptr(),
                    header.as_ptr(),
                    true,
                    0,
                );
                mlx_sys::mlx_vector_string_free(inputs);
                mlx_sys::mlx_vector_string_free(outputs);
                k
            };
            (!k.ctx.is_null()).then_some(Kernel(k))
        })
        .as_ref()
}

/// A dense weight `[out, in]` (row-major, evaluated, f16/bf16/f32) kept for
/// [`CudaSkinny::forward`].
#[derive(Clone)]
pub struct CudaSkinny {
    w: Array,
    out: i32,
    inner: i32,
}

impl CudaSkinny {
    /// The kernel for `w` (evaluated), if it reads it (a 2-D floating row-major weight) and is
    /// wanted.
    pub fn new(w: &Array) -> Option<CudaSkinny> {
        let float = matches!(w.dtype(), Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32);
        let mut rows_contiguous = false;
        // SAFETY: `w` is a live, evaluated array; the call reads its flags.
        let read =
            unsafe { mlx_sys::_mlx_array_is_row_contiguous(&mut rows_contiguous, w.as_ptr()) };
        // A weight that is not row-major would be copied on every call: MLX's matmul keeps it.
        if !wanted() || !float || w.ndim() != 2 || read != 0 || !rows_contiguous {
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
        let shape = x.shape();
        let Some((&last, lead)) = shape.split_last() else {
            return Ok(None);
        };
        let rows: i32 = lead.iter().product();
        if last != self.inner || !(2..=MAX_ROWS).contains(&rows) || x.dtype() != self.w.dtype() {
            return Ok(None);
        }
        let Some(kernel) = kernel() else {
            return Ok(None);
        };
        let bucket = if rows <= 4 {
            4
        } else if rows <= 8 {
            8
        } else {
            MAX_ROWS
        };
        let mut out_shape = lead.to_vec();
        out_shape.push(self.out);
        let stream = Stream::new();
        // SAFETY: every handle passed is live for the call (the arrays borrowed, the config and
        // vectors created here and freed below); the output is read only on success.
        unsafe {
            let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
            let dtype = x.dtype() as mlx_sys::mlx_dtype;
            let ok = mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                config,
                out_shape.as_ptr(),
                out_shape.len(),
                dtype,
            ) == 0
                && mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, 32, self.out, 1) == 0
                && mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(config, 32, WARPS, 1) == 0
                && mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                    config,
                    c"T".as_ptr(),
                    dtype,
                ) == 0
                && mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                    config,
                    c"MB".as_ptr(),
                    bucket,
                ) == 0;
            let inputs = [x.as_ptr(), self.w.as_ptr()];
            let inputs = mlx_sys::mlx_vector_array_new_data(inputs.as_ptr(), inputs.len());
            let mut outputs = mlx_sys::mlx_vector_array_new();
            let applied = ok
                && mlx_sys::mlx_fast_cuda_kernel_apply(
                    &mut outputs,
                    kernel.0,
                    inputs,
                    config,
                    stream.as_ptr(),
                ) == 0;
            let mut y = mlx_sys::mlx_array_new();
            let got = applied && mlx_sys::mlx_vector_array_get(&mut y, outputs, 0) == 0;
            mlx_sys::mlx_vector_array_free(inputs);
            mlx_sys::mlx_vector_array_free(outputs);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            if got {
                Ok(Some(Array::from_ptr(y)))
            } else {
                mlx_sys::mlx_array_free(y);
                Err(EngineError::Internal(
                    "the few-row CUDA matmul could not be built (see MLX's log)".into(),
                ))
            }
        }
    }
}
