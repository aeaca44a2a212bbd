//! A step's batched decode, pipelined: the step is queued on the tokens the step before drew
//! on the device ([`crate::batch_draw`]) before those are read, so the host builds and encodes
//! step n+1 while the device still runs step n; then step n's tokens are read and sent.
//!
//! A row whose token turns out to end it (a stop token) was computed once for nothing: its
//! stored length is set back. Rows the device does not draw (penalties; top-k/top-p on a CPU)
//! keep their logits and are sampled on the host at the next step, as before.

use std::time::Instant;

use mlx_rs::Array;

use super::Engine;
use super::sequence::{Pending, Sampled, Sequence};
use super::step::End;
use super::step_clock::Phase;
use crate::paged::{PagedBatch, PagedSeq};
use crate::{EngineError, Result};

/// A decode row's input token.
enum Input {
    /// Sampled on the host, known.
    Host(u32),
    /// Drawn on the device by the last step, not read yet.
    Device(Pending),
}

/// What a decode step left for the step's end: sequences to retire and sequences that found no
/// room for their next token (running indexes).
#[derive(Default)]
pub(super) struct Decoded {
    pub finished: Vec<(usize, End)>,
    pub starved: Vec<usize>,
}

impl Engine {
    /// Samples what waits on the host, queues one batched step for every sequence ready to go
    /// on, then reads and sends the tokens the last step drew.
    pub(super) fn decode(&mut self, mut t: Instant) -> Decoded {
        let mut out = Decoded::default();
        let mut inputs: Vec<(usize, Input)> = Vec::new();
        for (i, s) in self.sched.running_mut().iter_mut().enumerate() {
            if s.needs_prefill() {
                continue;
            }
            let sampled = if s.next_logits.is_some() {
                s.sample_next()
            } else if let Some(p) = s.pending.take() {
                if s.generated.len() + 1 < s.max_tokens {
                    inputs.push((i, Input::Device(p)));
                    continue;
                }
                // Its last token: nothing to compute after it.
                s.accept_drawn(p)
            } else {
                continue;
            };
            match sampled {
                Ok(Sampled::Next(token)) => inputs.push((i, Input::Host(token))),
                Ok(Sampled::Finished(reason)) => out.finished.push((i, End::Finished(reason))),
                Err(e) => {
                    tracing::error!(request = s.id, error = %e, "sampling failed");
                    out.finished.push((i, End::Failed(e)));
                }
            }
        }
        t = self.clock.lap(Phase::Sampling, t);
        // Room for one more token each (sequences are untouched until the batch runs). A row
        // without room has its token read now: the next step computes it as a one-token prefill.
        let mut batch: Vec<(usize, Input)> = Vec::new();
        for (i, input) in inputs {
            let s = &mut self.sched.running_mut()[i];
            if s.kv.reserve(&mut self.pool, 1) {
                batch.push((i, input));
                continue;
            }
            if let Input::Device(p) = input {
                match s.accept_drawn(p) {
                    Ok(Sampled::Next(_)) => {}
                    Ok(Sampled::Finished(reason)) => {
                        out.finished.push((i, End::Finished(reason)));
                        continue;
                    }
                    Err(e) => {
                        out.finished.push((i, End::Failed(e)));
                        continue;
                    }
                }
            }
            out.starved.push(i);
        }
        if batch.is_empty() {
            return out;
        }
        self.draws += 1;
        let result = self.queue_step(&batch);
        t = self.clock.lap(Phase::Model, t);
        self.clock.decoded(batch.len());
        if let Err(e) = result {
            tracing::error!(error = %e, "batched decode step failed");
            for &(i, _) in &batch {
                let e = EngineError::Internal(format!("the decode step failed: {e}"));
                out.finished.push((i, End::Failed(e)));
            }
            return out;
        }
        // Step n is queued: read and send what step n-1 drew.
        for (i, input) in batch {
            let Input::Device(p) = input else { continue };
            let s = &mut self.sched.running_mut()[i];
            match s.accept_drawn(p) {
                Ok(Sampled::Next(_)) => {}
                Ok(Sampled::Finished(reason)) => {
                    s.undo_last_step();
                    out.finished.push((i, End::Finished(reason)));
                }
                Err(e) => out.finished.push((i, End::Failed(e))),
            }
        }
        self.clock.lap(Phase::Sampling, t);
        out
    }

