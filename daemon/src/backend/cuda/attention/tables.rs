//! The decode attention kernel reading K/V where they lie in the pool, by block table
//! ([`TableKeys`]): the body of [`super::source`], with each key found through its row's table
//! and the slab it names. Rows of any lengths, no mask, no gather.
//!
//! One block per (KV head, row) leaves most of a GPU idle when rows are few and long (one row
//! of 4k keys: 8 blocks on 132 SMs). There each row's keys are split into parts, one block
//! each, and a second kernel merges the parts by log-sum-exp ([`parts`] decides; short rows,
//! or enough of them, take one pass).

use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use super::super::kernel::{Constant, CudaKernel};
use super::{FINISH, MOST_GROUP_WIDTH, WARPS, source};
use crate::kv::{MOST_TABLE_SLABS, TableKeys};
use crate::{EngineError, Result};

/// Row `b` reads its first `lens[b]` keys: all of them, or part `blockIdx.z` of `gridDim.z`.
const LENGTH: &str = r#"  const int len = lens[b];
  const int per = (len + gridDim.z - 1) / gridDim.z;
  const int first = blockIdx.z * per;
  const int n = min(len, first + per);
"#;

/// Key `t` of row `b`: block `t / BT` of its table names a slab (one of `s0..s3`) and a block
/// in it; a slab's layer is `[2, kv_heads, slab_blocks, BT, D]` (K then V), row-major.
const LOCATE: &str = r#"    const int entry = tables[b * tables_shape[1] + t / BT];
    const int si = entry >> 24;
    const long long sb = slab_blocks[si];
    const long long blk = entry & 0xffffff;
    const T* base = si == 0 ? s0 : si == 1 ? s1 : si == 2 ? s2 : s3;
    const long long at = t % BT;
    const T* kp = base + (((long long)h * sb + blk) * BT + at) * D;
    const T* vp = base + (((long long)(kvh + h) * sb + blk) * BT + at) * D;
    const long long kd = 1, vd = 1;
"#;

/// A part's result, f32: `po` `[b, heads, parts, D]` (its attention), `pm` and `pl` `[b,
/// heads, parts]` (its softmax maximum, base 2, and sum; `-inf` and 0 for an empty part).
const PART: &str = r#"    const size_t r = ((size_t)b * (kvh * G) + h * G + g) * gridDim.z + blockIdx.z;
    po[r * D + d] = den > 0.f ? num / den : 0.f;
    if (d == 0) {
      pm[r] = mx;
      pl[r] = den;
    }"#;

/// Merges the parts: one block per (head, row), a thread per dimension.
const MERGE: &str = r#"
  const int hh = blockIdx.x;
  const int d = threadIdx.x;
  const int b = blockIdx.y;
  const int parts = pm_shape[2];
  const float neg_inf = __int_as_float(0xff800000);
  const size_t r0 = ((size_t)b * gridDim.x + hh) * parts;
  float mx = neg_inf;
  for (int p = 0; p < parts; ++p) mx = fmaxf(mx, pm[r0 + p]);
  float den = 0.f, num = 0.f;
  for (int p = 0; p < parts; ++p) {
    const float m = pm[r0 + p];
    const float w = m == neg_inf ? 0.f : pl[r0 + p] * exp2f(m - mx);
    den += w;
    num += w * po[(r0 + p) * D + d];
  }
  o[((size_t)b * gridDim.x + hh) * D + d] = static_cast<T>(num / den);
"#;

const INPUTS: [&str; 4 + MOST_TABLE_SLABS] =
    ["q", "s0", "s1", "s2", "s3", "slab_blocks", "tables", "lens"];

/// Rows shorter than this take one pass (a split costs a second node per layer); a part reads
/// at least [`PART_KEYS`] keys of the longest row; [`BUSY_BLOCKS`] blocks (of [`WARPS`] warps)
/// keep a GPU busy (two per SM of an H100 or H200).
pub const SPLIT_FROM: i32 = 1024;
const PART_KEYS: i32 = 256;
const BUSY_BLOCKS: i32 = 264;

/// Parts each row's keys are split into: 1 (one pass) for rows shorter than [`SPLIT_FROM`]
/// or enough of them to fill the GPU; else as many as fill it, each at least [`PART_KEYS`]
/// keys of the longest row.
pub fn parts(rows: i32, kv_heads: i32, longest: i32) -> i32 {
    let blocks = (rows * kv_heads).max(1);
    if blocks >= BUSY_BLOCKS || longest < SPLIT_FROM {
        return 1;
    }
    ((BUSY_BLOCKS + blocks - 1) / blocks)
        .min(longest / PART_KEYS)
        .max(1)
}

