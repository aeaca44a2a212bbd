//! The few-row kernel's CUDA C, in parts that `super::kernel` puts together per epilogue, with
//! placeholders (`NORM_*`, `ROW_SCALE`) that a normed kernel fills and the others leave empty.

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

// The 16-bit value in `u`'s low half, of type T, as f32; and f32 rounded to T, as 16 bits.
template <typename T>
__device__ __forceinline__ float mlxcel_f32(unsigned u) {
  const unsigned short h = static_cast<unsigned short>(u & 0xffffu);
  return static_cast<float>(*reinterpret_cast<const T*>(&h));
}
template <typename T>
__device__ __forceinline__ unsigned mlxcel_bits(float f) {
  const T t = static_cast<T>(f);
  return *reinterpret_cast<const unsigned short*>(&t);
}

// Two packed T values times two others, each product rounded to T.
template <typename T>
__device__ __forceinline__ unsigned mlxcel_mul2(unsigned a, unsigned b) {
  return mlxcel_bits<T>(mlxcel_f32<T>(a) * mlxcel_f32<T>(b)) |
         (mlxcel_bits<T>(mlxcel_f32<T>(a >> 16) * mlxcel_f32<T>(b >> 16)) << 16);
}

// 8 packed T values (a weight row's) times the norm's weights at the same inputs.
template <typename T>
__device__ __forceinline__ uint4 mlxcel_scale8(uint4 a, uint4 n) {
  return make_uint4(mlxcel_mul2<T>(a.x, n.x), mlxcel_mul2<T>(a.y, n.y),
                    mlxcel_mul2<T>(a.z, n.z), mlxcel_mul2<T>(a.w, n.w));
}

// Adds the squares of 8 packed T values (a row of x's) to `s`, in f32.
template <typename T>
__device__ __forceinline__ void mlxcel_squares(uint4 a, float& s) {
  const unsigned v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = mlxcel_f32<T>(v[i]), hi = mlxcel_f32<T>(v[i] >> 16);
    s += lo * lo + hi * hi;
  }
}

// RMS norm's factor for row `m`: the warps' sums of its squares (`ssp`, 16 rows a warp) over
// `k` inputs.
__device__ __forceinline__ float mlxcel_rms(const float* ssp, int warps, int m, int k, float eps) {
  float s = 0.f;
  for (int v = 0; v < warps; ++v) s += ssp[v * 16 + m];
  return rsqrtf(s / k + eps);
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
  const bool vec = ((((size_t)w) | ((size_t)x) NORM_ALIGN) & 15) == 0;
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
NORM_DECL
  // Every lane of a warp runs the same iterations (the MMA is warp-wide); a lane past the
  // inner dimension's end loads zeros.
#pragma unroll 4
  for (int kb = warp * 32; kb < K; kb += WARPS * 32) {
    const int k = kb + tig * 8;
    const bool in = k < K;
    uint4 a = mlxcel_load8(w0 + k, r0 && in, vec);
    uint4 a8 = mlxcel_load8(w1 + k, r1 && in, vec);
NORM_W
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int m = b * 8 + g;
      const uint4 xq =
          mlxcel_load8(xs + (size_t)(m < rows ? m : 0) * K + k, m < rows && in, vec);
NORM_X
      mlxcel_mma<BF>(c[b], a.x, a8.x, a.y, a8.y, xq.x, xq.y);
      mlxcel_mma<BF>(c[b], a.z, a8.z, a.w, a8.w, xq.z, xq.w);
    }
  }
NORM_SAVE
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
      ROW_SCALE
      sum *= rs;
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
      ROW_SCALE
      gate *= rs;
      up *= rs;
      y[(size_t)m * NO + n] = static_cast<T>(gate / (1.f + __expf(-gate)) * up);
    }
  }
"#;

/// The placeholders' text: empty (and a factor of one) for a plain kernel; for one that applies
/// RMS norm to `x` first (its weight `nw`, `EPS` an f32's bits), the norm's weight folded into
/// each weight row as it is loaded (`W · diag(nw)`, rounded to T), the squares of `x`'s rows
/// summed from the same loads, and each output scaled by its row's `1 / rms`:
/// `rms_norm(x) · Wᵀ = (x · (W · diag(nw))ᵀ) / rms(x)`. `x` is the residual stream as it is;
/// nothing is rounded at its normed size.
pub(super) fn placeholders(source: &str, normed: bool) -> String {
    let parts: [(&str, &str); 6] = if normed {
        [
            ("NORM_ALIGN", "| ((size_t)nw)"),
            (
                "NORM_DECL",
                "  const unsigned short* ns = reinterpret_cast<const unsigned short*>(nw);\n  \
                 float ss[NB];\n#pragma unroll\n  for (int b = 0; b < NB; ++b) ss[b] = 0.f;",
            ),
            (
                "NORM_W",
                "    {\n      const uint4 nq = mlxcel_load8(ns + k, in, vec);\n      \
                 a = mlxcel_scale8<T>(a, nq);\n      a8 = mlxcel_scale8<T>(a8, nq);\n    }",
            ),
            ("NORM_X", "      mlxcel_squares<T>(xq, ss[b]);"),
            (
                "NORM_SAVE",
                "  __shared__ float ssp[WARPS * 16];\n#pragma unroll\n  \
                 for (int b = 0; b < NB; ++b) {\n    float s = ss[b];\n    \
                 s += __shfl_xor_sync(0xffffffffu, s, 1);\n    \
                 s += __shfl_xor_sync(0xffffffffu, s, 2);\n    \
                 if (tig == 0) ssp[warp * 16 + b * 8 + g] = s;\n  }",
            ),
            (
                "ROW_SCALE",
                "const float rs = mlxcel_rms(ssp, WARPS, m, K, __int_as_float(EPS));",
            ),
        ]
    } else {
        [
            ("NORM_ALIGN", ""),
            ("NORM_DECL", ""),
            ("NORM_W", ""),
            ("NORM_X", ""),
            ("NORM_SAVE", ""),
            ("ROW_SCALE", "const float rs = 1.f;"),
        ]
    };
    parts
        .iter()
        .fold(source.to_string(), |s, (from, to)| s.replace(from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_and_only_a_normed_kernel_reads_the_norm() {
        for body in [
            REDUCE.replace("STORE", "static_cast<T>(sum)"),
            SWIGLU.to_string(),
        ] {
            for normed in [false, true] {
                let source = placeholders(&format!("{BODY}{body}"), normed);
                assert!(!source.contains("NORM_") && !source.contains("ROW_SCALE"));
                assert_eq!(source.contains("nw"), normed);
                assert_eq!(source.contains("EPS"), normed);
                if normed && std::env::var_os("MLXCEL_PRINT_KERNEL").is_some() {
                    println!("{source}");
                }
            }
        }
    }
}
