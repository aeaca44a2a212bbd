//! The pool's memory as the operating system sees it: resident bytes rise as blocks are taken
//! and fall when they are released (measured from the process's resident set, not computed
//! from shapes), and a fragmented pool (one held block per slab) is reported as it is.
//!
//! One test in its own binary: the process's resident set is the measure, so nothing else may
//! allocate meanwhile.

use mlx_rs::Dtype;
use mlxcel_daemon::host_memory::resident_bytes;
use mlxcel_daemon::pool::{BlockPool, PoolShape};

const MIB: f64 = (1 << 20) as f64;

fn rss() -> f64 {
    resident_bytes().expect("this platform reports a resident set") as f64 / MIB
}

#[test]
fn resident_memory_follows_the_blocks_held() {
    // SmolLM2's geometry: 1.41 MiB per 32-token block, 11 blocks per 16 MiB slab.
    let shape = PoolShape {
        layers: 30,
        num_blocks: 1024,
        block_tokens: 32,
        kv_heads: 3,
        head_dim: 64,
        dtype: Dtype::Float32,
    };
    let block_mib = shape.block_bytes() as f64 / MIB;
    let mut pool = BlockPool::new(shape).unwrap();
    let per_slab = pool.slab_blocks() as usize;
    let idle = rss();
    assert_eq!(
        pool.measured_bytes(),
        0,
        "a ceiling of 1024 blocks holds nothing yet"
    );

    // Eight slabs' worth: the resident set grows by (about) their bytes.
    let blocks = pool.allocate(8 * per_slab).unwrap();
    let grown = rss() - idle;
    let expected = 8.0 * per_slab as f64 * block_mib;
    assert!(
        grown > 0.9 * expected && grown < expected + 64.0,
        "resident grew {grown:.0} MiB for {expected:.0} MiB of blocks"
    );
    assert_eq!(pool.measured_bytes() as f64 / MIB, expected);

    // Fragmentation: one block held in each slab keeps every slab resident, and the pool
    // says so (resident blocks far above held ones).
    let (keep, drop): (Vec<u32>, Vec<u32>) = blocks
        .iter()
        .partition(|&&b| (b as usize).is_multiple_of(per_slab));
    drop.into_iter().for_each(|b| pool.release(b));
    assert_eq!(pool.resident_blocks() as usize, 8 * per_slab);
    assert_eq!(pool.resident_slabs(), 8);
    assert!(
        rss() - idle > 0.9 * expected,
        "the held blocks pin their slabs"
    );

    // New blocks fill the lowest slabs first, so releasing the high ones drains them.
    for &b in &keep[4..] {
        pool.release(b);
    }
    assert_eq!(pool.resident_slabs(), 4);
    let again = pool.allocate(per_slab - 1).unwrap();
    assert!(
        again.iter().all(|&b| (b as usize) < 4 * per_slab),
        "new blocks went to the low slabs: {again:?}"
    );

    // Releasing everything gives the memory back to the operating system.
    keep[..4]
        .iter()
        .chain(&again)
        .for_each(|&b| pool.release(b));
    assert_eq!((pool.measured_bytes(), pool.resident_slabs()), (0, 0));
    let left = rss() - idle;
    assert!(
        left < 32.0,
        "{left:.0} MiB still resident after every block was released"
    );

    // And again: slabs allocated after others were freed leave too (glibc serves them from
    // its heap; the pool trims it when a slab is dropped).
    for round in 0..3 {
        let blocks = pool.allocate(8 * per_slab).unwrap();
        assert!(
            rss() - idle > 0.9 * expected,
            "round {round}: slabs resident"
        );
        blocks.into_iter().for_each(|b| pool.release(b));
        let left = rss() - idle;
        assert!(left < 32.0, "round {round}: {left:.0} MiB still resident");
    }
}
