//! What the scheduler allocates from, and what it allocates into: a pool of blocks
//! ([`Blocks`], the daemon's `BlockPool` or a counting fake in tests) and each sequence's
//! [`BlockTable`].

use mlxcel_ipc::BlockId;

/// A pool of KV blocks, as the scheduler sees it.
pub trait Blocks {
    /// Blocks free now.
    fn free_blocks(&self) -> u32;
    /// The pool's ceiling in blocks.
    fn total_blocks(&self) -> u32;
    /// Tokens per block.
    fn block_tokens(&self) -> usize;
    /// Takes `n` free blocks (one reference each), or none at all ("not now": fewer are free,
    /// or their memory cannot be had).
    fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>>;
    /// Drops one reference to `block`.
    fn release(&mut self, block: BlockId);
}

/// One sequence's blocks in order, and how many of its tokens they hold.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BlockTable {
    /// Block ids in sequence order.
    pub blocks: Vec<BlockId>,
    /// Tokens stored.
    pub len: usize,
}

impl BlockTable {
    /// A table that starts from `shared` cached blocks holding `shared.len() × block_tokens`
    /// tokens (the caller has taken a reference on each).
    pub fn with_prefix(shared: Vec<BlockId>, block_tokens: usize) -> Self {
        let len = shared.len() * block_tokens;
        Self {
            blocks: shared,
            len,
        }
    }

    /// Blocks missing for `tokens` more tokens.
    pub fn missing(&self, tokens: usize, block_tokens: usize) -> usize {
        (self.len + tokens)
            .div_ceil(block_tokens)
            .saturating_sub(self.blocks.len())
    }

    /// Makes room for `tokens` more tokens from `pool`; false (and nothing taken) when it is
    /// short. The allocated ids, where any were.
    pub fn grow(&mut self, pool: &mut impl Blocks, tokens: usize) -> Option<Vec<BlockId>> {
        let missing = self.missing(tokens, pool.block_tokens());
        let blocks = pool.allocate(missing)?;
        self.blocks.extend(&blocks);
        Some(blocks)
    }

    /// Drops this sequence's reference on every block (cancel, preemption); the ids released.
    pub fn free(&mut self, pool: &mut impl Blocks) -> Vec<BlockId> {
        let released = std::mem::take(&mut self.blocks);
        for &b in &released {
            pool.release(b);
        }
        self.len = 0;
        released
    }
}
