//! A step's prefill: the chunks the scheduler plans, every one that has room in one forward
//! pass ([`crate::model::llama::Model::forward_packed`]), so arrivals share the pass's weight
//! reads and, on a GPU, its encoding.

use super::Engine;
use super::sequence::Sequence;
use crate::EngineError;
use crate::paged::{PagedChunks, PagedSeq};

impl Engine {
    /// Runs `plan` (`(sequence key, tokens)`, oldest first). A chunk the pool cannot hold now
    /// is handled as a full pool is (the youngest preempted, or the request refused); if the
    /// shared pass fails, each chunk runs alone, so only a chunk that fails by itself fails its
    /// request.
    pub(super) fn prefill(&mut self, plan: Vec<((u64, u64), usize)>) {
        let mut ready: Vec<((u64, u64), usize)> = Vec::with_capacity(plan.len());
        for (key, n) in plan {
            // Earlier chunks of this step may have preempted or failed sequences.
            let Some(i) = self.position(key) else {
                continue;
            };
            if self.sched.running_mut()[i].kv.reserve(&mut self.pool, n) {
                ready.push((key, n));
            } else {
                let free_blocks = self.pool.free_blocks();
                self.pool_full(
                    i,
                    EngineError::PoolExhausted {
                        needed_tokens: n,
                        free_blocks,
                    },
                );
            }
        }
        // A preemption above may have taken back one that had its room (its blocks with it).
        ready.retain(|&(key, _)| self.position(key).is_some());
        if ready.is_empty() {
            return;
        }
        let befores = match self.prefill_together(&ready) {
            Ok(()) => return,
            Err((e, befores)) => {
                tracing::warn!(error = %e, chunks = ready.len(), "a packed prefill pass failed; running its chunks one by one");
                befores
            }
        };
        for ((key, n), before) in ready.into_iter().zip(befores) {
            let Some(i) = self.position(key) else {
                continue;
            };
            let s = &mut self.sched.running_mut()[i];
            s.kv.len = before;
            match s.prefill_step(&self.loaded.model, &mut self.pool, n) {
                Ok(()) => {
                    self.clock.prefilled(n);
                    self.clock.prefill_pass(1);
                }
                Err(e) => self.pool_full(i, e),
            }
        }
    }

    /// One pass over `ready` (each has its room). On failure, the error and each sequence's
    /// stored length before the pass.
    fn prefill_together(
        &mut self,
        ready: &[((u64, u64), usize)],
    ) -> Result<(), (EngineError, Vec<usize>)> {
        let mut rows: Vec<(&mut Sequence, usize)> = Vec::with_capacity(ready.len());
        for s in self.sched.running_mut().iter_mut() {
            if let Some(&(_, n)) = ready.iter().find(|(k, _)| *k == s.key()) {
                rows.push((s, n));
            }
        }
        // In `ready`'s order, so a retry walks the same chunks.
        rows.sort_by_key(|(s, _)| ready.iter().position(|(k, _)| *k == s.key()));
        let pieces: Vec<Vec<u32>> = rows.iter().map(|(s, n)| s.next_piece(*n)).collect();
        let befores: Vec<usize> = rows.iter().map(|(s, _)| s.kv.len).collect();
        let result = {
            let seqs: Vec<&mut PagedSeq> = rows.iter_mut().map(|(s, _)| &mut s.kv).collect();
            let mut kv = PagedChunks::new(seqs, &mut self.pool);
            let refs: Vec<&[u32]> = pieces.iter().map(Vec::as_slice).collect();
            self.loaded
                .model
                .forward_packed(&refs, &mut kv)
                .and_then(|l| l.eval().map(|()| l).map_err(Into::into))
        };
        match result {
            Ok(logits) => {
                self.clock.prefill_pass(rows.len());
                for (row, (s, _)) in rows.iter_mut().enumerate() {
                    self.clock.prefilled(s.kv.len.saturating_sub(befores[row]));
                    s.prefilled(&logits, row);
                }
                Ok(())
            }
            Err(e) => Err((e, befores)),
        }
    }

    /// Where the running sequence `key` is now.
    fn position(&self, key: (u64, u64)) -> Option<usize> {
        self.sched.running().iter().position(|s| s.key() == key)
    }
}
