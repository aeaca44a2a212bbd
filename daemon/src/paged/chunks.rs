//! [`ChunksKv`] over the pool: several sequences' prefill chunks in one forward pass.
//!
//! Each chunk's keys are read as in-place spans (one per run of consecutive blocks), or, where
//! the pass reads them [`OwnRead::Cheaper`] and the runs are many (a pool fragmented by earlier
//! requests), gathered into one array: a GPU's attention joins the spans into one array anyway,
//! a copy per span per layer, and a 4k-token prompt in 16-token blocks can be 256 spans.

use mlx_rs::Array;

use super::{OwnRead, write_rows};
use crate::Result;
use crate::kv::{ChunksKv, OwnLayout};
use crate::pool::{BlockPool, Gather, Order, WritePlan};
use crate::scheduler::BlockTable;

/// How one chunk's keys are read in a pass.
enum KeyRead {
    Spans,
    Gathered(Gather),
}

/// Several sequences of the pool, each adding a chunk in one pass.
pub struct PagedChunks<'a> {
    seqs: Vec<&'a mut BlockTable>,
    pool: &'a mut BlockPool,
    /// Per sequence, where this pass's new rows go, planned by the first layer.
    writes: Vec<Option<WritePlan>>,
    /// Per sequence, how this pass reads its keys, planned by the first layer.
    reads: Vec<Option<KeyRead>>,
    read: OwnRead,
}

impl<'a> PagedChunks<'a> {
    /// A pass over `seqs` (chunk `i` is `seqs[i]`'s), reading keys as spans.
    pub fn new(seqs: Vec<&'a mut BlockTable>, pool: &'a mut BlockPool) -> Self {
        let writes = seqs.iter().map(|_| None).collect();
        let reads = seqs.iter().map(|_| None).collect();
        Self {
            seqs,
            pool,
            writes,
            reads,
            read: OwnRead::Spans,
        }
    }

    /// The same pass reading each chunk's keys as `read` says: a GPU's passes read
    /// [`OwnRead::Cheaper`].
    pub fn reading(mut self, read: OwnRead) -> Self {
        self.read = read;
        self
    }
}

impl ChunksKv for PagedChunks<'_> {
    fn count(&self) -> usize {
        self.seqs.len()
    }

    fn len(&self, i: usize) -> usize {
        self.seqs[i].len
    }

    fn append(
        &mut self,
        i: usize,
        layer: usize,
        k: Array,
        v: Array,
    ) -> Result<Vec<(Array, Array)>> {
        let blocks = write_rows(self.seqs[i], self.pool, &mut self.writes[i], layer, k, v)?;
        let table = &self.seqs[i].blocks[..blocks];
        let read = match &mut self.reads[i] {
            Some(planned) => planned,
            unplanned => unplanned.insert(
                // The fused prefill attention takes one array, joined or gathered: either layout.
                if self.read.spans(OwnLayout::Either, self.pool, &[table]) {
                    KeyRead::Spans
                } else {
                    KeyRead::Gathered(Gather::new(self.pool, &[table], blocks, Order::RowsFirst)?)
                },
            ),
        };
        match read {
            KeyRead::Spans => self.pool.spans(layer, table, blocks),
            // `[1, kv_heads, blocks × block_tokens, head_dim]` each: one span.
            KeyRead::Gathered(plan) => Ok(vec![self.pool.gather(layer, plan)?]),
        }
    }

    fn commit(&mut self, i: usize, tokens: usize) {
        self.seqs[i].len += tokens;
        self.writes[i] = None;
        self.reads[i] = None;
    }
}
