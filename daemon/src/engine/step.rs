//! Scheduling: FIFO admission by free blocks, a prefill chunk for each sequence computing its
//! prompt, one batched decode pass for every sequence ready to sample, and preemption of the
//! youngest sequence when a step cannot get a block.

use std::time::Instant;

use mlx_rs::Array;
use mlxcel_ipc::proto::daemon::FinishReason;
use mlxcel_ipc::proto::{ErrorCode, WireError};

use super::Engine;
use super::sequence::{Sampled, Sequence};
use crate::EngineError;
use crate::paged::{PagedBatch, PagedSeq};

impl Engine {
    /// Starts waiting sequences, oldest first, while the pool has room for their prompts.
    pub(super) fn admit(&mut self) {
        while self.running.len() < self.config.max_running {
            // Oldest first among those whose prefix is known (a prefix is at most the acquire
            // deadline away).
            let Some(at) = self.waiting.iter().position(|s| !s.awaiting_prefix) else {
                break;
            };
            let front = &self.waiting[at];
            let bt = self.config.block_tokens;
            let tokens = front.prompt.len() + front.generated.len();
            let need = tokens.div_ceil(bt).saturating_sub(front.kv.table.len()) as u32;
            if need > self.pool.free_blocks() {
                if self.running.is_empty() && need > self.pool.shape().num_blocks {
                    // Can never fit: fail it rather than wait forever.
                    if let Some(s) = self.waiting.remove(at) {
                        let message = "the prompt needs more KV blocks than the pool has";
                        self.fail(s, WireError::new(ErrorCode::BadRequest, message));
                    }
                    continue;
                }
                self.cache.reclaim(need - self.pool.free_blocks());
                break;
            }
            if let Some(mut s) = self.waiting.remove(at) {
                s.started_at = Instant::now();
                self.running.push(s);
            }
        }
    }

    /// One scheduler step: a prefill chunk for each sequence that needs one, then one batched
    /// decode step for every sequence ready to sample.
    pub(super) fn step_all(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if !self.running[i].needs_prefill() {
                i += 1;
                continue;
            }
            match self.running[i].prefill_step(
                &self.loaded.model,
                &mut self.pool,
                self.config.prefill_chunk,
            ) {
                Ok(()) => i += 1,
                Err(e) => {
                    if self.pool_full(i, e) {
                        i += 1;
                    }
                }
            }
        }
        // Sample every ready sequence; those that go on need their new token computed.
        let mut next: Vec<(usize, u32)> = Vec::new();
        let mut finished: Vec<(usize, End)> = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.needs_prefill() || s.next_logits.is_none() {
                continue;
            }
            match s.sample_next() {
                Ok(Sampled::Next(token)) => next.push((i, token)),
                Ok(Sampled::Finished(reason)) => finished.push((i, End::Finished(reason))),
                Err(e) => {
                    tracing::error!(request = s.id, error = %e, "sampling failed");
                    finished.push((i, End::Failed(e)));
                }
            }
        }
        // Room for one more token each (sequences are untouched until the batch runs).
        let mut batch: Vec<(usize, u32)> = Vec::new();
        let mut starved: Vec<usize> = Vec::new();
        for (i, token) in next {
            if self.running[i].kv.reserve(&mut self.pool, 1) {
                batch.push((i, token));
            } else {
                starved.push(i);
            }
        }
        if !batch.is_empty() {
            let tokens: Vec<u32> = batch.iter().map(|&(_, t)| t).collect();
            let pool = &mut self.pool;
            let mut seqs: Vec<&mut Sequence> = self
                .running
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| batch.iter().any(|&(b, _)| b == *i))
                .map(|(_, s)| s)
                .collect();
            let result = {
                let kv: Vec<&mut PagedSeq> = seqs.iter_mut().map(|s| &mut s.kv).collect();
                let mut batch_kv = PagedBatch::new(kv, pool);
                self.loaded.model.forward_batch(&tokens, &mut batch_kv)
            };
            match result.and_then(|l| {
                l.eval()?;
                Ok(l)
            }) {
                Ok(logits) => {
                    for (row, s) in seqs.into_iter().enumerate() {
                        let pick = Array::from_slice(&[row as i32], &[1]);
                        s.next_logits = logits.take_axis(pick, 0).ok();
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "batched decode step failed");
                    for &(i, _) in &batch {
                        let e = EngineError::Internal(format!("the decode step failed: {e}"));
                        finished.push((i, End::Failed(e)));
                    }
                }
            }
        }
        // Retire finished sequences (highest index first so indexes stay valid), then handle
        // the ones that found no room.
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        finished.dedup_by_key(|f| f.0);
        for (i, end) in finished {
            let s = self.running.remove(i);
            starved.retain(|&x| x != i);
            for x in starved.iter_mut() {
                if *x > i {
                    *x -= 1;
                }
            }
            match end {
                End::Finished(reason) => self.finish(s, reason),
                End::Failed(e) => self.fail(s, e.wire()),
            }
        }
        starved.sort_unstable_by_key(|&i| std::cmp::Reverse(i));
        for i in starved {
            if i < self.running.len() {
                // Its sampled token is in `generated`: it is recomputed with the rest.
                self.pool_full(
                    i,
                    EngineError::PoolExhausted {
                        needed_tokens: 1,
                        free_blocks: 0,
                    },
                );
            }
        }
    }

    /// Handles a step of sequence `i` that failed; true when sequence `i` is still in place.
    fn pool_full(&mut self, i: usize, e: EngineError) -> bool {
        match e {
            EngineError::PoolExhausted { .. }
                if self.running.len() == 1 && !self.cache.may_free_blocks() =>
            {
                // Alone, nothing to reclaim and no finished request's blocks about to come
                // back (a donation the manager has not answered yet): this can never fit.
                let s = self.running.remove(i);
                let message = "the request needs more KV blocks than the pool has";
                self.fail(s, WireError::new(ErrorCode::BadRequest, message));
                false
            }
            EngineError::PoolExhausted { .. } => {
                // Ask the cache for room and preempt the youngest running sequence; it keeps
                // its output and sampler and recomputes its K/V when it runs again.
                self.cache.reclaim(1);
                let youngest = self.running.len() - 1;
                let mut s = self.running.remove(youngest);
                tracing::info!(request = s.id, "preempting: the KV pool is full");
                self.preemptions += 1;
                s.kv.free(&mut self.pool);
                s.next_logits = None;
                self.waiting.push_front(s);
                youngest != i
            }
            e => {
                tracing::error!(request = self.running[i].id, error = %e, "prefill failed");
                let s = self.running.remove(i);
                self.fail(s, e.wire());
                false
            }
        }
    }
}

/// How a running sequence leaves the batch in a step.
enum End {
    /// It finished normally: its blocks are offered to the cache.
    Finished(FinishReason),
    /// It failed: the client gets the error and its blocks are freed.
    Failed(EngineError),
}