    /// Queues one decode step over `batch` (running index, input token) and leaves each row's
    /// next token drawn on the device ([`Sequence::pending`]) or its logits for the host.
    fn queue_step(&mut self, batch: &[(usize, Input)]) -> Result<()> {
        let ids = step_ids(batch)?;
        let gpu = self.loaded.model.placement.gpu;
        let draw = self.draws;
        let pool = &mut self.pool;
        let mut seqs: Vec<&mut Sequence> = self
            .sched
            .running_mut()
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| batch.iter().any(|(b, _)| b == i))
            .map(|(_, s)| s)
            .collect();
        let logits = {
            let kv: Vec<&mut PagedSeq> = seqs.iter_mut().map(|s| &mut s.kv).collect();
            let mut batch_kv = PagedBatch::new(kv, pool);
            self.loaded.model.forward_step(&ids, &mut batch_kv)?
        };
        let queued = super::draws::draw_next(&mut seqs, &logits, gpu, draw)?;
        if pipelined() {
            mlx_rs::transforms::async_eval(&queued)?;
        } else {
            mlx_rs::transforms::eval(&queued)?;
        }
        Ok(())
    }
}

/// Whether a step is queued before the last one's tokens are read (the default);
/// `MLXCEL_DECODE_PIPELINE=0` waits for each step instead, to measure what the overlap buys.
pub(super) fn pipelined() -> bool {
    static ON: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| std::env::var("MLXCEL_DECODE_PIPELINE").as_deref() != Ok("0"));
    *ON
}

/// The step's token ids in `batch`'s order: the host's and the last step's draws, without a
/// copy when the rows are exactly one draw's rows in order.
fn step_ids(batch: &[(usize, Input)]) -> Result<Array> {
    let mut draws: Vec<(u64, &Array)> = Vec::new();
    for (_, input) in batch {
        if let Input::Device(p) = input
            && !draws.iter().any(|(d, _)| *d == p.draw)
        {
            draws.push((p.draw, &p.drawn.tokens));
        }
    }
    let host: Vec<u32> = batch
        .iter()
        .filter_map(|(_, i)| match i {
            Input::Host(t) => Some(*t),
            Input::Device(_) => None,
        })
        .collect();
    if let ([(_, tokens)], true) = (draws.as_slice(), host.is_empty()) {
        let in_order = batch
            .iter()
            .enumerate()
            .all(|(r, (_, i))| matches!(i, Input::Device(p) if p.row == r));
        if in_order && tokens.shape() == [batch.len() as i32] {
            return Ok((*tokens).clone());
        }
    }
    if draws.is_empty() {
        return Ok(Array::from_slice(&host, &[host.len() as i32]));
    }
    // Where each draw's rows start in the concatenation (host tokens last).
    let mut starts = Vec::with_capacity(draws.len());
    let mut sources: Vec<Array> = Vec::with_capacity(draws.len() + 1);
    let mut at = 0i32;
    for (_, tokens) in &draws {
        starts.push(at);
        at += tokens.shape().first().copied().unwrap_or(0);
        sources.push((*tokens).clone());
    }
    sources.push(Array::from_slice(&host, &[host.len() as i32]));
    let mut next_host = at;
    let index: Vec<i32> = batch
        .iter()
        .map(|(_, input)| match input {
            Input::Host(_) => {
                next_host += 1;
                next_host - 1
            }
            Input::Device(p) => {
                let d = draws.iter().position(|(d, _)| *d == p.draw).unwrap_or(0);
                starts[d] + p.row as i32
            }
        })
        .collect();
    let all = mlx_rs::ops::concatenate(&sources, 0)?;
    Ok(all.take_axis(Array::from_slice(&index, &[batch.len() as i32]), 0)?)
}
