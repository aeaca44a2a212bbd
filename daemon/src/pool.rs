//! The paged KV pool: block ids index every layer; the memory behind them lives in slabs taken
//! on first use and given back when empty, so what the process holds follows what is held.
//!
//! - `num_blocks` is a ceiling, not an allocation: an idle pool holds no memory.
//! - Allocation hands out the lowest free ids, so new blocks fill the lowest slabs and the
//!   highest drain; a slab whose last block is released is dropped and MLX's buffer cache is
//!   cleared, so the memory really leaves.
//! - A refcount per block (one per sequence using it, one while the cache manager retains it).
//!
//! Allocation returns `None` when the pool is short ("not now": the scheduler waits, asks the
//! cache manager to reclaim, or preempts), also when a slab cannot be allocated. A double free
//! or refcount underflow is a bug: it panics in debug builds and is counted (and ignored) in
//! release builds.

mod gather;
mod slab;
mod tables;
mod write;

use std::collections::BTreeSet;

use mlx_rs::{Array, Dtype};

pub use gather::{CopyCosts, Gather, Order, spans_cheaper};
use slab::Slab;
pub use tables::TableRead;
pub use write::WritePlan;

use crate::Result;

pub use mlxcel_ipc::BlockId;

/// Sizes of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolShape {
    pub layers: usize,
    /// The ceiling, in blocks.
    pub num_blocks: u32,
    pub block_tokens: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: Dtype,
}

impl PoolShape {
    /// Real bytes of one block across all layers (K and V).
    pub fn block_bytes(&self) -> usize {
        2 * self.layers * self.chunk_elems() * dtype_bytes(self.dtype)
    }

    /// Elements of one block of one layer, K or V (`kv_heads × block_tokens × head_dim`).
    pub(crate) fn chunk_elems(&self) -> usize {
        self.block_tokens * self.kv_heads * self.head_dim
    }

    /// Elements of one head of one block of one layer, K or V: what a gather copies at once.
    pub(crate) fn head_chunk_elems(&self) -> usize {
        self.block_tokens * self.head_dim
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

/// The default slab size: big enough that a gather rarely spans slabs, small enough that an
/// almost empty slab holds little (the footprint rules allow 64 MiB of slack).
pub const SLAB_BYTES: usize = 16 << 20;

/// The smallest slab on a GPU. There a decode step's gather costs a few kernel launches per
/// slab it reads, per layer (~20 µs each through MLX), not bytes: measured on an H200 with
/// 64 MiB slabs, an 8B-like model's K/V reads and writes took 81 of an 89 ms step at 8 x 4k
/// tokens (64 slabs) and 32 of 59 ms at 32 x 200. So slabs grow with the ceiling
/// ([`gpu_slab_bytes`]).
pub const GPU_SLAB_BYTES: usize = 64 << 20;

/// The largest slab on a GPU.
pub const GPU_SLAB_MAX_BYTES: usize = 2 << 30;

/// A GPU pool's slab size for a ceiling of `ceiling` bytes: 1/32 of it, within
/// [`GPU_SLAB_BYTES`]..=[`GPU_SLAB_MAX_BYTES`]. At most ~3% of the ceiling sits in a slab's
/// unused blocks, and a step reads few slabs.
pub fn gpu_slab_bytes(ceiling: usize) -> usize {
    (ceiling / 32).clamp(GPU_SLAB_BYTES, GPU_SLAB_MAX_BYTES)
}

/// Counters of allocator misuse (should stay 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolBugs {
    pub double_frees: u64,
}

/// The slabs and their allocator.
pub struct BlockPool {
    shape: PoolShape,
    /// Blocks per slab (the last slab may be shorter).
    slab_blocks: u32,
    slabs: Vec<Option<Slab>>,
    refcount: Vec<u32>,
    free: BTreeSet<BlockId>,
    bugs: PoolBugs,
    /// How reads are planned ([`CopyCosts::CPU`] unless set).
    costs: CopyCosts,
}

impl BlockPool {
    /// A pool of at most `shape.num_blocks` blocks in slabs of about [`SLAB_BYTES`]; it holds
    /// no memory until blocks are allocated.
    pub fn new(shape: PoolShape) -> Result<BlockPool> {
        Self::with_slab_bytes(shape, SLAB_BYTES)
    }

