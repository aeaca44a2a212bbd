//! A step's batched decode, pipelined: the step is queued on the tokens the step before drew
//! on the device ([`crate::batch_draw`]) before those are read, so the host builds and encodes
//! step n+1 while the device still runs step n; then step n's tokens are read and sent.
//!
//! A row whose token turns out to end it (a stop token) was computed once for nothing: its
//! stored length is set back. Rows the device does not draw (penalties; top-k/top-p on a CPU)
//! keep their logits and are sampled on the host before the next step ([`Runner::settle`]).
//!
//! A row that follows a grammar needs the token before to know which tokens its draw may
//! take: such a step queues its forward pass first, reads the last step's tokens and computes
//! the masks while the pass runs, and then queues the draw with the masks as bias rows.

use std::time::Instant;

use mlx_rs::Array;

use super::step_clock::Phase;
use super::{End, Ends, Runner, rows};
use crate::model::Model;
use crate::paged::PagedBatch;
use crate::pool::BlockPool;
use crate::scheduler::{BlockTable, Job, SeqKey};
use crate::sequence::{Input, Sampled, Sequence};
use crate::{EngineError, Result};

impl Runner {
    /// Queues one batched step for the sequences `keys` (each with its next token as its
    /// input and room for it), then reads and sends the tokens the last step drew.
    pub(super) fn decode(
        &mut self,
        model: &Model,
        keys: &[SeqKey],
        running: &mut [Sequence],
        pool: &mut BlockPool,
        t: Instant,
    ) -> Ends {
        let mut ends = Ends::new();
        let mut rows = rows(running, keys);
        let mut inputs: Vec<Input> = Vec::with_capacity(rows.len());
        rows.retain_mut(|(_, s)| match s.input.take() {
            Some(input) => {
                inputs.push(input);
                true
            }
            None => false,
        });
        if rows.is_empty() {
            return ends;
        }
        self.draws += 1;
        let mut seqs: Vec<&mut Sequence> = rows.into_iter().map(|(_, s)| s).collect();
        // A grammar's mask for this step's token needs the last step's token: such a step is
        // queued first, then those tokens are read and the masks computed while it runs, and
        // only then is the draw queued.
        let wait_for_masks = seqs.iter().any(|s| s.follows_grammar());
        let step = queue_forward(model, &mut seqs, &inputs, pool).and_then(|logits| {
            if wait_for_masks {
                mlx_rs::transforms::async_eval([&logits])?;
            } else {
                queue_draw(&mut seqs, &logits, model, self.draws)?;
            }
            Ok(logits)
        });
        let t = self.clock.lap(Phase::Model, t);
        self.clock.decoded(seqs.len());
        let logits = match step {
            Ok(logits) => logits,
            Err(e) => {
                tracing::error!(error = %e, "batched decode step failed");
                for s in seqs {
                    let e = EngineError::Internal(format!("the decode step failed: {e}"));
                    ends.push((s.key(), End::Failed(e)));
                }
                return ends;
            }
        };
        // Step n is queued: read and send what step n-1 drew.
        let mut finished = Vec::new();
        for (r, (s, input)) in seqs.iter_mut().zip(inputs).enumerate() {
            let Input::Device(p) = input else { continue };
            match s.accept_drawn(p) {
                Ok(Sampled::Next(_)) => {}
                Ok(Sampled::Finished(reason)) => {
                    finished.push(r);
                    ends.push((s.key(), End::Finished(reason)));
                }
                Err(e) => {
                    finished.push(r);
                    ends.push((s.key(), End::Failed(e)));
                }
            }
        }
        let t = self.clock.lap(Phase::Sampling, t);
        if wait_for_masks && let Err(e) = queue_draw(&mut seqs, &logits, model, self.draws) {
            tracing::error!(error = %e, "a constrained draw failed");
            for (r, s) in seqs.iter().enumerate() {
                if !finished.contains(&r) {
                    let e = EngineError::Internal(format!("the draw failed: {e}"));
                    ends.push((s.key(), End::Failed(e)));
                }
            }
        }
        // What the step stored and drew for a row that had already ended is void.
        for r in finished {
            seqs[r].undo_last_step();
        }
        self.clock.lap(Phase::Model, t);
        ends
    }
}

/// Queues one decode step's forward pass over `seqs` (row `r`'s input token `inputs[r]`).
fn queue_forward(
    model: &Model,
    seqs: &mut [&mut Sequence],
    inputs: &[Input],
    pool: &mut BlockPool,
) -> Result<Array> {
    let ids = step_ids(inputs)?;
    let kv: Vec<&mut BlockTable> = seqs.iter_mut().map(|s| &mut s.kv).collect();
    let mut batch_kv = PagedBatch::new(kv, pool);
    model.forward_step(&ids, &mut batch_kv)
}

/// Queues the draw of each row's next token from `logits` on the device, or leaves the row's
/// logits for the host.
fn queue_draw(seqs: &mut [&mut Sequence], logits: &Array, model: &Model, draw: u64) -> Result<()> {
    let queued = super::draws::draw_next(seqs, logits, model.placement.gpu, draw)?;
    mlx_rs::transforms::async_eval(&queued)?;
    Ok(())
}

/// The step's token ids in `batch`'s order: the host's and the last step's draws, without a
/// copy when the rows are exactly one draw's rows in order.
fn step_ids(batch: &[Input]) -> Result<Array> {
    let mut draws: Vec<(u64, &Array)> = Vec::new();
    for input in batch {
        if let Input::Device(p) = input
            && !draws.iter().any(|(d, _)| *d == p.draw)
        {
            draws.push((p.draw, &p.drawn.tokens));
        }
    }
    let host: Vec<u32> = batch
        .iter()
        .filter_map(|i| match i {
            Input::Host(t) => Some(*t),
            Input::Device(_) => None,
        })
        .collect();
    if let ([(_, tokens)], true) = (draws.as_slice(), host.is_empty()) {
        let in_order = batch
            .iter()
            .enumerate()
            .all(|(r, i)| matches!(i, Input::Device(p) if p.row == r));
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
        .map(|input| match input {
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
