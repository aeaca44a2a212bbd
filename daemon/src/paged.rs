//! A sequence's view of the paged pool: its block table, and a [`KvStore`] that writes new K/V
//! rows into its blocks and gathers all of them for attention.
//!
//! The first blocks may be shared (mapped from the prefix cache, refcount +1): their rows are
//! only read. Before each forward pass the caller reserves room for the new tokens
//! ([`PagedSeq::reserve`]), which is where the pool can say "not now".

use mlx_rs::Array;

use crate::Result;
use crate::kv::{BatchKv, KvStore};
use crate::pool::{BlockId, BlockPool, GatherIndex};

/// One sequence's blocks and length.
#[derive(Debug, Default, Clone)]
pub struct PagedSeq {
    /// Block ids in sequence order.
    pub table: Vec<BlockId>,
    /// Tokens stored.
    pub len: usize,
}

impl PagedSeq {
    /// A sequence that starts from `shared` cached blocks holding `shared.len() × block_tokens`
    /// tokens (the caller has taken a reference on each).
    pub fn with_prefix(shared: Vec<BlockId>, block_tokens: usize) -> Self {
        let len = shared.len() * block_tokens;
        Self { table: shared, len }
    }

    /// Makes room for `tokens` more tokens, allocating blocks; false (and nothing taken) when the
    /// pool is short.
    pub fn reserve(&mut self, pool: &mut BlockPool, tokens: usize) -> bool {
        let bt = pool.shape().block_tokens;
        let needed = (self.len + tokens).div_ceil(bt);
        let missing = needed.saturating_sub(self.table.len());
        match pool.allocate(missing) {
            Some(blocks) => {
                self.table.extend(blocks);
                true
            }
            None => false,
        }
    }

    /// Drops this sequence's reference on every block (cancel, finish, preempt).
    pub fn free(&mut self, pool: &mut BlockPool) {
        for b in self.table.drain(..) {
            pool.release(b);
        }
        self.len = 0;
    }

    /// Pool row ids of positions `from..to`.
    fn rows(&self, bt: usize, from: usize, to: usize) -> Array {
        let rows: Vec<i32> = (from..to)
            .map(|p| (self.table[p / bt] as usize * bt + p % bt) as i32)
            .collect();
        Array::from_slice(&rows, &[rows.len() as i32])
    }

    /// The gather index of positions `0..len` (see [`GatherIndex`]).
    pub fn gather_index(&self, pool: &BlockPool, len: usize) -> GatherIndex {
        GatherIndex::new(&pool.shape(), &self.table, len)
    }

    /// A [`KvStore`] over `pool` for one forward pass.
    pub fn store<'a>(&'a mut self, pool: &'a mut BlockPool) -> PagedStore<'a> {
        PagedStore {
            seq: self,
            pool,
            index: None,
        }
    }
}

/// [`KvStore`] backed by the pool (see [`PagedSeq::store`]).
pub struct PagedStore<'a> {
    seq: &'a mut PagedSeq,
    pool: &'a mut BlockPool,
    /// The current pass's gather index, built by its first layer.
    index: Option<GatherIndex>,
}

/// [`BatchKv`] over the pool for several sequences (one batched decode step).
pub struct PagedBatch<'a> {
    seqs: Vec<&'a mut PagedSeq>,
    pool: &'a mut BlockPool,
    /// Each sequence's gather index for this step, built by the first layer.
    indexes: Vec<GatherIndex>,
}

impl<'a> PagedBatch<'a> {
    /// A batch of `seqs` over `pool`.
    pub fn new(seqs: Vec<&'a mut PagedSeq>, pool: &'a mut BlockPool) -> Self {
        Self {
            seqs,
            pool,
            indexes: Vec::new(),
        }
    }
}

impl BatchKv for PagedBatch<'_> {
    fn lens(&self) -> Vec<usize> {
        self.seqs.iter().map(|s| s.len).collect()
    }

    fn reserve(&mut self) -> Result<()> {
        for s in self.seqs.iter_mut() {
            reserve_in(s, self.pool, 1)?;
        }
        Ok(())
    }

    fn append_all(
        &mut self,
        layer: usize,
        ks: Vec<Array>,
        vs: Vec<Array>,
    ) -> Result<Vec<(Array, Array)>> {
        let bt = self.pool.shape().block_tokens;
        let rows: Vec<i32> = self
            .seqs
            .iter()
            .map(|s| (s.table[s.len / bt] as usize * bt + s.len % bt) as i32)
            .collect();
        let rows = Array::from_slice(&rows, &[rows.len() as i32]);
        let k = mlx_rs::ops::concatenate(&ks, 2)?;
        let v = mlx_rs::ops::concatenate(&vs, 2)?;
        self.pool.write(layer, &rows, &k, &v)?;
        if self.indexes.is_empty() {
            self.indexes = self
                .seqs
                .iter()
                .map(|s| s.gather_index(self.pool, s.len + 1))
                .collect();
        }
        self.indexes
            .iter()
            .map(|index| self.pool.read(layer, index))
            .collect()
    }

    fn commit(&mut self) {
        for s in self.seqs.iter_mut() {
            s.len += 1;
        }
        self.indexes.clear();
    }
}

fn reserve_in(seq: &mut PagedSeq, pool: &mut BlockPool, tokens: usize) -> Result<()> {
    if seq.reserve(pool, tokens) {
        Ok(())
    } else {
        Err(crate::EngineError::PoolExhausted {
            needed_tokens: tokens,
            free_blocks: pool.free_blocks(),
        })
    }
}

fn append_in(
    seq: &PagedSeq,
    pool: &mut BlockPool,
    index: &mut Option<GatherIndex>,
    layer: usize,
    k: Array,
    v: Array,
) -> Result<(Array, Array)> {
    let t = k.shape()[2] as usize;
    let bt = pool.shape().block_tokens;
    let (start, end) = (seq.len, seq.len + t);
    if end > seq.table.len() * bt {
        return Err(crate::EngineError::Request(format!(
            "no room reserved for {t} tokens at position {start} (call PagedSeq::reserve first)"
        )));
    }
    pool.write(layer, &seq.rows(bt, start, end), &k, &v)?;
    let index = match index {
        Some(index) if index.len() == end => index,
        _ => index.insert(seq.gather_index(pool, end)),
    };
    pool.read(layer, index)
}

impl KvStore for PagedStore<'_> {
    fn len(&self) -> usize {
        self.seq.len
    }

    fn reserve(&mut self, tokens: usize) -> Result<()> {
        reserve_in(self.seq, self.pool, tokens)
    }

    fn append(&mut self, layer: usize, k: Array, v: Array) -> Result<(Array, Array)> {
        append_in(self.seq, self.pool, &mut self.index, layer, k, v)
    }

    fn commit(&mut self, tokens: usize) {
        self.seq.len += tokens;
        self.index = None;
    }
}
