//! The runner executes a step's plan: the planned prefill chunks in one forward pass, one
//! batched decode step for the planned rows, and the sampling on either side, and says which
//! requests ended. It allocates nothing: the plan's blocks are in the sequences' tables.
//!
//! - [`prefill`]: the chunks of a step in one pass (each alone where the pass fails).
//! - [`decode`]: a batched decode step, pipelined: queued on the tokens the step before drew
//!   on the device, before those are read.
//! - [`draws`]: a pass's next tokens, drawn on the device where a row's sampler allows.
//! - [`step_clock`]: where the engine's time went.

use std::time::Instant;

use mlxcel_ipc::proto::daemon::{FinishReason, StepTotals};

use crate::EngineError;
use crate::model::Model;
use crate::pool::BlockPool;
use crate::scheduler::{Job, SeqKey, StepPlan};
use crate::sequence::{Input, Sampled, Sequence};

pub mod decode;
pub mod draws;
pub mod prefill;
pub mod step_clock;

use step_clock::{Phase, StepClock};

/// Prompt tokens a step must compute before it gives their buffers back
/// ([`give_back_transient_memory`]).
const GIVE_BACK_AFTER_TOKENS: usize = 256;

/// How a running request leaves the batch.
#[derive(Debug)]
pub enum End {
    /// It finished normally: its blocks are offered to the cache.
    Finished(FinishReason),
    /// It failed: the client gets the error and its blocks are freed.
    Failed(EngineError),
}

/// The requests that ended in a step, by key.
pub type Ends = Vec<(SeqKey, End)>;

/// The runner's state across steps.
#[derive(Default)]
pub struct Runner {
    /// Draws of next tokens queued so far (names each, so rows of one draw share its arrays).
    draws: u64,
    clock: StepClock,
}

impl Runner {
    /// Samples what waits on the host: each running sequence's logits from its last pass, and
    /// a drawn token that is its last (nothing to compute after it). A sampled token is sent at
    /// once and becomes the sequence's next decode input.
    pub fn settle(&mut self, running: &mut [Sequence]) -> Ends {
        let t = Instant::now();
        let mut ends = Ends::new();
        for s in running.iter_mut() {
            let sampled = if s.next_logits.is_some() {
                s.sample_next()
            } else if matches!(&s.input, Some(Input::Device(_)))
                && s.generated.len() + 1 >= s.max_tokens
            {
                match s.input.take() {
                    Some(Input::Device(p)) => s.accept_drawn(p),
                    _ => continue,
                }
            } else {
                continue;
            };
            match sampled {
                Ok(Sampled::Next(_)) => {}
                Ok(Sampled::Finished(reason)) => ends.push((s.key(), End::Finished(reason))),
                Err(e) => {
                    tracing::error!(request = s.id, error = %e, "sampling failed");
                    ends.push((s.key(), End::Failed(e)));
                }
            }
        }
        self.clock.lap(Phase::Sampling, t);
        ends
    }

    /// Executes `plan` over the running sequences: its prefill chunks, then its decode rows.
    pub fn execute(
        &mut self,
        model: &Model,
        plan: &StepPlan<Sequence>,
        running: &mut [Sequence],
        pool: &mut BlockPool,
    ) -> Ends {
        let t = Instant::now();
        let mut ends = self.prefill(model, &plan.prefill, running, pool);
        let t = self.clock.lap(Phase::Prefill, t);
        ends.extend(self.decode(model, &plan.decode, running, pool, t));
        let prefilled: usize = plan.prefill.iter().map(|(_, n)| n).sum();
        // Only a large prefill's buffers are worth giving back: after the few tokens of a
        // question behind a cached prefix they are small, and the next steps would fault the
        // trimmed pages in again. Where a device keeps them for the next step, MLX's cache
        // limit bounds them instead (`Placement::keeps_step_buffers`).
        if prefilled >= GIVE_BACK_AFTER_TOKENS && !model.placement.keeps_step_buffers {
            let t = Instant::now();
            give_back_transient_memory();
            self.clock.lap(Phase::Prefill, t);
        }
        ends
    }

    /// Counts time spent outside the runner (scheduling, retiring, publishing) since `since`.
    pub fn lap_other(&mut self, since: Instant) {
        self.clock.lap(Phase::Other, since);
    }

    /// Where the engine's time went since it started.
    pub fn totals(&self) -> StepTotals {
        self.clock.totals()
    }

    /// Logs where the time went since the last report (the engine went idle).
    pub fn report(&mut self) {
        self.clock.report();
    }
}

/// What a step's work freed goes back to the system: MLX's buffer cache and glibc's free pages.
/// After a prefill chunk these are its activations (tens of MiB at 512 tokens), which a burst of
/// long prompts would otherwise keep resident on top of the KV it holds.
pub fn give_back_transient_memory() {
    if let Err(e) = mlx_rs::memory::clear_cache() {
        tracing::warn!(error = %e, "cannot clear MLX's buffer cache");
    }
    crate::host_memory::trim_freed_memory();
}

/// The running sequences `keys` names, in `keys`' order, with their position in `keys`.
fn rows<'a>(running: &'a mut [Sequence], keys: &[SeqKey]) -> Vec<(usize, &'a mut Sequence)> {
    let mut rows: Vec<(usize, &mut Sequence)> = running
        .iter_mut()
        .filter_map(|s| keys.iter().position(|k| *k == s.key()).map(|i| (i, s)))
        .collect();
    rows.sort_by_key(|(i, _)| *i);
    rows
}
