//! The few-row kernel's CUDA C, in parts that `super::kernel` puts together per epilogue.

/// Loads and the tensor-core step, before the kernel (MLX puts `header` ahead of its namespace).
pub(super) const HEADER: &str = r#"
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
pub(super) const BODY: &str = r#"
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
    uint4 a = mlxcel_load8(w0 + k, r0 && in, vec);
    uint4 a8 = mlxcel_load8(w1 + k, r1 && in, vec);
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
pub(super) const REDUCE: &str = r#"
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
pub(super) const SWIGLU: &str = r#"
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
    if (n < NO && m < rows) {
      y[(size_t)m * NO + n] = static_cast<T>(gate / (1.f + __expf(-gate)) * up);
    }
  }
"#;
