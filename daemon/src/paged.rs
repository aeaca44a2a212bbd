//! A sequence's view of the paged pool: its block table, and a [`KvStore`] that writes new K/V
//! rows into its blocks and reads all of them for attention (in place as spans or by block
//! table, or gathered, as the model's attention takes them).
//!
//! The first blocks may be shared (mapped from the prefix cache, refcount +1): their rows are
//! only read. Room for a pass's new tokens is allocated before it (by the scheduler's plan;
//! [`BlockTable::grow`]): nothing here allocates or frees a block.
//!
//! Reads return whole blocks: a sequence of `len` tokens gets `ceil(len / block_tokens)` blocks
//! of keys, and attention masks the positions past `len` (the model builds that mask from the
//! lengths).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, ops};

mod chunks;

pub use chunks::PagedChunks;

use crate::Result;
use crate::kv::{BatchKeys, BatchKv, GrowingKv, KvStore, OwnKeys, OwnLayout, first_positions};
use crate::pool::{BlockPool, Gather, Order, TableRead, WritePlan, spans_cheaper};
use crate::scheduler::BlockTable;
use mlxcel_ipc::BlockId;

impl BlockTable {
    /// (block, position in block) of positions `from..to`.
    fn at(&self, bt: usize, from: usize, to: usize) -> Vec<(BlockId, usize)> {
        (from..to).map(|p| (self.blocks[p / bt], p % bt)).collect()
    }

    /// The plan to read positions `0..len` (whole blocks; see [`Gather`]).
    pub fn gather(&self, pool: &BlockPool, len: usize) -> Result<Gather> {
        let blocks = len.div_ceil(pool.shape().block_tokens);
        Gather::new(
            pool,
            &[&self.blocks[..blocks.min(self.blocks.len())]],
            blocks,
            Order::HeadsFirst,
        )
    }

    /// A [`KvStore`] over `pool` for forward passes of this sequence alone (tests, benchmarks,
    /// the warm-up), which it can grow ([`GrowingKv`]).
    pub fn store<'a>(&'a mut self, pool: &'a mut BlockPool) -> PagedStore<'a> {
        PagedStore {
            seq: self,
            pool,
            write: None,
        }
    }
}

/// [`KvStore`] backed by the pool (see [`BlockTable::store`]): reads are views of the slabs.
pub struct PagedStore<'a> {
    seq: &'a mut BlockTable,
    pool: &'a mut BlockPool,
    /// Where this pass's new rows go, planned by the first layer.
    write: Option<WritePlan>,
}

/// [`BatchKv`] over the pool for several sequences (one batched decode step).
pub struct PagedBatch<'a> {
    seqs: Vec<&'a mut BlockTable>,
    pool: &'a mut BlockPool,
    /// How this step reads each row's own blocks, decided by the first layer of each layout
    /// (a model whose layers attend differently, a sliding window beside full attention, asks
    /// for two), with the leading blocks every row shares under it.
    plans: Vec<(OwnLayout, usize, OwnPlan)>,
    read: OwnRead,
    /// Where this step's new rows go, planned by the first layer.
    write: Option<WritePlan>,
}

/// How a batch reads each row's own blocks where the model can take either layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnRead {
    /// Whichever costs less ([`spans_cheaper`]).
    Cheaper,
    /// Always gathered into one padded tensor.
    Gather,
    /// Always as in-place spans.
    Spans,
}

impl OwnRead {
    /// Whether a step whose model reads `layout` reads the own blocks `own` as spans.
    fn spans(self, layout: OwnLayout, pool: &BlockPool, own: &[&[BlockId]]) -> bool {
        match (layout, self) {
            (OwnLayout::Padded | OwnLayout::Tables, _) | (_, OwnRead::Gather) => false,
            (_, OwnRead::Spans) | (OwnLayout::Spans, OwnRead::Cheaper) => true,
            (OwnLayout::Either, OwnRead::Cheaper) => spans_cheaper(pool, own),
        }
    }
}

impl<'a> PagedBatch<'a> {
    /// A batch of `seqs` over `pool`.
    pub fn new(seqs: Vec<&'a mut BlockTable>, pool: &'a mut BlockPool) -> Self {
        Self {
            seqs,
            pool,
            plans: Vec::new(),
            read: OwnRead::Cheaper,
            write: None,
        }
    }

    /// The same batch reading each row's own blocks as `read` says (tests compare the ways).
    pub fn reading(mut self, read: OwnRead) -> Self {
        self.read = read;
        self
    }

