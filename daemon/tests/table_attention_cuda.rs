//! Decode attention read by block table (`backend::cuda::attention::attend_tables`): a real pool whose
//! sequences' blocks lie scattered over several slabs, written through the pool, gives what a
//! softmax over each row's keys gives (f32, MLX's ops), for rows of different lengths, in one
//! pass and split into parts, f16 and f32, and the group sizes of SmolLM2 (3) and Llama 3 8B
//! (4). The plans, and what a decode step that asks for tables gets, are checked on every
//! backend; the kernel needs a CUDA GPU (without one that test says it was skipped;
//! `scripts/gpu_check.sh` runs it on one).

mod support;

use mlx_rs::Dtype;
use mlx_rs::ops::indexing::IndexOp;
use mlxcel_daemon::backend::cuda::attention::{attend_tables, parts};
use mlxcel_daemon::kv::{BatchKv, MOST_TABLE_SLABS, OwnKeys, OwnLayout, TABLE_SLAB_SHIFT};
use mlxcel_daemon::paged::PagedBatch;
use mlxcel_daemon::pool::{BlockId, BlockPool, PoolShape};
use mlxcel_daemon::scheduler::BlockTable;
use support::cuda::{max_error, normal, on_cuda, reference, tolerance};

const BT: usize = 16;

fn shape(kvh: usize, d: usize, dtype: Dtype) -> PoolShape {
    PoolShape {
        layers: 2,
        num_blocks: 512,
        block_tokens: BT,
        kv_heads: kvh,
        head_dim: d,
        dtype,
    }
}

/// Tables of `lens` tokens each, blocks taken in turns (row 0's
/// first, row 1's first, ...) so each row's blocks are scattered over the slabs.
fn scattered(pool: &mut BlockPool, lens: &[usize]) -> Vec<Vec<BlockId>> {
    let mut tables = vec![Vec::new(); lens.len()];
    let most = lens.iter().map(|n| n.div_ceil(BT)).max().unwrap_or(0);
    for j in 0..most {
        for (i, &n) in lens.iter().enumerate() {
            if j < n.div_ceil(BT) {
                tables[i].extend(pool.allocate(1).expect("room"));
            }
        }
    }
    tables
}

#[test]
fn a_plan_names_each_block_by_slab_and_place_and_refuses_too_many_slabs() {
    let mut pool = BlockPool::with_slab_blocks(shape(2, 32, Dtype::Float32), 4).unwrap();
    let lens = [40, 3, 20];
    // Short rows: one pass.
    assert_eq!(parts(3, 2, 40), 1);
    let tables = scattered(&mut pool, &lens);
    let refs: Vec<&[BlockId]> = tables.iter().map(|t| t.as_slice()).collect();
    let plan = pool.plan_tables(&refs, &lens).expect("3 slabs fit");
    let keys = pool.table_keys(1, &plan).unwrap();
    assert_eq!(keys.slabs.len(), 2, "6 blocks over slabs of 4");
    assert_eq!(keys.slab_blocks.as_slice::<i32>(), &[4, 4]);
    assert_eq!(keys.lens.as_slice::<i32>(), &[40, 3, 20]);
    assert_eq!(keys.tables.shape(), &[3, 3]);
    let entries = keys.tables.as_slice::<i32>();
    for (i, t) in tables.iter().enumerate() {
        for j in 0..3 {
            // Past a row's blocks, its first again.
            let b = t.get(j).copied().unwrap_or(t[0]) as i32;
            let e = entries[i * 3 + j];
            let (slab, local) = (e >> TABLE_SLAB_SHIFT, e & ((1 << TABLE_SLAB_SHIFT) - 1));
            assert_eq!(slab * 4 + local, b, "row {i} block {j}");
        }
    }
    // More slabs than the kernel takes: the caller gathers instead.
    let long = [BT * 4 * (MOST_TABLE_SLABS + 1)];
    let mut big = BlockPool::with_slab_blocks(
        PoolShape {
            num_blocks: 64,
            ..shape(2, 32, Dtype::Float32)
        },
        4,
    )
    .unwrap();
    let t = big.allocate(long[0] / BT).unwrap();
    assert!(big.plan_tables(&[&t], &long).is_none());
    // A table shorter than its length.
    assert!(pool.plan_tables(&[&tables[1]], &[BT + 1]).is_none());
}