    /// A pool laid out and planned for the device its model runs on: on a GPU, slabs sized
    /// from the ceiling ([`gpu_slab_bytes`]) and the GPU's copy costs.
    pub fn for_device(shape: PoolShape, gpu: bool) -> Result<BlockPool> {
        Ok(if gpu {
            let ceiling = shape.num_blocks as usize * shape.block_bytes();
            Self::with_slab_bytes(shape, gpu_slab_bytes(ceiling))?.with_costs(CopyCosts::GPU)
        } else {
            Self::with_slab_bytes(shape, SLAB_BYTES)?
        })
    }

    /// A pool in slabs of about `slab_bytes`.
    pub fn with_slab_bytes(shape: PoolShape, slab_bytes: usize) -> Result<BlockPool> {
        let per_slab = (slab_bytes / shape.block_bytes().max(1)).max(1) as u32;
        Self::with_slab_blocks(shape, per_slab)
    }

    /// A pool with `slab_blocks` blocks per slab.
    pub fn with_slab_blocks(shape: PoolShape, slab_blocks: u32) -> Result<BlockPool> {
        let slab_blocks = slab_blocks.clamp(1, shape.num_blocks.max(1));
        let slabs = shape.num_blocks.div_ceil(slab_blocks) as usize;
        Ok(BlockPool {
            shape,
            slab_blocks,
            slabs: (0..slabs).map(|_| None).collect(),
            refcount: vec![0; shape.num_blocks as usize],
            free: (0..shape.num_blocks).collect(),
            bugs: PoolBugs::default(),
            costs: CopyCosts::CPU,
        })
    }

    /// The same pool planning its reads with `costs` (the device's).
    pub fn with_costs(mut self, costs: CopyCosts) -> BlockPool {
        self.costs = costs;
        self
    }

    /// The pool's sizes.
    pub fn shape(&self) -> PoolShape {
        self.shape
    }

    /// Blocks per slab.
    pub fn slab_blocks(&self) -> u32 {
        self.slab_blocks
    }

    /// Blocks on the free list (up to the ceiling, resident or not).
    pub fn free_blocks(&self) -> u32 {
        self.free.len() as u32
    }

    /// Slabs that hold memory now.
    pub fn resident_slabs(&self) -> usize {
        self.slabs.iter().flatten().count()
    }

    /// Blocks whose memory is resident (held or not).
    pub fn resident_blocks(&self) -> u32 {
        (0..self.slabs.len())
            .filter(|&s| self.slabs[s].is_some())
            .map(|s| self.slab_len(s))
            .sum()
    }

    /// Bytes of the resident slabs as MLX reports them for its arrays (an independent check
    /// of `resident_blocks × block_bytes`).
    pub fn measured_bytes(&self) -> u64 {
        self.slabs.iter().flatten().map(Slab::nbytes).sum()
    }

    /// Misuse counters.
    pub fn bugs(&self) -> PoolBugs {
        self.bugs
    }

    /// References held on `block`.
    pub fn refcount(&self, block: BlockId) -> u32 {
        self.refcount.get(block as usize).copied().unwrap_or(0)
    }

