//! A GPU pool's slabs grow with its ceiling (a GPU decode step pays per slab it reads, not per
//! byte), within their bounds; the CPU's stay small. Only the layout is planned here: no block
//! is allocated, so this runs on any machine.

use mlx_rs::Dtype;
use mlxcel_daemon::pool::{BlockPool, GPU_SLAB_BYTES, GPU_SLAB_MAX_BYTES, PoolShape, SLAB_BYTES};

/// An 8B-like model's geometry (4 MiB per 32-token block, f16) and a ceiling of `blocks`.
fn shape(blocks: u32) -> PoolShape {
    PoolShape {
        layers: 32,
        num_blocks: blocks,
        block_tokens: 32,
        kv_heads: 8,
        head_dim: 128,
        dtype: Dtype::Float16,
    }
}

fn slab_bytes(blocks: u32, gpu: bool) -> usize {
    let pool = BlockPool::for_device(shape(blocks), gpu).expect("pool");
    pool.slab_blocks() as usize * shape(blocks).block_bytes()
}

#[test]
fn gpu_slabs_are_a_thirty_second_of_the_ceiling_within_bounds() {
    assert_eq!(shape(1).block_bytes(), 4 << 20);
    // The H200 run's ceiling, 34 GiB: 1/32 is 1088 MiB, 272 blocks.
    assert_eq!(slab_bytes(8704, true), 272 * (4 << 20));
    // A small ceiling (1 GiB): the smallest GPU slab.
    assert_eq!(slab_bytes(256, true), GPU_SLAB_BYTES);
    // A huge one (256 GiB): the largest.
    assert_eq!(slab_bytes(65_536, true), GPU_SLAB_MAX_BYTES);
    // The CPU's slabs do not grow with the ceiling.
    assert_eq!(slab_bytes(8704, false), SLAB_BYTES);
}
