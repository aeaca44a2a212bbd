//! A decode step's RoPE and K/V packing on CUDA in one kernel: from the projections' q, k and v
//! (`[b, 1, n * head_dim]` each, views of the joined output as they are), the rotated queries
//! `[b, heads, 1, head_dim]` and the new K/V rows as the pool writes them, `[2 * kv_heads, b,
//! head_dim]` (rotated K heads, then V heads). MLX runs this as one RoPE over q and k and a
//! concatenation of k and v (a copy per input): three kernels a layer for the host to encode
//! where this is one, and a decode step on a GPU is bound by the host.
//!
//! The rotation is MLX's own (`mlx/backend/cuda/rope.cu`): `inv_freq = exp2(-(i / (d/2)) *
//! log2(theta))`, the angle `offset * inv_freq`, f32 `cos`/`sin`, the result rounded to `T`; so
//! the values match `fast::rope` with per-row offsets (`tests/rope_kv_cuda.rs`, passed on an
//! H100); `make test` compiles it (`kernel_sources`). Opt-in (`MLXCEL_CUDA_ROPE_KV=1`): with the
//! fused norms it served 8 clients no faster on that H100 (600 and 604 tok/s against 600 and
//! 597, `bench/results/2026-12-07-gpu-h100-norms-rope-kv`): the step there is no longer bound
//! by the kernels the host encodes.

use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use super::cuda_kernel::{Constant, CudaKernel, switch};
use crate::Result;

/// Whether decode steps on CUDA rotate and pack in this kernel: `MLXCEL_CUDA_ROPE_KV=1`
/// (default off).
pub fn wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    switch(&WANTED, "MLXCEL_CUDA_ROPE_KV", false)
}

const THREADS: i32 = 256;

/// One thread per rotated pair (or copied pair of V): `b * (H + 2 * KVH) * D / 2` of them.
/// `TRAD`: pairs are neighbours (`2i`, `2i + 1`), else halves (`i`, `i + D/2`).
const SOURCE: &str = r#"
  constexpr int HALF = D / 2;
  constexpr int N = H + 2 * KVH;
  const int b_rows = offs_shape[0];
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (size_t)b_rows * N * HALF) return;
  const int i = idx % HALF;
  const int head = (idx / HALF) % N;
  const int b = idx / ((size_t)HALF * N);
  const int i1 = TRAD ? 2 * i : i;
  const int i2 = TRAD ? 2 * i + 1 : i + HALF;
  const T* src;
  if (head < H) {
    src = xq + b * xq_strides[0] + (size_t)head * D * xq_strides[2];
  } else if (head < H + KVH) {
    src = xk + b * xk_strides[0] + (size_t)(head - H) * D * xk_strides[2];
  } else {
    src = xv + b * xv_strides[0] + (size_t)(head - H - KVH) * D * xv_strides[2];
  }
  const int64_t e = head < H ? xq_strides[2] : head < H + KVH ? xk_strides[2] : xv_strides[2];
  T r1 = src[i1 * e];
  T r2 = src[i2 * e];
  if (head < H + KVH) {
    const float base = __int_as_float(BASE);
    float d = static_cast<float>(i) / static_cast<float>(HALF);
    float inv_freq = exp2(-d * base);
    float theta = static_cast<float>(offs[b]) * inv_freq;
    float c = cos(theta);
    float s = sin(theta);
    float x1 = static_cast<float>(r1);
    float x2 = static_cast<float>(r2);
    r1 = static_cast<T>(x1 * c - x2 * s);
    r2 = static_cast<T>(x1 * s + x2 * c);
  }
  T* dst = head < H ? q + ((size_t)b * H + head) * D
                    : kv + ((size_t)(head - H) * b_rows + b) * D;
  dst[i1] = r1;
  dst[i2] = r2;
"#;

fn kernel() -> Option<&'static CudaKernel> {
    static KERNEL: OnceLock<Option<CudaKernel>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            let inputs = ["xq", "xk", "xv", "offs"];
            CudaKernel::new("mlxcel_rope_kv", &inputs, &["q", "kv"], SOURCE, "", false)
        })
        .as_ref()
}

/// The heads' geometry and RoPE's settings.
#[derive(Clone, Copy)]
pub struct RopeKv {
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub theta: f32,
    pub traditional: bool,
}

impl RopeKv {
    /// `(q, kv)`: `q` rotated, `[b, heads, 1, head_dim]`; `kv` the rotated k heads then the v
    /// heads, `[2 * kv_heads, b, head_dim]`; each row `r` at position `offsets[r]` (`[b]`,
    /// i32). `None` where the kernel does not take these inputs (another shape or dtype, more
    /// than one position per row): the caller rotates with MLX.
    pub fn apply(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        offsets: &Array,
    ) -> Result<Option<(Array, Array)>> {
        let (h, kvh, d) = (self.heads, self.kv_heads, self.head_dim);
        let b = q.shape().first().copied().unwrap_or(0);
        let dtype = q.dtype();
        let fits = b > 0
            && d % 2 == 0
            && matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
            && q.shape() == [b, 1, h * d]
            && k.shape() == [b, 1, kvh * d]
            && v.shape() == [b, 1, kvh * d]
            && k.dtype() == dtype
            && v.dtype() == dtype
            && offsets.shape() == [b]
            && offsets.dtype() == Dtype::Int32;
        let Some(kernel) = kernel().filter(|_| fits) else {
            return Ok(None);
        };
        let pairs = b * (h + 2 * kvh) * (d / 2);
        let blocks = (pairs + THREADS - 1) / THREADS;
        let mut out = kernel.apply(
            &[q, k, v, offsets],
            &[(&[b, h, 1, d], dtype), (&[2 * kvh, b, d], dtype)],
            [blocks * THREADS, 1, 1],
            [THREADS, 1, 1],
            &[
                Constant::Type(c"T", dtype),
                Constant::Int(c"H", h),
                Constant::Int(c"KVH", kvh),
                Constant::Int(c"D", d),
                Constant::Bool(c"TRAD", self.traditional),
                // log2(theta) as MLX passes it, as the bits of an f32.
                Constant::Int(c"BASE", self.theta.log2().to_bits() as i32),
            ],
        )?;
        let kv = out.pop();
        Ok(out.pop().zip(kv))
    }
}
