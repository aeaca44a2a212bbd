//! The scheduler: which requests run, which wait, how many prompt tokens each step computes,
//! who gives way when the pool is full, and the blocks all of that takes. One call,
//! [`Scheduler::schedule`], returns a step's [`StepPlan`]; it is the only place blocks are
//! allocated. Pure bookkeeping over [`Job`]s and a pool of [`Blocks`]: no MLX, no sockets, so
//! every rule here is tested with fakes (`tests/scheduler_plans.rs`, plans step by step and a
//! property test over random runs).
//!
//! - **Admission** is FIFO by free blocks: the oldest admissible waiting job (its cached prefix
//!   is known) starts when the blocks its stored-to-be tokens need are free, counting what jobs
//!   admitted in the same round will take; a job that does not fit stops admission (no
//!   overtaking), and one that could never fit the whole pool is refused.
//! - **Prefill budget**: one step computes at most `prefill_budget` prompt tokens across all
//!   running jobs, oldest first, so a burst of arrivals is prefilled over several steps while
//!   the jobs already decoding keep advancing between the chunks. With `whole_chunks`, a job
//!   whose remaining tokens do not fit what is left of the budget waits for a later step
//!   (where it comes first) instead of adding a piece: each chunk costs its own ops in every
//!   layer, so a burst of prompts costs one chunk each, not two for every one split.
//! - **Decode**: every running job whose next token is a drawn one computes it.
//! - **Allocation and preemption**: the planned work gets its blocks oldest job first; when the
//!   pool is short, the youngest running job gives way (its blocks freed, back to the front of
//!   the queue, its output kept: it recomputes its K/V when it runs again), until the job at
//!   hand fits or is itself the youngest. A job that runs alone and still does not fit, with
//!   nothing the cache could give back, is refused.

use std::collections::VecDeque;

mod blocks;
mod plan;

pub use blocks::{BlockTable, Blocks};
pub use plan::{Refusal, SeqKey, StepPlan};

/// What the scheduler needs to know of a request.
pub trait Job {
    fn key(&self) -> SeqKey;
    /// Tokens whose K/V must be stored before it can draw its next token (prompt, output so
    /// far, and a drawn token not yet computed).
    fn tokens(&self) -> usize;
    /// Whether its one token left to compute is a decode input (a token it drew), not part of
    /// a prompt or of output being recomputed after a preemption.
    fn decoding(&self) -> bool;
    /// Whether it may start (false while its cached prefix is still being asked for).
    fn admissible(&self) -> bool;
    fn table(&self) -> &BlockTable;
    fn table_mut(&mut self) -> &mut BlockTable;
    /// It gave way: forget what was computed for it beyond its output (its blocks are freed).
    fn preempted(&mut self);
}

/// The scheduler's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Jobs running at once.
    pub max_running: usize,
    /// Tokens per KV block.
    pub block_tokens: usize,
    /// Prompt tokens computed per step, across all jobs.
    pub prefill_budget: usize,
    /// A job is split across steps only where it comes first in its step.
    pub whole_chunks: bool,
}

/// What an admission round did.
struct Admission<J> {
    started: usize,
    unfit: Vec<J>,
    short: Option<u32>,
}

/// Waiting and running jobs.
#[derive(Debug)]
pub struct Scheduler<J> {
    limits: Limits,
    /// Oldest first.
    waiting: VecDeque<J>,
    /// In admission order: the last is the youngest.
    running: Vec<J>,
}

impl<J: Job> Scheduler<J> {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Queues a new job behind the others.
    pub fn push(&mut self, job: J) {
        self.waiting.push_back(job);
    }

    /// One step's plan: admission, the prefill chunks within the budget, the decode rows, and
    /// the blocks for all of them from `pool`, preempting the youngest where it is short.
    /// `reclaimable`: whether blocks may come back without a running job ending (the cache holds
    /// some, or a donation is in flight), so that a job alone is not refused while they might.
    pub fn schedule(&mut self, pool: &mut impl Blocks, reclaimable: bool) -> StepPlan<J> {
        let mut plan = StepPlan::default();
        let admission = self.admit(pool.free_blocks(), pool.total_blocks());
        let first_new = self.running.len() - admission.started;
        plan.admitted = self.running[first_new..].iter().map(Job::key).collect();
        let bt = self.limits.block_tokens;
        for job in admission.unfit {
            let tokens = job.tokens();
            plan.refused.push((job, Refusal::LongerThanPool { tokens }));
        }
        if let Some(short) = admission.short {
            plan.lack(short);
        }
        // The work, in running order (oldest first): tokens to compute, and whether a decode.
        let prefill = self.prefill_plan();
        let work: Vec<(SeqKey, usize, bool)> = self
            .running
            .iter()
            .enumerate()
            .filter_map(|(i, j)| {
                let todo = j.tokens().saturating_sub(j.table().len);
                if j.decoding() && todo == 1 {
                    return Some((j.key(), 1, true));
                }
                let n = prefill.iter().find(|p| p.0 == i)?.1;
                Some((j.key(), n, false))
            })
            .collect();
        for (key, n, decode) in work {
            let Some(mut at) = self.position(key) else {
                continue; // preempted for an older job's room
            };
            let fits = loop {
                let missing = self.running[at].table().missing(n, bt);
                if missing == 0 {
                    break true;
                }
                if let Some(ids) = self.running[at].table_mut().grow(pool, n) {
                    plan.allocated.push((key, ids));
                    break true;
                }
                plan.lack(missing.saturating_sub(pool.free_blocks() as usize).max(1) as u32);
                let youngest = self.running.len() - 1;
                if youngest != at {
                    self.preempt(youngest, pool, &mut plan);
                    at = self.position(key).unwrap_or(at);
                    continue;
                }
                if self.running.len() == 1 && !reclaimable {
                    let job = self.running.remove(at);
                    plan.refused.push((job, Refusal::NoRoom));
                } else {
                    self.preempt(at, pool, &mut plan);
                }
                break false;
            };
            if fits && decode {
                plan.decode.push(key);
            } else if fits {
                plan.prefill.push((key, n));
            }
        }
        plan
    }