#[test]
fn a_decode_step_asking_for_tables_gets_each_rows_blocks_and_length_after_its_write() {
    let mut pool = BlockPool::with_slab_blocks(shape(2, 32, Dtype::Float32), 4).unwrap();
    let lens = [40, 3, 20];
    let tables = scattered(&mut pool, &lens);
    let mut seqs: Vec<BlockTable> = tables
        .iter()
        .zip(lens)
        .map(|(t, len)| BlockTable {
            blocks: t.clone(),
            len,
        })
        .collect();
    for s in seqs.iter_mut() {
        s.grow(&mut pool, 1).expect("room");
    }
    let mut batch = PagedBatch::new(seqs.iter_mut().collect(), &mut pool);
    let row = normal(&[3, 2, 1, 32], Dtype::Float32);
    let keys = batch
        .append_all(1, row.clone(), row, OwnLayout::Tables)
        .unwrap();
    assert!(keys.shared.is_empty(), "tables read every row whole");
    let OwnKeys::Tables(t) = keys.own else {
        panic!("a step over 2 slabs is read by table");
    };
    // This step's key included: 41, 4, 21.
    assert_eq!(t.lens.as_slice::<i32>(), &[41, 4, 21]);
    assert_eq!(t.longest, 41);
    assert_eq!(t.block_tokens, BT as i32);
    assert_eq!(t.tables.shape(), &[3, 3]);
    batch.commit();
    drop(batch);
    // Rows over more slabs than the kernel takes are gathered instead.
    let long = [BT * 4 * (MOST_TABLE_SLABS + 1) - 1];
    let mut seq = BlockTable::default();
    assert!(seq.grow(&mut pool, long[0]).is_some());
    seq.len = long[0];
    seq.grow(&mut pool, 1).expect("room");
    let mut batch = PagedBatch::new(vec![&mut seq], &mut pool);
    let row = normal(&[1, 2, 1, 32], Dtype::Float32);
    let keys = batch
        .append_all(0, row.clone(), row, OwnLayout::Tables)
        .unwrap();
    assert!(matches!(keys.own, OwnKeys::RowsFirst(..)));
}

/// Rows of `lens` keys (queries of `heads` heads over `kvh` KV heads of width `d`) in slabs of `slab_blocks` blocks, read in `want_parts` parts.
fn check(
    cuda: bool,
    (heads, kvh, d): (i32, i32, i32),
    lens: &[usize],
    slab_blocks: u32,
    want_parts: i32,
    dtype: Dtype,
) {
    let shape = shape(kvh as usize, d as usize, dtype);
    let mut pool = BlockPool::with_slab_blocks(shape, slab_blocks).unwrap();
    let tables = scattered(&mut pool, lens);
    // Each row's keys and values, written position by position through the pool (layer 1).
    let mut written = Vec::new();
    for (t, &n) in tables.iter().zip(lens) {
        let (k, v) = (
            normal(&[kvh, n as i32, d], dtype),
            normal(&[kvh, n as i32, d], dtype),
        );
        let at: Vec<(BlockId, usize)> = (0..n).map(|p| (t[p / BT], p % BT)).collect();
        pool.write(1, &at, &k, &v).unwrap();
        written.push((k, v));
    }
    let refs: Vec<&[BlockId]> = tables.iter().map(|t| t.as_slice()).collect();
    let plan = pool.plan_tables(&refs, lens).expect("the slabs fit");
    let keys = pool.table_keys(1, &plan).unwrap();
    assert!(keys.slabs.len() > 1, "the test reads several slabs");
    let b = lens.len() as i32;
    assert_eq!(parts(b, kvh, keys.longest), want_parts, "{lens:?}");
    if !cuda {
        return;
    }
    let q = normal(&[b, 1, heads, d], dtype).swap_axes(1, 2).unwrap();
    let out = attend_tables(&q, &keys, kvh).unwrap();
    assert_eq!(out.shape(), &[b, 1, heads * d]);
    let group = heads / kvh;
    for (i, (k, v)) in written.iter().enumerate() {
        let qi = q.index((i as i32, .., 0, ..));
        let want = reference(&qi, k, v, group);
        let err = max_error(&out.index((i as i32, 0, ..)), &want);
        assert!(
            err < tolerance(dtype),
            "row {i} ({} keys, {dtype:?}): error {err}",
            lens[i]
        );
    }
}

#[test]
fn long_rows_are_split_only_while_the_gpu_would_idle() {
    assert_eq!(parts(8, 8, 500), 1, "short rows");
    assert_eq!(parts(1, 8, 4096), 16, "one long row: parts of 256 keys");
    assert_eq!(parts(8, 8, 4096), 5, "64 blocks: about 264 in all");
    assert_eq!(parts(40, 8, 4096), 1, "320 blocks keep the GPU busy");
    assert_eq!(parts(1, 8, 1023), 1, "short rows take one pass");
}

#[test]
fn rows_read_by_table_match_a_softmax_over_their_keys() {
    // The plans are checked everywhere, the kernel only on CUDA.
    let cuda = on_cuda();
    for dtype in [Dtype::Float16, Dtype::Float32] {
        // SmolLM2's shape: 9 heads over 3, head_dim 64.
        check(cuda, (9, 3, 64), &[1, 17, 130, 33], 4, 1, dtype);
        // Llama 3 8B's: 32 over 8, head_dim 128.
        check(cuda, (32, 8, 128), &[150, 2, 64, 97], 8, 1, dtype);
        // Few long rows: split into parts, merged.
        check(cuda, (9, 3, 64), &[3000, 5], 64, 11, dtype);
        check(cuda, (32, 8, 128), &[1100, 1500], 64, 5, dtype);
    }
}
