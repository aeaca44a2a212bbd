//! A step's prefill: the chunks the scheduler plans, every one that has room in one forward
//! pass ([`crate::model::llama::Model::forward_packed`]), so arrivals share the pass's weight
//! reads and, on a GPU, its encoding. With `MLXCEL_QUEUED_PREFILL=1` (an experiment, measured
//! slower on an H100: [`crate::device::Placement::queues_prefill`]) the pass is queued, not
//! waited for, with the first tokens of the prompts it finishes drawn on the device.

use std::time::Instant;

use mlx_rs::Array;

use super::Engine;
use super::sequence::Sequence;
use crate::EngineError;
use crate::paged::{OwnRead, PagedChunks, PagedSeq};

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
                    self.clock.prefill_pass(1, false);
                }
                Err(e) => self.pool_full(i, e),
            }
        }
    }

    /// One pass over `ready` (each has its room). On failure, the error and each sequence's
    /// stored length before the pass.
    ///
    /// Where the placement queues prefill ([`crate::device::Placement::queues_prefill`]) the pass
    /// is queued, not waited for: the prompts it finishes get their first token drawn on the
    /// device, and this step's decode is encoded while the device still runs the pass. At
    /// most two passes are in flight: the one before is waited for once this one is queued.
    fn prefill_together(
        &mut self,
        ready: &[((u64, u64), usize)],
    ) -> Result<(), (EngineError, Vec<usize>)> {
        let placement = self.loaded.model.placement;
        let queue = placement.queues_prefill && super::decode::pipelined();
        self.draws += 1;
        let draw = self.draws;
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
        let logits = {
            let seqs: Vec<&mut PagedSeq> = rows.iter_mut().map(|(s, _)| &mut s.kv).collect();
            let read = if placement.gathers_prefill_keys {
                OwnRead::Cheaper
            } else {
                OwnRead::Spans
            };
            let mut kv = PagedChunks::new(seqs, &mut self.pool).reading(read);
            let refs: Vec<&[u32]> = pieces.iter().map(Vec::as_slice).collect();
            self.loaded.model.forward_packed(&refs, &mut kv)
        };
        let in_flight = logits.and_then(|logits| {
            if queue {
                queue_pass(&mut rows, &logits, placement.gpu, draw).map(Some)
            } else {
                logits.eval()?;
                for (row, (s, _)) in rows.iter_mut().enumerate() {
                    s.prefilled(&logits, row);
                }
                Ok(None)
            }
        });
        let in_flight = match in_flight {
            Ok(a) => a,
            Err(e) => {
                for (s, _) in rows.iter_mut() {
                    s.pending = None;
                    s.next_logits = None;
                }
                return Err((e, befores));
            }
        };
        self.clock.prefill_pass(rows.len(), in_flight.is_some());
        for (row, (s, _)) in rows.iter().enumerate() {
            self.clock.prefilled(s.kv.len.saturating_sub(befores[row]));
        }
        if let Some(previous) = std::mem::replace(&mut self.prefill_in_flight, in_flight)
            && let Err(e) = previous.eval()
        {
            tracing::error!(error = %e, "a queued prefill pass failed");
        }
        Ok(())
    }

    /// Where the running sequence `key` is now.
    fn position(&self, key: (u64, u64)) -> Option<usize> {
        self.sched.running().iter().position(|s| s.key() == key)
    }
}

/// Queues the pass whose last-position logits are `logits` (row `r` for `rows[r]`), the first
/// tokens of the prompts it finishes drawn with it ([`super::draws::draw_next`]); returns an
/// array whose evaluation waits for the whole pass.
fn queue_pass(
    rows: &mut [(&mut Sequence, usize)],
    logits: &Array,
    gpu: bool,
    draw: u64,
) -> crate::Result<Array> {
    let finished: Vec<i32> = (0..rows.len() as i32)
        .filter(|&r| !rows[r as usize].0.needs_prefill())
        .collect();
    let mut queued = Vec::new();
    if !finished.is_empty() {
        let theirs = if finished.len() == rows.len() {
            logits.clone()
        } else {
            logits.take_axis(Array::from_slice(&finished, &[finished.len() as i32]), 0)?
        };
        let mut seqs: Vec<&mut Sequence> = rows
            .iter_mut()
            .enumerate()
            .filter(|(r, _)| finished.contains(&(*r as i32)))
            .map(|(_, (s, _))| &mut **s)
            .collect();
        queued = super::draws::draw_next(&mut seqs, &theirs, gpu, draw)?;
        let now = Instant::now();
        for s in seqs {
            s.prefill_done_at.get_or_insert(now);
        }
    }
    if queued.is_empty() {
        queued.push(logits.clone());
    }
    mlx_rs::transforms::async_eval(&queued)?;
    Ok(queued.swap_remove(0))
}
