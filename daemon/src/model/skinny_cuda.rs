//! A matmul for few rows on CUDA (`y = x · Wᵀ` with `x` of 2–16 rows): a decode step's
//! projections, with what follows them where that is one more op ([`Epilogue`]: the residual
//! add after o and down, SwiGLU after the joined gate/up). On by default on CUDA;
//! `MLXCEL_CUDA_FEW_ROWS=0` leaves every matmul to MLX, `MLXCEL_CUDA_FUSED_EPILOGUES=0` keeps the
//! kernel but runs the epilogues as MLX ops.
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

/// The most rows this kernel takes; above it cuBLAS costs less per row.
pub const MAX_ROWS: i32 = 16;

/// Threads per block: 8 warps, each over an eighth of the inner dimension.
const THREADS: i32 = 256;

/// Weight rows (outputs) per block: one MMA tile's 16.
const TILE_ROWS: i32 = 16;

/// Loads and the tensor-core step, before the kernel (MLX puts `header` ahead of its namespace).
const HEADER: &str = r#"
// 8 consecutive 16-bit values at `p` (zeros unless `ok`), as one 16-byte load when aligned.
__device__ __forceinline__ uint4 mlxcel_load8(const unsigned short* p, bool ok, bool vec) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (!ok) return r;
  if (vec) return *reinterpret_cast<const uint4*>(p);
  r.x = p[0] | (unsigned(p[1]) << 16);
  r.y = p[2] | (unsigned(p[3]) << 16);
  r.z = p[4] | (unsigned(p[5]) << 16);
  r.w = p[6] | (unsigned(p[7]) << 16);
  return r;
}

// c += A (16 x 16, a0..a3) * B (16 x 8, b0 b1), f32 accumulators; bf16 or f16 inputs.
template <bool BF>
__device__ __forceinline__ void mlxcel_mma(float* c, unsigned a0, unsigned a1, unsigned a2,
                                           unsigned a3, unsigned b0, unsigned b1) {
  if (BF) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}
"#;

/// The kernel's body up to its epilogue; MLX writes its signature (`x`, its shape and rank, `w`,
/// its shape, `r` with [`Epilogue::Add`], `y`) and the template constants `T` (the dtype), `MB`
/// (8 or 16: rows of `x` as MMA columns), `BF` (bf16) and `GLU` (the weight is gate rows then
/// up rows, and a block's tile pairs gate row `j` with up row `j`). A block computes 16 weight
/// rows (16 outputs; 8 with `GLU`) for every row of `x`: its 8 warps each
/// run tensor-core MMAs (m16n8k16) over an eighth of the inner dimension, then sum through
/// shared memory. A lane loads 8 consecutive inputs of two weight rows and of one row of `x`;
/// the MMA's k-order is a permutation of the inputs, the same one for both sides, so the dot
/// products are unchanged. Weights are read once, nothing is converted.
const BODY: &str = r#"
  constexpr int WARPS = 8;
  constexpr int NB = MB / 8;
  const int K = w_shape[1];
  const int N = w_shape[0];
  // Outputs: one per weight row, or with GLU one per gate/up pair.
  const int NO = GLU ? N / 2 : N;
  int rows = 1;
  for (int i = 0; i + 1 < x_ndim; ++i) rows *= x_shape[i];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int n0 = blockIdx.x * (GLU ? 8 : 16);
  const bool vec = ((((size_t)w) | ((size_t)x)) & 15) == 0;
  const unsigned short* ws = reinterpret_cast<const unsigned short*>(w);
  const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
  const bool r0 = n0 + g < NO;
  const bool r1 = GLU ? r0 : n0 + g + 8 < N;
  const int second = GLU ? NO + n0 + g : n0 + g + 8;
  const unsigned short* w0 = ws + (size_t)(r0 ? n0 + g : 0) * K;
  const unsigned short* w1 = ws + (size_t)(r1 ? second : 0) * K;
  float c[NB][4];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
#pragma unroll
    for (int i = 0; i < 4; ++i) c[b][i] = 0.f;
  }
  // Every lane of a warp runs the same iterations (the MMA is warp-wide); a lane past the
  // inner dimension's end loads zeros.