    /// How this step reads its keys: the leading blocks every row shares, read once in place
    /// (none for a fused kernel, which wants one K/V per row and would copy them per row), and
    /// how each row's own blocks are read.
    fn plan(&self, layout: OwnLayout) -> Result<(usize, OwnPlan)> {
        let Some(first) = self.seqs.first() else {
            return Err(crate::EngineError::Internal(
                "a decode step of no sequence".into(),
            ));
        };
        let bt = self.pool.shape().block_tokens;
        let whole = layout.whole_rows();
        let shared = if whole {
            0
        } else {
            // Full before this step, the same block in every row.
            let shortest = self.seqs.iter().map(|s| s.len / bt).min().unwrap_or(0);
            (0..shortest)
                .take_while(|&j| self.seqs.iter().all(|s| s.blocks[j] == first.blocks[j]))
                .count()
        };
        let own: Vec<&[BlockId]> = self
            .seqs
            .iter()
            .map(|s| &s.blocks[shared..(s.len + 1).div_ceil(bt)])
            .collect();
        let tables = || {
            let lens: Vec<usize> = self.seqs.iter().map(|s| s.len + 1).collect();
            self.pool.plan_tables(&own, &lens)
        };
        let plan = if whole && own.len() == 1 && self.pool.span_count(own[0]) == 1 {
            OwnPlan::InPlace
        } else if let Some(t) = (layout == OwnLayout::Tables).then(tables).flatten() {
            OwnPlan::Tables(t)
        } else if self.read.spans(layout, self.pool, &own) {
            OwnPlan::Spans
        } else {
            let blocks = own.iter().map(|t| t.len()).max().unwrap_or(0);
            // Rows of one length are trimmed to it and need no mask (a GPU then runs its
            // fused decode kernel, which takes none; it reads the trimmed view in place).
            // Rows of several lengths are masked: whole blocks, left contiguous, since the
            // unfused attention would copy a trimmed view of them again.
            let keys = if self.seqs.iter().all(|s| s.len == first.len) {
                first.len + 1 - shared * bt
            } else {
                blocks * bt
            };
            let order = if whole {
                Order::RowsFirst
            } else {
                Order::HeadsFirst
            };
            let plan = Gather::new(self.pool, &own, blocks, order)?;
            OwnPlan::Gather(plan, keys as i32)
        };
        Ok((shared, plan))
    }
}

impl BatchKv for PagedBatch<'_> {
    fn lens(&self) -> Vec<usize> {
        self.seqs.iter().map(|s| s.len).collect()
    }

    fn append_all(
        &mut self,
        layer: usize,
        k: Array,
        v: Array,
        layout: OwnLayout,
    ) -> Result<BatchKeys> {
        // [batch, kv_heads, 1, head_dim] -> [kv_heads, batch, head_dim]
        let heads_first = |x: Array| -> Result<Array> {
            let s = x.shape().to_vec();
            Ok(x.reshape(&[s[0], s[1], s[3]])?.swap_axes(0, 1)?)
        };
        // [2 * kv_heads, batch, head_dim]: each K head's rows, then each V head's.
        let values = ops::concatenate(&[heads_first(k)?, heads_first(v)?], 0)?;
        if self.seqs.is_empty() {
            return Err(crate::EngineError::Internal(
                "a decode step of no sequence".into(),
            ));
        }
        let bt = self.pool.shape().block_tokens;
        for s in &self.seqs {
            if s.len >= s.blocks.len() * bt {
                return Err(no_room(1, s.len));
            }
        }
        let (seqs, pool) = (&self.seqs, &mut *self.pool);
        let plan = self.write.get_or_insert_with(|| {
            let at: Vec<(BlockId, usize)> = seqs
                .iter()
                .map(|s| (s.blocks[s.len / bt], s.len % bt))
                .collect();
            pool.plan_write(&at)
        });
        pool.write_packed(layer, plan, &values)?;
        if !self.plans.iter().any(|(l, ..)| *l == layout) {
            let (shared, plan) = self.plan(layout)?;
            self.plans.push((layout, shared, plan));
        }
        let (shared, plan) = match self.plans.iter().find(|(l, ..)| *l == layout) {
            Some((_, shared, plan)) => (*shared, Some(plan)),
            None => (0, None),
        };
        let own = match plan {
            Some(OwnPlan::Gather(plan, keys)) => {
                let (mut k, mut v) = self.pool.gather(layer, plan)?;
                let keys = *keys;
                if keys < k.shape()[2] {
                    (k, v) = (k.index((.., .., ..keys)), v.index((.., .., ..keys)));
                }
                match plan.order() {
                    Order::HeadsFirst => OwnKeys::Padded(k, v),
                    Order::RowsFirst => OwnKeys::RowsFirst(k, v),
                }
            }
            Some(OwnPlan::InPlace) => {
                let s = &self.seqs[0];
                let spans = self
                    .pool
                    .spans(layer, &s.blocks, (s.len + 1).div_ceil(bt))?;
                let Some((k, v)) = first_positions(&spans, s.len + 1).into_iter().next() else {
                    return Err(crate::EngineError::Internal("no keys to read".into()));
                };
                // [1, kv_heads, keys, head_dim]: rows first already, a view.
                OwnKeys::RowsFirst(k, v)
            }
            Some(OwnPlan::Tables(plan)) => OwnKeys::Tables(self.pool.table_keys(layer, plan)?),
            Some(OwnPlan::Spans) => {
                let mut rows = Vec::with_capacity(self.seqs.len());
                for s in &self.seqs {
                    let (from, to) = (shared * bt, s.len + 1);
                    let table = &s.blocks[shared..];
                    let spans = self.pool.spans(layer, table, (to - from).div_ceil(bt))?;
                    rows.push(first_positions(&spans, to - from));
                }
                OwnKeys::Spans(rows)
            }
            None => return Err(crate::EngineError::Internal("no read plan".into())),
        };
        Ok(BatchKeys {
            shared: self.pool.spans(layer, &self.seqs[0].blocks, shared)?,
            shared_len: shared * bt,
            own,
        })
    }

    fn commit(&mut self) {
        for s in self.seqs.iter_mut() {
            s.len += 1;
        }
        self.plans.clear();
        self.write = None;
    }
}

