//! The paged KV pool: per layer one K and one V tensor of `[num_blocks, block_tokens, kv_heads,
//! head_dim]`; a block id indexes every layer. The allocator keeps a free list and a refcount per
//! block (one per sequence using it, one while the cache manager retains it).
//!
//! Allocation returns `None` when the pool is short ("not now": the scheduler waits, asks the
//! cache manager to reclaim, or preempts). A double free or refcount underflow is a bug: it
//! panics in debug builds and is counted (and ignored) in release builds.

use mlx_rs::ops::indexing::TryIndexMutOp;
use mlx_rs::{Array, Dtype, ops};

use crate::Result;

/// A block's index in the pool.
pub type BlockId = u32;

/// Sizes of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolShape {
    pub layers: usize,
    pub num_blocks: u32,
    pub block_tokens: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: Dtype,
}

impl PoolShape {
    /// Real bytes of one block across all layers (K and V).
    pub fn block_bytes(&self) -> usize {
        2 * self.layers
            * self.block_tokens
            * self.kv_heads
            * self.head_dim
            * dtype_bytes(self.dtype)
    }
}

/// Bytes per element of the pool dtypes.
pub fn dtype_bytes(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Float32 | Dtype::Int32 | Dtype::Uint32 => 4,
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Int16 | Dtype::Uint16 => 2,
        Dtype::Float64 | Dtype::Int64 | Dtype::Uint64 | Dtype::Complex64 => 8,
        Dtype::Bool | Dtype::Int8 | Dtype::Uint8 => 1,
    }
}

/// Counters of allocator misuse (should stay 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolBugs {
    pub double_frees: u64,
}

/// The pool tensors and their allocator.
pub struct BlockPool {
    shape: PoolShape,
    /// Per layer, K and V as flat rows: `[num_blocks * block_tokens, kv_heads, head_dim]`.
    layers: Vec<(Array, Array)>,
    refcount: Vec<u32>,
    free: Vec<BlockId>,
    bugs: PoolBugs,
}

impl BlockPool {
    /// Allocates the pool tensors (zeroed) for `shape`.
    pub fn new(shape: PoolShape) -> Result<BlockPool> {
        let rows = shape.num_blocks as i32 * shape.block_tokens as i32;
        let dims = [rows, shape.kv_heads as i32, shape.head_dim as i32];
        let mut layers = Vec::with_capacity(shape.layers);
        for _ in 0..shape.layers {
            let k = ops::zeros_dtype(&dims, shape.dtype)?;
            let v = ops::zeros_dtype(&dims, shape.dtype)?;
            k.eval()?;
            v.eval()?;
            layers.push((k, v));
        }
        Ok(BlockPool {
            shape,
            layers,
            refcount: vec![0; shape.num_blocks as usize],
            // Popped from the end: hand out low ids first.
            free: (0..shape.num_blocks).rev().collect(),
            bugs: PoolBugs::default(),
        })
    }

    /// The pool's sizes.
    pub fn shape(&self) -> PoolShape {
        self.shape
    }

    /// Blocks on the free list.
    pub fn free_blocks(&self) -> u32 {
        self.free.len() as u32
    }

    /// Bytes of the pool tensors as MLX reports them (an independent check of
    /// `num_blocks × block_bytes`).
    pub fn measured_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|(k, v)| (k.nbytes() + v.nbytes()) as u64)
            .sum()
    }

    /// Misuse counters.
    pub fn bugs(&self) -> PoolBugs {
        self.bugs
    }

    /// References held on `block`.
    pub fn refcount(&self, block: BlockId) -> u32 {
        self.refcount.get(block as usize).copied().unwrap_or(0)
    }

    /// Takes `n` free blocks (refcount 1 each), or none at all if fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if self.free.len() < n {
            return None;
        }
        let blocks = self.free.split_off(self.free.len() - n);
        for &b in &blocks {
            self.refcount[b as usize] = 1;
        }
        Some(blocks)
    }

    /// Adds a reference to `block` (a sequence mapping a shared block, or the cache retaining it).
    pub fn retain(&mut self, block: BlockId) {
        let r = &mut self.refcount[block as usize];
        debug_assert!(*r > 0, "retain of free block {block}");
        *r += 1;
    }

    /// Drops a reference; the block returns to the free list at zero.
    pub fn release(&mut self, block: BlockId) {
        let r = &mut self.refcount[block as usize];
        if *r == 0 {
            debug_assert!(false, "double free of block {block}");
            self.bugs.double_frees += 1;
            return;
        }
        *r -= 1;
        if *r == 0 {
            self.free.push(block);
        }
    }

    /// Writes `k`, `v` (`[1, kv_heads, t, head_dim]`) of `layer` into pool `rows` (`t` row ids).
    pub fn write(&mut self, layer: usize, rows: &Array, k: &Array, v: &Array) -> Result<()> {
        let (pk, pv) = &mut self.layers[layer];
        let k = k.squeeze_axes(&[0])?.swap_axes(0, 1)?;
        let v = v.squeeze_axes(&[0])?.swap_axes(0, 1)?;
        pk.try_index_mut(rows.clone(), k)?;
        pv.try_index_mut(rows.clone(), v)?;
        Ok(())
    }

    /// Reads `layer`'s keys and values at `index` (a [`GatherIndex`]) as `[1, kv_heads, len,
    /// head_dim]` each, contiguous: one row copy per (head, position), no transpose left for
    /// attention to copy again.
    pub fn read(&self, layer: usize, index: &GatherIndex) -> Result<(Array, Array)> {
        let (pk, pv) = &self.layers[layer];
        let (kvh, hd) = (self.shape.kv_heads as i32, self.shape.head_dim as i32);
        let gather = |p: &Array| -> Result<Array> {
            Ok(p.reshape(&[-1, hd])?.take_axis(&index.rows, 0)?.reshape(&[
                1,
                kvh,
                index.len as i32,
                hd,
            ])?)
        };
        Ok((gather(pk)?, gather(pv)?))
    }
}

/// Where a sequence's first `len` positions live in the pool, head-major: row `h * len + p` of
/// the gather is head `h` of position `p`, read from a layer viewed as `[rows * kv_heads,
/// head_dim]`. Every layer shares it, so it is built once per forward pass.
pub struct GatherIndex {
    rows: Array,
    len: usize,
}

impl GatherIndex {
    /// The index of positions `0..len` of a sequence whose block table is `table`.
    pub fn new(shape: &PoolShape, table: &[BlockId], len: usize) -> GatherIndex {
        let (bt, kvh) = (shape.block_tokens, shape.kv_heads);
        let mut rows = Vec::with_capacity(kvh * len);
        for h in 0..kvh {
            rows.extend(
                (0..len).map(|p| ((table[p / bt] as usize * bt + p % bt) * kvh + h) as i32),
            );
        }
        let n = rows.len() as i32;
        GatherIndex {
            rows: Array::from_slice(&rows, &[n]),
            len,
        }
    }

    /// Positions covered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no position.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