/// The one-pass kernel, the parts kernel and the merge.
struct Kernels {
    whole: CudaKernel,
    part: CudaKernel,
    merge: CudaKernel,
}

fn kernels() -> Option<&'static Kernels> {
    static KERNELS: OnceLock<Option<Kernels>> = OnceLock::new();
    let make = || {
        let whole = source(LENGTH, LOCATE, FINISH);
        let part = source(LENGTH, LOCATE, PART);
        Some(Kernels {
            whole: CudaKernel::new("mlxcel_table_attention", &INPUTS, &["o"], &whole, "", false)?,
            part: CudaKernel::new(
                "mlxcel_table_attention_part",
                &INPUTS,
                &["po", "pm", "pl"],
                &part,
                "",
                false,
            )?,
            merge: CudaKernel::new(
                "mlxcel_attention_merge",
                &["po", "pm", "pl"],
                &["o"],
                MERGE,
                "",
                true,
            )?,
        })
    };
    KERNELS.get_or_init(make).as_ref()
}

/// Whether [`attend_tables`] takes queries of `heads` heads over `kv_heads` KV heads of width
/// `head_dim` in `dtype`.
pub fn reads_tables(heads: i32, kv_heads: i32, head_dim: i32, dtype: Dtype) -> bool {
    kv_heads > 0
        && heads % kv_heads == 0
        && head_dim % 32 == 0
        && head_dim <= 256
        && (heads / kv_heads) * head_dim <= MOST_GROUP_WIDTH
        && matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
        && kernels().is_some()
}

/// Attention of `q` (`[b, heads, 1, head_dim]`) over `keys` with the scale `1 / sqrt(head_dim)`;
/// `[b, 1, heads * head_dim]`. The caller checked [`reads_tables`]; inputs of other shapes or
/// dtypes are an error.
pub fn attend_tables(q: &Array, keys: &TableKeys, kv_heads: i32) -> Result<Array> {
    let qs = q.shape();
    let bad = |what: &str| EngineError::Internal(format!("table attention: {what}"));
    if qs.len() != 4 || qs[2] != 1 {
        return Err(bad("queries are not one position per row"));
    }
    let (b, heads, d) = (qs[0], qs[1], qs[3]);
    if !reads_tables(heads, kv_heads, d, q.dtype()) {
        return Err(bad("the kernel does not take these queries"));
    }
    let n = keys.slabs.len();
    let fits = (1..=MOST_TABLE_SLABS).contains(&n)
        && keys.slabs.iter().all(|s| s.dtype() == q.dtype())
        && keys.slab_blocks.shape() == [n as i32]
        && keys.tables.ndim() == 2
        && keys.tables.shape()[0] == b
        && keys.lens.shape() == [b];
    let Some(k) = kernels().filter(|_| fits) else {
        return Err(bad("keys do not match the queries"));
    };
    let mut inputs: Vec<&Array> = Vec::with_capacity(INPUTS.len());
    inputs.push(q);
    inputs.extend((0..MOST_TABLE_SLABS).map(|i| &keys.slabs[i.min(n - 1)]));
    inputs.extend([&keys.slab_blocks, &keys.tables, &keys.lens]);
    let dtype = q.dtype();
    let constants = [
        Constant::Type(c"T", dtype),
        Constant::Int(c"D", d),
        Constant::Int(c"G", heads / kv_heads),
        Constant::Int(c"BT", keys.block_tokens),
    ];
    let p = parts(b, kv_heads, keys.longest);
    let grid = [kv_heads * WARPS * 32, b, p];
    let block = [WARPS * 32, 1, 1];
    let out = if p == 1 {
        let outs = [(&[b, 1, heads * d][..], dtype)];
        k.whole.apply(&inputs, &outs, grid, block, &constants)?
    } else {
        let outs = [
            (&[b, heads, p, d][..], Dtype::Float32),
            (&[b, heads, p][..], Dtype::Float32),
            (&[b, heads, p][..], Dtype::Float32),
        ];
        let partial = k.part.apply(&inputs, &outs, grid, block, &constants)?;
        let partial: Vec<&Array> = partial.iter().collect();
        let merged = [(&[b, 1, heads * d][..], dtype)];
        let constants = [Constant::Type(c"T", dtype), Constant::Int(c"D", d)];
        k.merge
            .apply(&partial, &merged, [heads * d, b, 1], [d, 1, 1], &constants)?
    };
    out.into_iter().next().ok_or_else(|| bad("no output"))
}