    /// Takes the `n` lowest free blocks (refcount 1 each), or none at all if fewer are free
    /// or a slab cannot be allocated.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if self.free.len() < n {
            return None;
        }
        let blocks: Vec<BlockId> = self.free.iter().take(n).copied().collect();
        for &b in &blocks {
            let s = self.slab_of(b);
            if self.slabs[s].is_none() {
                let len = self.slab_len(s);
                match crate::host_memory::with_mapped_buffers(|| Slab::new(&self.shape, len)) {
                    Ok(slab) => self.slabs[s] = Some(slab),
                    Err(e) => {
                        tracing::error!(slab = s, error = %e, "cannot allocate a KV slab");
                        self.drop_empty_slabs();
                        return None;
                    }
                }
            }
        }
        for &b in &blocks {
            self.free.remove(&b);
            self.refcount[b as usize] = 1;
            let s = self.slab_of(b);
            if let Some(slab) = self.slabs[s].as_mut() {
                slab.held += 1;
            }
        }
        Some(blocks)
    }

    /// Adds a reference to `block` (a sequence mapping a shared block, or the cache retaining it).
    pub fn retain(&mut self, block: BlockId) {
        let r = &mut self.refcount[block as usize];
        debug_assert!(*r > 0, "retain of free block {block}");
        *r += 1;
    }

    /// Drops a reference; the block returns to the free list at zero, and its slab's memory
    /// goes back when it was the slab's last.
    pub fn release(&mut self, block: BlockId) {
        let r = &mut self.refcount[block as usize];
        if *r == 0 {
            debug_assert!(false, "double free of block {block}");
            self.bugs.double_frees += 1;
            return;
        }
        *r -= 1;
        if *r > 0 {
            return;
        }
        self.free.insert(block);
        let s = self.slab_of(block);
        if let Some(slab) = self.slabs[s].as_mut() {
            slab.held -= 1;
            if slab.held == 0 {
                self.drop_empty_slabs();
            }
        }
    }

    /// `layer`'s K and V of the first `blocks` blocks of `table`, as views of the slabs (no
    /// copy): one `[1, kv_heads, n × block_tokens, head_dim]` pair per run of consecutive ids
    /// in one slab, in sequence order.
    pub fn spans(
        &self,
        layer: usize,
        table: &[BlockId],
        blocks: usize,
    ) -> Result<Vec<(Array, Array)>> {
        let table = &table[..blocks.min(table.len())];
        let mut spans = Vec::new();
        for (s, from, to) in self.runs(table) {
            let Some(slab) = self.slabs[s].as_ref() else {
                return Err(crate::EngineError::Internal(
                    "a read from a slab that holds no block".into(),
                ));
            };
            spans.push(slab.span(layer, &self.shape, self.slab_len(s), from, to)?);
        }
        Ok(spans)
    }

    /// How many spans [`BlockPool::spans`] returns for `table`: its runs of consecutive ids
    /// within one slab.
    pub fn span_count(&self, table: &[BlockId]) -> usize {
        self.runs(table).len()
    }

    /// `table`'s runs of consecutive ids within one slab: (slab, first local block, end).
    fn runs(&self, table: &[BlockId]) -> Vec<(usize, u32, u32)> {
        let mut runs = Vec::new();
        let mut start = 0;
        for end in 1..=table.len() {
            let breaks = end == table.len()
                || table[end] != table[end - 1] + 1
                || self.slab_of(table[end]) != self.slab_of(table[start]);
            if breaks {
                let s = self.slab_of(table[start]);
                let base = s as u32 * self.slab_blocks;
                runs.push((s, table[start] - base, table[end - 1] - base + 1));
                start = end;
            }
        }
        runs
    }

    fn slab_of(&self, block: BlockId) -> usize {
        (block / self.slab_blocks) as usize
    }

    fn slab_len(&self, s: usize) -> u32 {
        let base = s as u32 * self.slab_blocks;
        self.slab_blocks.min(self.shape.num_blocks - base)
    }

    fn drop_empty_slabs(&mut self) {
        let mut dropped = false;
        for slab in self.slabs.iter_mut() {
            if slab.as_ref().is_some_and(|s| s.held == 0) {
                *slab = None;
                dropped = true;
            }
        }
        if dropped {
            // Freed arrays stay in MLX's buffer cache until it is cleared.
            if let Err(e) = mlx_rs::memory::clear_cache() {
                tracing::warn!(error = %e, "cannot clear MLX's buffer cache");
            }
            crate::host_memory::trim_freed_memory();
        }
    }
}

impl crate::scheduler::Blocks for BlockPool {
    fn free_blocks(&self) -> u32 {
        BlockPool::free_blocks(self)
    }
    fn total_blocks(&self) -> u32 {
        self.shape.num_blocks
    }
    fn block_tokens(&self) -> usize {
        self.shape.block_tokens
    }
    fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        BlockPool::allocate(self, n)
    }
    fn release(&mut self, block: BlockId) {
        BlockPool::release(self, block);
    }
}