#pragma unroll 4
  for (int kb = warp * 32; kb < K; kb += WARPS * 32) {
    const int k = kb + tig * 8;
    const bool in = k < K;
    const uint4 a = mlxcel_load8(w0 + k, r0 && in, vec);
    const uint4 a8 = mlxcel_load8(w1 + k, r1 && in, vec);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int m = b * 8 + g;
      const uint4 xq =
          mlxcel_load8(xs + (size_t)(m < rows ? m : 0) * K + k, m < rows && in, vec);
      mlxcel_mma<BF>(c[b], a.x, a8.x, a.y, a8.y, xq.x, xq.y);
      mlxcel_mma<BF>(c[b], a.z, a8.z, a.w, a8.w, xq.z, xq.w);
    }
  }
  __shared__ float part[WARPS * NB * 128];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
#pragma unroll
    for (int i = 0; i < 4; ++i) part[((warp * NB + b) * 32 + lane) * 4 + i] = c[b][i];
  }
  __syncthreads();
"#;

/// The plain and [`Epilogue::Add`] epilogues: each output, the warps' partial sums added, stored
/// as `STORE` says (the sum alone, or plus the residual `r`, `[rows, N]`, added in f32).
const REDUCE: &str = r#"
  for (int e = threadIdx.x; e < NB * 128; e += WARPS * 32) {
    float sum = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) sum += part[v * NB * 128 + e];
    const int b = e / 128;
    const int l = (e / 4) % 32;
    const int i = e % 4;
    const int n = n0 + (l >> 2) + (i >= 2 ? 8 : 0);
    const int m = b * 8 + (l & 3) * 2 + (i & 1);
    if (n < N && m < rows) {
      const size_t at = (size_t)m * N + n;
      y[at] = STORE;
    }
  }
"#;

/// [`Epilogue::SwiGlu`]: an accumulator's elements 0 and 1 are tile row `g` (a gate row), 2 and
/// 3 tile row `g + 8` (its up row) for the same two rows of `x`: each output is
/// `silu(gate) * up`, in f32.
const SWIGLU: &str = r#"
  for (int e = threadIdx.x; e < NB * 64; e += WARPS * 32) {
    const int b = e / 64;
    const int l = (e / 2) % 32;
    const int i = e % 2;
    const int at = (b * 32 + l) * 4 + i;
    float gate = 0.f, up = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) {
      gate += part[v * NB * 128 + at];
      up += part[v * NB * 128 + at + 2];
    }
    const int n = n0 + (l >> 2);
    const int m = b * 8 + (l & 3) * 2 + i;
    if (n < NO && m < rows) y[(size_t)m * NO + n] = static_cast<T>(gate / (1.f + __expf(-gate)) * up);
  }
"#;

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

/// The kernel of each [`Epilogue`] (its own inputs, so its own source).
fn kernel(epilogue: &Epilogue) -> Option<&'static CudaKernel> {
    static KERNELS: [OnceLock<Option<CudaKernel>>; 3] =
        [OnceLock::new(), OnceLock::new(), OnceLock::new()];
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
        self.forward_with(x, Epilogue::Plain)
    }

    /// [`CudaSkinny::forward`] with `epilogue`; `None` also where it does not fit (a residual
    /// of another shape or dtype, an odd row count for [`Epilogue::SwiGlu`]).
    pub fn forward_with(&self, x: &Array, epilogue: Epilogue) -> Result<Option<Array>> {
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
        let Some(kernel) = kernel(&epilogue).filter(|_| fits) else {
            return Ok(None);
        };
        // Rows of `x` are the MMA's columns: 8 per tile, one or two tiles.
        let bucket = if rows <= 8 { 8 } else { MAX_ROWS };
        // A block's tile is 16 weight rows: 16 outputs, or 8 gate/up pairs.
        let per_block = if glu { TILE_ROWS / 2 } else { TILE_ROWS };
        let blocks = (outputs + per_block - 1) / per_block;
        let dtype = x.dtype();
        let inputs: Vec<&Array> = match &epilogue {
            Epilogue::Add(r) => vec![x, &self.w, r],
            _ => vec![x, &self.w],
        };
        let mut y = kernel.apply(
            &inputs,
            &[(&out_shape, dtype)],
            [blocks * THREADS, 1, 1],
            [THREADS, 1, 1],
            &[
                Constant::Type(c"T", dtype),
                Constant::Int(c"MB", bucket),
                Constant::Bool(c"BF", dtype == Dtype::Bfloat16),
                Constant::Bool(c"GLU", glu),
            ],
        )?;
        Ok(y.pop())
    }
}
