//! A decode step's attention on CUDA over rows of different lengths, without a mask.
//!
//! MLX's fused decode attention on CUDA (`sdpa_vector`) takes no mask array. A batch whose rows
//! have different lengths needs one (its keys are padded to the longest row), and with a mask
//! MLX falls back to plain ops: a scale, two cuBLAS matmuls, the mask's add and a softmax per
//! layer, ~20 µs of host time each. mlx_lm's batched decode pads and masks the same way. This
//! kernel reads each row's own length instead: one node per layer.
//!
//! One block per (row, KV head): its 8 warps take every 8th key, each lane `head_dim / 32`
//! dimensions; the `G` query heads that share the KV head are scored together (f32), with an
//! online softmax per warp, merged across warps by log-sum-exp in shared memory. A shared prefix
//! (one span every row reads first, in place) is read before the row's own keys.
//!
//! [`tables`] is the same body reading the keys where they lie in the pool, by block table,
//! which is how decode steps read them on CUDA; this one reads keys already gathered (a step
//! whose blocks lie in more slabs than that kernel takes).

use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use super::kernel::{Constant, CudaKernel};
use crate::Result;
use crate::kv::{BatchKeys, OwnKeys};

mod tables;

pub use tables::{SPLIT_FROM, attend_tables, parts, reads_tables};

const WARPS: i32 = 8;

/// The most `G × head_dim` (query heads per KV head times their width): the per-warp partial
/// outputs live in shared memory (`WARPS × G × D` floats, 32 KiB at the most).
const MOST_GROUP_WIDTH: i32 = 1024;

/// The body, around where a kernel says which keys row `b` reads (`first..n`, after `{LENGTH}`),
/// where key `t` of KV head `h` is (`kp`, `vp` and their element strides `kd`, `vd`, at
/// `{LOCATE}`), and what it writes of query head `h * G + g`'s dimension `d` once the warps'
/// softmax maxima (`mx`, base 2), sums (`den`) and weighted values (`num`) are merged
/// (`{FINISH}`). Template constants: `T`, `D`, `G`.
const BODY: &str = r#"
  constexpr int WARPS = 8;
  constexpr int PER = D / 32;
  const int h = blockIdx.x;
  const int b = blockIdx.y;
  const int kvh = gridDim.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
{LENGTH}
  const float fold = rsqrtf((float)D) * 1.4426950408889634f;
  const float neg_inf = __int_as_float(0xff800000);
  float qv[G][PER];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      qv[g][i] = static_cast<float>(q[b * q_strides[0] + (h * G + g) * q_strides[1] +
                                      (lane * PER + i) * q_strides[3]]) * fold;
    }
  }
  float m[G], l[G], acc[G][PER];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = neg_inf;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i) acc[g][i] = 0.f;
  }
  // Keys `t0`, `t0 + WARPS`, ...: UNROLL of them loaded before any is scored, so a warp has
  // that many reads in flight.
  constexpr int UNROLL = 4;
  for (int t0 = first + warp; t0 < n; t0 += WARPS * UNROLL) {
    float kf[UNROLL][PER], vf[UNROLL][PER];
#pragma unroll
    for (int step = 0; step < UNROLL; ++step) {
      const int t = t0 + step * WARPS;
      if (t < n) {
{LOCATE}
#pragma unroll
        for (int i = 0; i < PER; ++i) {
          kf[step][i] = static_cast<float>(kp[(lane * PER + i) * kd]);
          vf[step][i] = static_cast<float>(vp[(lane * PER + i) * vd]);
        }
      }
    }
#pragma unroll
    for (int step = 0; step < UNROLL; ++step) {
      if (t0 + step * WARPS >= n) break;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < PER; ++i) s += qv[g][i] * kf[step][i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float mn = fmaxf(m[g], s);
        const float c = exp2f(m[g] - mn);
        const float p = exp2f(s - mn);
        l[g] = l[g] * c + p;
#pragma unroll
        for (int i = 0; i < PER; ++i) acc[g][i] = acc[g][i] * c + p * vf[step][i];
        m[g] = mn;
      }
    }
  }
  __shared__ float sm[WARPS * G];
  __shared__ float sl[WARPS * G];
  __shared__ float sacc[WARPS * G * D];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      sm[warp * G + g] = m[g];
      sl[warp * G + g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) sacc[(warp * G + g) * D + lane * PER + i] = acc[g][i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * D; e += WARPS * 32) {
    const int g = e / D;
    const int d = e % D;
    float mx = neg_inf;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, sm[w * G + g]);
    float den = 0.f, num = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float mw = sm[w * G + g];
      const float f = mw == neg_inf ? 0.f : exp2f(mw - mx);
      den += sl[w * G + g] * f;
      num += sacc[(w * G + g) * D + d] * f;
    }
{FINISH}
  }
"#;