/// How a decode step reads each row's own blocks.
enum OwnPlan {
    /// Gathered into one padded tensor, read up to its longest row's keys.
    Gather(Gather, i32),
    /// Read in place, span by span.
    Spans,
    /// The batch's one row, whose blocks are one run in one slab: one view, nothing copied.
    InPlace,
    /// Read in place by block table.
    Tables(TableRead),
}

fn no_room(t: usize, start: usize) -> crate::EngineError {
    crate::EngineError::Request(format!(
        "no room allocated for {t} tokens at position {start} (grow the block table first)"
    ))
}

impl GrowingKv for PagedStore<'_> {
    fn grow(&mut self, tokens: usize) -> Result<()> {
        match self.seq.grow(self.pool, tokens) {
            Some(_) => Ok(()),
            None => Err(crate::EngineError::PoolExhausted {
                needed_tokens: tokens,
                free_blocks: self.pool.free_blocks(),
            }),
        }
    }
}

impl KvStore for PagedStore<'_> {
    fn len(&self) -> usize {
        self.seq.len
    }

    fn append(&mut self, layer: usize, k: Array, v: Array) -> Result<Vec<(Array, Array)>> {
        append_to(self.seq, self.pool, &mut self.write, layer, k, v)
    }

    fn commit(&mut self, tokens: usize) {
        self.seq.len += tokens;
        self.write = None;
    }
}

/// Writes `seq`'s new rows (`k`, `v`: `[1, kv_heads, t, head_dim]`) of `layer` into its reserved
/// blocks, planning where once per pass (`write`), and returns its keys and values as spans.
fn append_to(
    seq: &BlockTable,
    pool: &mut BlockPool,
    write: &mut Option<WritePlan>,
    layer: usize,
    k: Array,
    v: Array,
) -> Result<Vec<(Array, Array)>> {
    let blocks = write_rows(seq, pool, write, layer, k, v)?;
    pool.spans(layer, &seq.blocks, blocks)
}

/// [`append_to`]'s write: returns how many blocks the keys now fill.
fn write_rows(
    seq: &BlockTable,
    pool: &mut BlockPool,
    write: &mut Option<WritePlan>,
    layer: usize,
    k: Array,
    v: Array,
) -> Result<usize> {
    let t = k.shape()[2] as usize;
    let bt = pool.shape().block_tokens;
    let (start, end) = (seq.len, seq.len + t);
    if end > seq.blocks.len() * bt {
        return Err(no_room(t, start));
    }
    let plan = write.get_or_insert_with(|| pool.plan_write(&seq.at(bt, start, end)));
    pool.write_planned(layer, plan, &k.squeeze_axes(&[0])?, &v.squeeze_axes(&[0])?)?;
    Ok(end.div_ceil(bt))
}
