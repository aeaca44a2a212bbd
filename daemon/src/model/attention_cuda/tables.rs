//! The decode attention kernel reading K/V where they lie in the pool, by block table
//! ([`TableKeys`]): the body of [`super::source`], with each key found through its row's table
//! and the slab it names. Rows of any lengths, no mask, no gather.

use std::sync::OnceLock;

use mlx_rs::{Array, Dtype};

use super::super::cuda_kernel::{Constant, CudaKernel, switch};
use super::{MOST_GROUP_WIDTH, WARPS, source, wanted};
use crate::kv::TableKeys;
use crate::pool::MOST_TABLE_SLABS;
use crate::{EngineError, Result};

/// Row `b` reads its first `lens[b]` keys.
const LENGTH: &str = "  const int n = lens[b];\n";

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

const INPUTS: [&str; 4 + MOST_TABLE_SLABS] =
    ["q", "s0", "s1", "s2", "s3", "slab_blocks", "tables", "lens"];

/// Whether decode steps read K/V by table on CUDA: yes, unless `MLXCEL_CUDA_TABLES=0` or
/// `MLXCEL_CUDA_ATTENTION=0` (then they are gathered).
pub fn tables_wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    wanted() && switch(&WANTED, "MLXCEL_CUDA_TABLES", true)
}

fn kernel() -> Option<&'static CudaKernel> {
    static KERNEL: OnceLock<Option<CudaKernel>> = OnceLock::new();
    let make = || {
        let body = source(LENGTH, LOCATE);
        CudaKernel::new("mlxcel_table_attention", &INPUTS, &["o"], &body, "", false)
    };
    KERNEL.get_or_init(make).as_ref()
}

/// Whether [`attend_tables`] takes queries of `heads` heads over `kv_heads` KV heads of width
/// `head_dim` in `dtype` (and is wanted).
pub fn reads_tables(heads: i32, kv_heads: i32, head_dim: i32, dtype: Dtype) -> bool {
    tables_wanted()
        && kv_heads > 0
        && heads % kv_heads == 0
        && head_dim % 32 == 0
        && head_dim <= 256
        && (heads / kv_heads) * head_dim <= MOST_GROUP_WIDTH
        && matches!(dtype, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
        && kernel().is_some()
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
    if !fits {
        return Err(bad("keys do not match the queries"));
    }
    let Some(kernel) = kernel() else {
        return Err(bad("the kernel is not available"));
    };
    let mut inputs: Vec<&Array> = Vec::with_capacity(INPUTS.len());
    inputs.push(q);
    inputs.extend((0..MOST_TABLE_SLABS).map(|i| &keys.slabs[i.min(n - 1)]));
    inputs.extend([&keys.slab_blocks, &keys.tables, &keys.lens]);
    let dtype = q.dtype();
    let mut out = kernel.apply(
        &inputs,
        &[(&[b, 1, heads * d], dtype)],
        [kv_heads * WARPS * 32, b, 1],
        [WARPS * 32, 1, 1],
        &[
            Constant::Type(c"T", dtype),
            Constant::Int(c"D", d),
            Constant::Int(c"G", heads / kv_heads),
            Constant::Int(c"BT", keys.block_tokens),
        ],
    )?;
    out.pop().ok_or_else(|| bad("no output"))
}
