//! What one step does, as the scheduler decides it: a [`StepPlan`] keyed by request.

use mlxcel_ipc::BlockId;
use mlxcel_ipc::proto::daemon::RequestId;

/// Names a request across the engine (a request id is unique on its connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqKey {
    pub conn: u64,
    pub request: RequestId,
}

/// Why a request was taken out of the scheduler without running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It needs more blocks than the whole pool has (`tokens` of K/V).
    LongerThanPool { tokens: usize },
    /// It runs alone, the pool has no room for its next tokens, and nothing (no cached block,
    /// no donation in flight) can give any back.
    NoRoom,
}

/// One step: which requests prefill how many tokens, which decode one, which gave way, and the
/// blocks allocated and freed for that.
#[derive(Debug)]
pub struct StepPlan<J> {
    /// Requests admitted this step (their cached prefix is mapped; they run from now on).
    pub admitted: Vec<SeqKey>,
    /// Prefill chunks, oldest first: request and tokens.
    pub prefill: Vec<(SeqKey, usize)>,
    /// Requests that decode one token, in running order.
    pub decode: Vec<SeqKey>,
    /// Requests preempted to make room (back at the front of the queue, their output kept).
    pub preempted: Vec<SeqKey>,
    /// Blocks allocated this step, by request.
    pub allocated: Vec<(SeqKey, Vec<BlockId>)>,
    /// Block references dropped by preemptions.
    pub freed: Vec<BlockId>,
    /// Requests taken out, with why: to be failed.
    pub refused: Vec<(J, Refusal)>,
    /// Blocks the pool lacked for the oldest waiting request or a planned chunk: ask the cache
    /// to give them back.
    pub short: Option<u32>,
}

impl<J> Default for StepPlan<J> {
    fn default() -> Self {
        StepPlan {
            admitted: Vec::new(),
            prefill: Vec::new(),
            decode: Vec::new(),
            preempted: Vec::new(),
            allocated: Vec::new(),
            freed: Vec::new(),
            refused: Vec::new(),
            short: None,
        }
    }
}

impl<J> StepPlan<J> {
    /// Whether the step computes anything.
    pub fn has_work(&self) -> bool {
        !self.prefill.is_empty() || !self.decode.is_empty()
    }

    /// Notes `blocks` more missing.
    pub(super) fn lack(&mut self, blocks: u32) {
        self.short = Some(self.short.unwrap_or(0).max(blocks));
    }
}
