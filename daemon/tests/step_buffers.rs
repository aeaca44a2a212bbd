//! What the warm-up measures a prefill step to take beyond what it stores: the bound a device
//! that keeps a step's freed buffers for the next step (CUDA) gives MLX's cache. Measured from
//! MLX's peak memory, so it must grow with the chunk (activations scale with its tokens) and
//! must not count the pool's slabs, which the step keeps.
//!
//! One test in its own binary: MLX's peak memory is the process's, so nothing else may
//! allocate meanwhile.

use mlxcel_daemon::engine::warmup;
use mlxcel_daemon::load;
use mlxcel_daemon::pool::{BlockPool, PoolShape};
use mlxcel_daemon::warm_workers::Share;
use mlxcel_tests::default_model;

const MIB: u64 = 1 << 20;

#[test]
fn a_prefill_steps_transient_bytes_grow_with_its_chunk_and_leave_out_the_pool() {
    let m = load(&default_model()).expect("load the default model (`make setup` places it)");
    let c = &m.model.config;
    let shape = PoolShape {
        layers: c.layers,
        num_blocks: 256,
        block_tokens: 32,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        dtype: m.model.placement.dtype,
    };
    let measure = |chunk: usize| {
        let mut pool = BlockPool::for_device(shape, m.model.placement.gpu).unwrap();
        let slab_bytes = u64::from(pool.slab_blocks()) * shape.block_bytes() as u64;
        let progress = mlxcel_daemon::engine::Progress::default();
        let warmed =
            warmup::run(&m.model, &mut pool, chunk, 2, Share::WHOLE, &progress).expect("warm-up");
        assert_eq!(
            pool.free_blocks(),
            256,
            "the warm-up gives every block back"
        );
        (warmed.step_bytes, slab_bytes)
    };
    let (small, slab) = measure(64);
    let (large, _) = measure(512);
    eprintln!(
        "step bytes: {:.1} MiB at 64 tokens, {:.1} MiB at 512 (a slab: {:.1} MiB)",
        small as f64 / MIB as f64,
        large as f64 / MIB as f64,
        slab as f64 / MIB as f64
    );
    // 512 tokens' hidden states alone (576 wide) are 1.1 MiB in f32; the MLP's 1536-wide
    // activations three times that.
    let hidden = 512 * c.hidden as u64 * 4;
    assert!(
        large >= hidden,
        "{large} bytes measured, less than one hidden state ({hidden})"
    );
    assert!(
        large > small,
        "a 512-token chunk measured {large} bytes, a 64-token one {small}"
    );
    // The 64-token step took a slab (two blocks' worth of K/V, kept): it is not transient.
    assert!(
        small < slab,
        "a 64-token step measured {small} bytes, a slab's {slab} or more: the pool's growth counted"
    );
}