/// This kernel's inputs: `q` `[b, heads, 1, D]`, `k` / `v` `[b, kv_heads, keys, D]` (each row's
/// own keys, padded), `sk` / `sv` `[1, kv_heads, S, D]` (the shared prefix; any array when `S` is
/// 0), `lens` `[b + 1]` (row `i` reads its first `lens[i]` own keys; `lens[b]` is `S`).
const LENGTH: &str = r#"  const int first = 0;
  const int shared_n = lens[gridDim.y];
  const int n = shared_n + lens[b];
"#;

/// Key `t`: the shared prefix's first, then the row's own.
const LOCATE: &str = r#"    const T* kp;
    const T* vp;
    long long kd, vd;
    if (t < shared_n) {
      kp = sk + h * sk_strides[1] + t * sk_strides[2];
      vp = sv + h * sv_strides[1] + t * sv_strides[2];
      kd = sk_strides[3];
      vd = sv_strides[3];
    } else {
      const int u = t - shared_n;
      kp = k + b * k_strides[0] + h * k_strides[1] + u * k_strides[2];
      vp = v + b * v_strides[0] + h * v_strides[1] + u * v_strides[2];
      kd = k_strides[3];
      vd = v_strides[3];
    }
"#;

/// The attention itself, `o` `[b, 1, heads * D]`.
pub(super) const FINISH: &str =
    "    o[(size_t)b * (kvh * G * D) + (h * G + g) * D + d] = static_cast<T>(num / den);";

/// A body reading keys as `length` and `locate` say and writing what `finish` says (see
/// [`BODY`]).
pub(super) fn source(length: &str, locate: &str, finish: &str) -> String {
    BODY.replace("{LENGTH}", length)
        .replace("{LOCATE}", locate)
        .replace("{FINISH}", finish)
}

fn kernel() -> Option<&'static CudaKernel> {
    static KERNEL: OnceLock<Option<CudaKernel>> = OnceLock::new();
    let inputs = ["q", "k", "v", "sk", "sv", "lens"];
    let make = || {
        CudaKernel::new(
            "mlxcel_decode_attention",
            &inputs,
            &["o"],
            &source(LENGTH, LOCATE, FINISH),
            "",
            false,
        )
    };
    KERNEL.get_or_init(make).as_ref()
}

/// The kernel's lengths input for one step: each row's own keys (`own[i]`), then the shared
/// prefix's.
pub fn lengths(own: &[i32], shared: i32) -> Array {
    let mut v = own.to_vec();
    v.push(shared);
    Array::from_slice(&v, &[v.len() as i32])
}

/// Attention of `q` (`[b, heads, 1, head_dim]`) over `keys` (each row's own keys padded, rows
/// first or heads first, after at most one shared span) with `lengths` (see [`lengths`]) and the
/// scale `1 / sqrt(head_dim)`; `[b, 1, heads * head_dim]`. `None` where the kernel does not read
/// these inputs (own keys as spans, several shared spans, a head width that is not a multiple
/// of 32, too wide a group, mixed dtypes): the caller's attention runs.
pub fn attend_batch(
    q: &Array,
    keys: &BatchKeys,
    lengths: &Array,
    kv_heads: i32,
) -> Result<Option<Array>> {
    let (k, v) = match &keys.own {
        OwnKeys::RowsFirst(k, v) => (k.clone(), v.clone()),
        OwnKeys::Padded(k, v) => (k.swap_axes(0, 1)?, v.swap_axes(0, 1)?),
        OwnKeys::Spans(_) | OwnKeys::Tables(_) => return Ok(None),
    };
    let qs = q.shape();
    if qs.len() != 4 || qs[2] != 1 || kv_heads <= 0 || keys.shared.len() > 1 {
        return Ok(None);
    }
    let (b, heads, d) = (qs[0], qs[1], qs[3]);
    let group = heads / kv_heads;
    let dtype = q.dtype();
    let fits = heads % kv_heads == 0
        && d % 32 == 0
        && d <= 256
        && group * d <= MOST_GROUP_WIDTH
        && matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
        && k.dtype() == dtype
        && v.dtype() == dtype
        && k.shape() == [b, kv_heads, k.shape()[2], d]
        && lengths.shape() == [b + 1];
    if !fits {
        return Ok(None);
    }
    let Some(kernel) = kernel() else {
        return Ok(None);
    };
    let (sk, sv) = match keys.shared.first() {
        Some((sk, sv)) => (sk, sv),
        None => (&k, &v),
    };
    let mut out = kernel.apply(
        &[q, &k, &v, sk, sv, lengths],
        &[(&[b, 1, heads * d], dtype)],
        [kv_heads * WARPS * 32, b, 1],
        [WARPS * 32, 1, 1],
        &[
            Constant::Type(c"T", dtype),
            Constant::Int(c"D", d),
            Constant::Int(c"G", group),
        ],
    )?;
    Ok(out.pop())
}
