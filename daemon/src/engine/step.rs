//! One engine step as the [`super::scheduler::Scheduler`] decides it: admission, the planned
//! prefill chunks, one batched decode pass for every sequence ready to sample, and preemption
//! of the youngest sequence when a step cannot get a block.

use std::time::Instant;

use mlxcel_ipc::proto::daemon::FinishReason;
use mlxcel_ipc::proto::{ErrorCode, WireError};

use super::Engine;
use super::step_clock::Phase;

use crate::EngineError;

/// Prompt tokens a step must compute before it gives their buffers back
/// ([`super::give_back_transient_memory`]).
const GIVE_BACK_AFTER_TOKENS: usize = 256;

impl Engine {
    /// Starts waiting sequences as the scheduler admits them; refuses those that can never
    /// fit; asks the cache for the blocks the oldest waiting one lacks.
    pub(super) fn admit(&mut self) {
        let (free, total) = (self.pool.free_blocks(), self.pool.shape().num_blocks);
        let admission = self.sched.admit(free, total);
        for s in admission.unfit {
            let tokens = s.prompt.len() + 1;
            let message = format!(
                "the prompt needs {tokens} tokens of KV, more than the KV pool's ceiling of {}; \
                 send a shorter prompt or raise --kv-pool-bytes",
                self.ceiling_text()
            );
            self.fail(s, WireError::new(ErrorCode::BadRequest, message));
        }
        if let Some(short) = admission.short {
            self.cache.reclaim(short);
        }
        let running = self.sched.running_mut();
        let now = Instant::now();
        let first_new = running.len() - admission.started;
        for s in &mut running[first_new..] {
            s.started_at = now;
        }
    }

    /// One scheduler step: the prefill chunks the scheduler plans (oldest first, within the
    /// step's token budget), then one batched decode step for every sequence ready to sample.
    pub(super) fn step_all(&mut self) {
        let mut t = Instant::now();
        let plan: Vec<((u64, u64), usize)> = self
            .sched
            .prefill_plan()
            .into_iter()
            .map(|(i, n)| (self.sched.running()[i].key(), n))
            .collect();
        // Only a large prefill's buffers are worth giving back: after the few tokens of a
        // question behind a cached prefix they are small, and the next steps would fault the
        // trimmed pages in again (one A/B at 8 shared-prefix clients: 39 vs 42-45 tok/s).
        // Where a device keeps them for the next step, MLX's cache limit bounds them instead
        // (`Placement::keeps_step_buffers`).
        let prefilled = plan.iter().map(|(_, n)| n).sum::<usize>() >= GIVE_BACK_AFTER_TOKENS;
        self.prefill(plan);
        t = self.clock.lap(Phase::Prefill, t);
        let super::decode::Decoded {
            mut finished,
            mut starved,
        } = self.decode(t);
        let t = Instant::now();
        // Retire finished sequences (highest index first so indexes stay valid), then handle
        // the ones that found no room.
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        finished.dedup_by_key(|f| f.0);
        for (i, end) in finished {
            let s = self.sched.remove_running(i);
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
            // Its sampled token is in `generated`: the next step computes it (a one-token
            // prefill), so it only needs a free block by then. Preempting a younger one for a
            // sequence starved in the same step may have made that room already.
            if i < self.sched.running().len() && self.pool.free_blocks() == 0 {
                self.pool_full(
                    i,
                    EngineError::PoolExhausted {
                        needed_tokens: 1,
                        free_blocks: 0,
                    },
                );
            }
        }
        let t = self.clock.lap(Phase::Other, t);
        if prefilled && !self.loaded.model.placement.keeps_step_buffers {
            super::give_back_transient_memory();
            self.clock.lap(Phase::Prefill, t);
        }
    }

    /// The pool's ceiling in tokens and bytes, for errors.
    fn ceiling_text(&self) -> String {
        let shape = self.pool.shape();
        let blocks = u64::from(shape.num_blocks);
        format!(
            "{} tokens ({})",
            blocks * shape.block_tokens as u64,
            mlxcel_ipc::size::format_size(blocks * shape.block_bytes() as u64)
        )
    }

    /// Handles a step of sequence `i` that failed.
    pub(super) fn pool_full(&mut self, i: usize, e: EngineError) {
        match e {
            EngineError::PoolExhausted { .. }
                if self.sched.running().len() == 1 && !self.cache.may_free_blocks() =>
            {
                // Alone, nothing to reclaim and no finished request's blocks about to come
                // back (a donation the manager has not answered yet): this can never fit.
                let s = self.sched.remove_running(i);
                let message = format!(
                    "the request needs more KV than the KV pool's ceiling of {} (or the memory \
                     for it could not be allocated); ask for fewer tokens or raise --kv-pool-bytes",
                    self.ceiling_text()
                );
                self.fail(s, WireError::new(ErrorCode::BadRequest, message));
            }
            EngineError::PoolExhausted { .. } => {
                // Ask the cache for room and preempt the youngest running sequence; it keeps
                // its output and sampler and recomputes its K/V when it runs again.
                self.cache.reclaim(1);
                let pool = &mut self.pool;
                self.sched.preempt_youngest(|s| {
                    tracing::info!(request = s.id, "preempting: the KV pool is full");
                    s.kv.free(pool);
                    s.next_logits = None;
                    s.pending = None;
                });
                self.preemptions += 1;
            }
            e => {
                let s = self.sched.remove_running(i);
                tracing::error!(request = s.id, error = %e, "prefill failed");
                self.fail(s, e.wire());
            }
        }
    }
}

/// How a running sequence leaves the batch in a step.
pub(super) enum End {
    /// It finished normally: its blocks are offered to the cache.
    Finished(FinishReason),
    /// It failed: the client gets the error and its blocks are freed.
    Failed(EngineError),
}
