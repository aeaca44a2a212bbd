//! Every custom CUDA kernel of the engine, in every variant a decode step applies, written out
//! as the source MLX compiles (into `MLXCEL_KERNEL_SOURCES`, else a temporary directory): on any
//! backend with the CUDA backend compiled (`--features cuda`), nothing evaluated. Here
//! each source is checked for what a render must hold (one kernel, its constants, no
//! placeholder left); `scripts/cuda_kernel_check.sh` runs this test and compiles every source it
//! wrote with NVRTC for the GPUs we run on, on a machine without one.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;

use mlx_rs::{Array, Dtype, ops};
use mlxcel_daemon::backend::Epilogue;
use mlxcel_daemon::backend::cuda::attention::{attend_batch, attend_tables, lengths};
use mlxcel_daemon::backend::cuda::few_rows::CudaSkinny;
use mlxcel_daemon::backend::cuda::kernel::write_sources_to;
use mlxcel_daemon::kv::{BatchKeys, OwnKeys};
use mlxcel_daemon::pool::{BlockPool, PoolShape};

fn zeros(shape: &[i32], dtype: Dtype) -> Array {
    ops::zeros_dtype(shape, dtype).unwrap()
}

/// The few-row matmul: each epilogue, both tile counts, f16 and bf16.
fn few_rows() {
    let (n, k) = (64, 128);
    for dtype in [Dtype::Float16, Dtype::Bfloat16] {
        let w = CudaSkinny::new(&zeros(&[n, k], dtype)).expect("a half weight is taken");
        for rows in [2, 9] {
            let x = zeros(&[rows, 1, k], dtype);
            let r = zeros(&[rows, 1, n], dtype);
            for epilogue in [Epilogue::Plain, Epilogue::Add(&r), Epilogue::SwiGlu] {
                let y = w.forward_with(&x, &epilogue);
                assert!(y.unwrap().is_some(), "{dtype:?} {rows} rows applied");
            }
        }
    }
}

/// Decode attention over padded keys, with and without a shared span, at SmolLM2's and Llama 3
/// 8B's head shapes.
fn padded_attention() {
    for dtype in [Dtype::Float16, Dtype::Bfloat16, Dtype::Float32] {
        for (heads, kvh, d) in [(9, 3, 64), (32, 8, 128)] {
            let b = 3;
            let q = zeros(&[b, heads, 1, d], dtype);
            let own = || zeros(&[b, kvh, 40, d], dtype);
            for shared in [0, 1] {
                let keys = BatchKeys {
                    shared: (0..shared)
                        .map(|_| {
                            (
                                zeros(&[1, kvh, 32, d], dtype),
                                zeros(&[1, kvh, 32, d], dtype),
                            )
                        })
                        .collect(),
                    shared_len: 32 * shared,
                    own: OwnKeys::RowsFirst(own(), own()),
                };
                let lens = lengths(&[40, 3, 17], 32 * shared as i32);
                let out = attend_batch(&q, &keys, &lens, kvh).unwrap();
                assert!(out.is_some(), "{dtype:?} {heads}/{kvh} applied");
            }
        }
    }
}

/// Decode attention read by block table, in one pass and in parts (then merged).
fn table_attention() {
    for dtype in [Dtype::Float16, Dtype::Float32] {
        for (heads, kvh, d) in [(9, 3, 64), (32, 8, 128)] {
            let shape = PoolShape {
                layers: 1,
                num_blocks: 256,
                block_tokens: 16,
                kv_heads: kvh as usize,
                head_dim: d as usize,
                dtype,
            };
            let mut pool = BlockPool::with_slab_blocks(shape, 64).unwrap();
            for lens in [vec![40, 3], vec![1500]] {
                let tables: Vec<_> = lens
                    .iter()
                    .map(|n: &usize| pool.allocate(n.div_ceil(16)).unwrap())
                    .collect();
                let refs: Vec<&[_]> = tables.iter().map(|t| t.as_slice()).collect();
                let plan = pool.plan_tables(&refs, &lens).expect("a plan");
                let keys = pool.table_keys(0, &plan).unwrap();
                let q = zeros(&[lens.len() as i32, heads, 1, d], dtype);
                attend_tables(&q, &keys, kvh).unwrap();
                for b in tables.into_iter().flatten() {
                    pool.release(b);
                }
            }
        }
    }
}

#[test]
fn every_kernel_is_written_as_mlx_compiles_it() {
    let dir = match mlxcel_tests::knob("KERNEL_SOURCES") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("mlxcel-kernels-{}", std::process::id())),
    };
    assert!(
        write_sources_to(dir.clone()),
        "set before any kernel is made"
    );
    few_rows();
    padded_attention();
    table_attention();
    let mut kernels = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert_eq!(source.matches("__global__ void").count(), 1, "{name}");
        assert!(source.contains("namespace mlx::core::cu {"), "{name}");
        assert!(
            source.contains("  using T = "),
            "{name}: its dtype constant"
        );
        for left in ["{LENGTH}", "{LOCATE}", "{FINISH}", "STORE"] {
            assert!(!source.contains(left), "{name}: {left} left in");
        }
        let open = source.matches('{').count();
        assert_eq!(open, source.matches('}').count(), "{name}: braces");
        let stem = name.trim_start_matches("custom_kernel_");
        kernels.insert(
            stem.split('_')
                .take_while(|w| w.parse::<i64>().is_err())
                .collect::<Vec<_>>()
                .join("_"),
        );
    }
    eprintln!("kernel sources under {}: {kernels:?}", dir.display());
    for want in [
        "mlxcel_few_rows_float16",
        "mlxcel_few_rows_add_float16",
        "mlxcel_few_rows_swiglu_bfloat16",
        "mlxcel_decode_attention_float",
        "mlxcel_table_attention_float16",
        "mlxcel_table_attention_part_float",
        "mlxcel_attention_merge_float16",
    ] {
        assert!(
            kernels.iter().any(|k| k.starts_with(want)),
            "{want} was not written"
        );
    }
}
