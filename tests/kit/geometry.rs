//! SmolLM2-135M's KV geometry, and block hashes of made-up prompts, for the cache manager's tests.

use mlxcel_ipc::block_hash::{HashSeed, block_hashes};
use mlxcel_ipc::{BlockHash, Dtype, Geometry};

/// SmolLM2-135M's KV geometry: 737,280 real bytes per 32-token block.
pub fn smollm2(pool_blocks: u32) -> Geometry {
    Geometry {
        model_id: "SmolLM2-135M-Instruct".into(),
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        dtype: Dtype::F16,
        block_tokens: 32,
        pool_blocks,
    }
}

/// Hashes of the full blocks of a prompt made of `shared` family tokens then `own` tokens.
pub fn prompt_hashes(
    family: u32,
    shared_blocks: usize,
    own_seed: u32,
    own_blocks: usize,
) -> Vec<BlockHash> {
    let mut tokens: Vec<u32> = (0..shared_blocks as u32 * 32)
        .map(|i| family * 100_000 + i)
        .collect();
    tokens.extend((0..own_blocks as u32 * 32).map(|i| 1_000_000 + own_seed * 10_000 + i));
    block_hashes(
        &HashSeed::new(&mlxcel_ipc::HashKey([0; 32]), "SmolLM2-135M-Instruct", None),
        &tokens,
        32,
    )
}
