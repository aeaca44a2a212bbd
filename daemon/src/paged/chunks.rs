//! [`ChunksKv`] over the pool: several sequences' prefill chunks in one forward pass.

use mlx_rs::Array;

use super::{PagedSeq, append_to, reserve_in};
use crate::Result;
use crate::kv::ChunksKv;
use crate::pool::{BlockPool, WritePlan};

/// Several sequences of the pool, each adding a chunk in one pass.
pub struct PagedChunks<'a> {
    seqs: Vec<&'a mut PagedSeq>,
    pool: &'a mut BlockPool,
    /// Per sequence, where this pass's new rows go, planned by the first layer.
    writes: Vec<Option<WritePlan>>,
}

impl<'a> PagedChunks<'a> {
    /// A pass over `seqs` (chunk `i` is `seqs[i]`'s).
    pub fn new(seqs: Vec<&'a mut PagedSeq>, pool: &'a mut BlockPool) -> Self {
        let writes = seqs.iter().map(|_| None).collect();
        Self { seqs, pool, writes }
    }
}

impl ChunksKv for PagedChunks<'_> {
    fn count(&self) -> usize {
        self.seqs.len()
    }

    fn len(&self, i: usize) -> usize {
        self.seqs[i].len
    }

    fn reserve(&mut self, i: usize, tokens: usize) -> Result<()> {
        reserve_in(self.seqs[i], self.pool, tokens)
    }

    fn append(
        &mut self,
        i: usize,
        layer: usize,
        k: Array,
        v: Array,
    ) -> Result<Vec<(Array, Array)>> {
        append_to(self.seqs[i], self.pool, &mut self.writes[i], layer, k, v)
    }

    fn commit(&mut self, i: usize, tokens: usize) {
        self.seqs[i].len += tokens;
        self.writes[i] = None;
    }
}