    /// Moves running job `i` back to the front of the queue, its blocks freed.
    fn preempt(&mut self, i: usize, pool: &mut impl Blocks, plan: &mut StepPlan<J>) {
        let mut job = self.running.remove(i);
        plan.freed.extend(job.table_mut().free(pool));
        job.preempted();
        plan.preempted.push(job.key());
        plan.prefill.retain(|p| p.0 != job.key());
        plan.decode.retain(|k| *k != job.key());
        self.waiting.push_front(job);
    }

    fn position(&self, key: SeqKey) -> Option<usize> {
        self.running.iter().position(|j| j.key() == key)
    }

    /// Blocks `job` still needs for all of its tokens.
    fn need(&self, job: &J) -> u32 {
        job.tokens()
            .div_ceil(self.limits.block_tokens)
            .saturating_sub(job.table().blocks.len()) as u32
    }

    /// Starts waiting jobs, oldest first, while `free` of the pool's `total` blocks hold them.
    fn admit(&mut self, mut free: u32, total: u32) -> Admission<J> {
        let mut out = Admission {
            started: 0,
            unfit: Vec::new(),
            short: None,
        };
        while self.running.len() < self.limits.max_running {
            let Some(at) = self.waiting.iter().position(Job::admissible) else {
                break;
            };
            let need = self.need(&self.waiting[at]);
            if need > free {
                if self.running.is_empty() && need > total {
                    // Can never fit: refuse it rather than wait forever.
                    out.unfit.extend(self.waiting.remove(at));
                    continue;
                }
                out.short = Some(need - free);
                break;
            }
            free -= need;
            self.running.extend(self.waiting.remove(at));
            out.started += 1;
        }
        out
    }

    /// This step's prefill work: `(running index, tokens)` for the jobs still computing their
    /// tokens (not a decode input), oldest first, within the step's budget.
    fn prefill_plan(&self) -> Vec<(usize, usize)> {
        let mut left = self.limits.prefill_budget;
        let mut plan = Vec::new();
        for (i, job) in self.running.iter().enumerate() {
            if left == 0 {
                break;
            }
            let todo = job.tokens().saturating_sub(job.table().len);
            if todo == 0 || (job.decoding() && todo == 1) {
                continue;
            }
            if todo > left && self.limits.whole_chunks && !plan.is_empty() {
                continue;
            }
            let n = todo.min(left);
            plan.push((i, n));
            left -= n;
        }
        plan
    }

    /// Takes the job `key` out, running or waiting (it finished, failed or was cancelled).
    pub fn remove(&mut self, key: SeqKey) -> Option<J> {
        if let Some(i) = self.position(key) {
            return Some(self.running.remove(i));
        }
        let i = self.waiting.iter().position(|j| j.key() == key)?;
        self.waiting.remove(i)
    }

    /// Takes every job, running or waiting, that `matches`.
    pub fn take(&mut self, matches: impl Fn(&J) -> bool) -> Vec<J> {
        let (gone, keep): (Vec<_>, Vec<_>) = self.running.drain(..).partition(|j| matches(j));
        self.running = keep;
        let (waiting_gone, keep): (Vec<_>, Vec<_>) =
            self.waiting.drain(..).partition(|j| matches(j));
        self.waiting = keep.into();
        gone.into_iter().chain(waiting_gone).collect()
    }

    pub fn running(&self) -> &[J] {
        &self.running
    }

    pub fn running_mut(&mut self) -> &mut [J] {
        &mut self.running
    }

    /// The waiting job that `matches`, to update in place.
    pub fn waiting_mut(&mut self, matches: impl Fn(&J) -> bool) -> Option<&mut J> {
        self.waiting.iter_mut().find(|j| matches(j))
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty()
    }

    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }
}
