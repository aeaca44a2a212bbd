//! The scheduler: which requests run, which wait, how many prompt tokens each step computes,
//! and who gives way when the pool is full. Pure bookkeeping over [`Job`]s: no MLX, no pool, no
//! sockets, so every rule here is unit-tested with fakes (`scheduler/tests.rs`).
//!
//! - **Admission** is FIFO by free blocks: the oldest admissible waiting job (its cached prefix
//!   is known) starts when the blocks its stored-to-be tokens need are free, counting what jobs
//!   admitted in the same round will take; a job that does not fit stops admission (no
//!   overtaking), and one that could never fit the whole pool is handed back to be refused.
//! - **Prefill budget**: one step computes at most `prefill_budget` prompt tokens across all
//!   running jobs, oldest first, so a burst of arrivals is prefilled over several steps while
//!   the jobs already decoding keep advancing between the chunks. With `whole_chunks`, a job
//!   whose remaining tokens do not fit what is left of the budget waits for a later step
//!   (where it comes first) instead of adding a piece: each chunk costs its own ops in every
//!   layer, so a burst of prompts costs one chunk each, not two for every one split.
//! - **Preemption** takes the youngest running job (the last admitted): it goes back to the
//!   front of the queue, keeps its output, and recomputes its K/V when it runs again.

use std::collections::VecDeque;

/// What the scheduler needs to know of a request.
pub trait Job {
    /// Tokens whose K/V must be stored before it can sample (prompt and output so far).
    fn tokens(&self) -> usize;
    /// Tokens whose K/V is stored.
    fn stored(&self) -> usize;
    /// Blocks it holds now (a mapped cached prefix, or what it computed).
    fn blocks(&self) -> usize;
    /// Whether it may start (false while its cached prefix is still being asked for).
    fn admissible(&self) -> bool;
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

/// What one admission round did.
#[derive(Debug, Default)]
pub struct Admission<J> {
    /// Jobs started this round.
    pub started: usize,
    /// Jobs that need more blocks than the whole pool has (and nothing runs that could end):
    /// to be refused.
    pub unfit: Vec<J>,
    /// Blocks missing for the oldest waiting job (ask the cache to give them back).
    pub short: Option<u32>,
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

    /// Blocks `job` still needs for all of its tokens.
    fn need(&self, job: &J) -> u32 {
        job.tokens()
            .div_ceil(self.limits.block_tokens)
            .saturating_sub(job.blocks()) as u32
    }

    /// Starts waiting jobs, oldest first, while `free` of the pool's `total` blocks hold them.
    pub fn admit(&mut self, mut free: u32, total: u32) -> Admission<J> {
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
    /// tokens, oldest first, within the step's budget.
    pub fn prefill_plan(&self) -> Vec<(usize, usize)> {
        let mut left = self.limits.prefill_budget;
        let mut plan = Vec::new();
        for (i, job) in self.running.iter().enumerate() {
            if left == 0 {
                break;
            }
            let todo = job.tokens().saturating_sub(job.stored());
            if todo > left && self.limits.whole_chunks && !plan.is_empty() {
                continue;
            }
            if todo > 0 {
                let n = todo.min(left);
                plan.push((i, n));
                left -= n;
            }
        }
        plan
    }

    /// Moves the youngest running job back to the front of the queue after `undo` (which frees
    /// its blocks); its index, or None when nothing runs.
    pub fn preempt_youngest(&mut self, undo: impl FnOnce(&mut J)) -> Option<usize> {
        let mut job = self.running.pop()?;
        undo(&mut job);
        self.waiting.push_front(job);
        Some(self.running.len())
    }

    /// Takes running job `i` out (it finished or failed).
    pub fn remove_running(&mut self, i: usize) -> J {
        self.running.remove(i)
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

#[cfg(test)]
mod tests;
