//! A request's life on the engine: submitted (checked, queued), its cached prefix mapped, and
//! its end (finished and donated to the cache, cancelled, or failed), each answered once.

use std::time::Instant;

use super::events::EventSink;
use mlxcel_grammar::{Constraint, Grammar};
use mlxcel_ipc::proto::ErrorCode;
use mlxcel_ipc::proto::WireError;
use mlxcel_ipc::proto::cache::{DonatedBlock, PinRequest};
use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FinishReason, Generate, RequestId};

use super::cache_link::PinnedEnd;
use super::{Engine, Prefix};
use crate::runner::{End, Ends};
use crate::sampler::Sampler;
use crate::scheduler::{BlockTable, Job, Refusal, StepPlan};
use crate::sequence::Sequence;

impl Engine {
    pub(super) fn submit(&mut self, conn: u64, req: Generate, acquiring: bool, events: EventSink) {
        let ctx = self.loaded.model.config.context_length;
        let refusal = if req.prompt.is_empty() {
            Some("the prompt is empty".to_string())
        } else if req.prompt.len() >= ctx {
            Some(format!(
                "the prompt has {} tokens; the context window is {ctx}",
                req.prompt.len()
            ))
        } else {
            let vocab = self.loaded.model.config.vocab;
            req.prompt
                .iter()
                .chain(req.logit_bias.iter().map(|(t, _)| t))
                .find(|&&t| t as usize >= vocab)
                .map(|bad| format!("token id {bad} is outside the vocabulary"))
        };
        let constraint = match refusal {
            Some(_) => Ok(None),
            None => self.constraint(&req),
        };
        let (refusal, constraint) = match (refusal, constraint) {
            (Some(r), _) | (None, Err(r)) => (Some(r), None),
            (None, Ok(c)) => (None, c),
        };
        if let Some(message) = refusal {
            // A prefix that is still coming finds no request and is unleased then.
            events.send(DaemonToFrontend::Failed {
                request_id: req.request_id,
                error: WireError::new(ErrorCode::BadRequest, message),
            });
            return;
        }
        let now = Instant::now();
        self.sched.push(Sequence {
            conn,
            id: req.request_id,
            sampler: Sampler::new(req.sampling.clone(), &req.prompt).with_logprobs(req.logprobs),
            max_tokens: (req.max_tokens as usize).min(ctx - req.prompt.len()),
            kv: BlockTable::default(),
            prompt: req.prompt,
            generated: Vec::new(),
            awaiting_prefix: acquiring,
            cached_tokens: 0,
            stop_ids: req.stop_ids,
            salt: req.cache_salt,
            events,
            queued_at: now,
            started_at: now,
            prefill_done_at: None,
            next_logits: None,
            input: None,
            constraint,
            pins: req.pins,
        });
    }

    /// The request's constraint (grammar, logit biases) with its first mask computed, if it
    /// has one; a grammar that does not compile is the request's error.
    fn constraint(&self, req: &Generate) -> Result<Option<Constraint>, String> {
        if req.grammar.is_none() && req.logit_bias.is_empty() {
            return Ok(None);
        }
        let grammars = self
            .grammars
            .as_ref()
            .map_err(|e| format!("constrained decoding is unavailable for this model: {e}"))?;
        let grammar = req.grammar.clone().map(Grammar::from_wire);
        let mut c = grammars
            .constraint(grammar.as_ref(), req.logit_bias.clone())
            .map_err(|e| format!("the grammar was refused: {e}"))?;
        let ctx = self.loaded.model.config.context_length;
        let limit = (req.max_tokens as usize).min(ctx.saturating_sub(req.prompt.len()));
        c.prepare(limit)
            .map_err(|e| format!("the grammar was refused: {e}"))?;
        Ok(Some(c))
    }

    /// Maps a request's leased prefix (only blocks the cache really holds for it, and only
    /// blocks that leave at least one prompt token to compute), then ends the lease.
    pub(super) fn prefix(&mut self, conn: u64, request_id: RequestId, prefix: Prefix) {
        let bt = self.config.block_tokens;
        let Some(s) = self
            .sched
            .waiting_mut(|s| s.conn == conn && s.id == request_id && s.awaiting_prefix)
        else {
            // Cancelled or refused meanwhile.
            self.cache.unlease(prefix.lease);
            return;
        };
        let usable = (s.prompt.len() - 1) / bt;
        let mapped = self.cache.map_prefix(
            &mut self.pool,
            &prefix.hashes,
            &prefix.blocks,
            usable,
            prefix.lease,
        );
        s.cached_tokens = mapped.len() * bt;
        s.kv = BlockTable::with_prefix(mapped, bt);
        s.awaiting_prefix = false;
    }

    /// Offers the full blocks to the cache (or frees them), then reports the end. The donation
    /// is queued to the manager first, so a request sent after this `Done` finds its prefix.
    pub(super) fn finish(&mut self, mut s: Sequence, reason: FinishReason) {
        let usage = s.usage();
        let hashes = self
            .cache
            .hash_seed(&self.loaded.model_id, s.salt.as_deref())
            .map_or_else(Vec::new, |seed| {
                s.full_block_hashes(&seed, self.config.block_tokens)
            });
        let offered: Vec<DonatedBlock> = hashes
            .iter()
            .zip(&s.kv.blocks)
            .map(|(&hash, &block)| DonatedBlock { hash, block })
            .collect();
        let bt = self.config.block_tokens;
        let pins: Vec<PinRequest> = s
            .pins
            .iter()
            .map(|p| PinRequest {
                blocks: (p.tokens as usize / bt).min(offered.len()) as u32,
                ttl_secs: p.ttl_secs,
            })
            .filter(|p| p.blocks > 0)
            .collect();
        let end = PinnedEnd {
            events: s.events.clone(),
            request_id: s.id,
            finish: reason,
            usage,
            block_tokens: bt,
        };
        // With pins, `Done` waits for the outcome to report what the cache pinned.
        let deferred = !pins.is_empty();
        let seq = std::mem::take(&mut s.kv);
        let then = deferred.then_some(end);
        match self
            .cache
            .donate(&mut self.pool, seq.blocks, offered, pins, then)
        {
            Some(end) => end.send(0),
            None if !deferred => s.events.send(DaemonToFrontend::Done {
                request_id: s.id,
                finish: reason,
                usage,
            }),
            None => {}
        }
    }

    pub(super) fn cancel(&mut self, matches: impl Fn(&Sequence) -> bool) {
        for mut s in self.sched.take(matches) {
            let usage = s.usage();
            s.events.send(DaemonToFrontend::Done {
                request_id: s.id,
                finish: FinishReason::Cancelled,
                usage,
            });
            s.kv.free(&mut self.pool);
        }
    }

    /// Ends a request with an error and gives back what it held.
    pub(super) fn fail(&mut self, mut s: Sequence, error: WireError) {
        s.events.send(DaemonToFrontend::Failed {
            request_id: s.id,
            error,
        });
        s.kv.free(&mut self.pool);
    }

    /// What a step's plan asks of the engine besides the work: the admitted requests' start
    /// times, the cache asked for the blocks the pool lacked, the refused requests failed.
    pub(super) fn planned(&mut self, plan: &mut StepPlan<Sequence>) {
        let now = Instant::now();
        for s in self.sched.running_mut() {
            if plan.admitted.contains(&s.key()) {
                s.started_at = now;
            }
        }
        self.preemptions += plan.preempted.len() as u64;
        if let Some(short) = plan.short {
            self.cache.reclaim(short.max(1));
        }
        for (s, refusal) in std::mem::take(&mut plan.refused) {
            let message = self.refusal(&s, refusal);
            self.fail(s, WireError::new(ErrorCode::BadRequest, message));
        }
    }

    /// Answers the requests that ended and gives back what they held.
    pub(super) fn retire(&mut self, ends: Ends) {
        for (key, end) in ends {
            let Some(s) = self.sched.remove(key) else {
                continue;
            };
            match end {
                End::Finished(reason) => self.finish(s, reason),
                End::Failed(e) => self.fail(s, e.wire()),
            }
        }
    }

    /// What a refused request is told.
    fn refusal(&self, s: &Sequence, refusal: Refusal) -> String {
        let shape = self.pool.shape();
        let blocks = u64::from(shape.num_blocks);
        let ceiling = format!(
            "{} tokens ({})",
            blocks * shape.block_tokens as u64,
            mlxcel_ipc::size::format_size(blocks * shape.block_bytes() as u64)
        );
        match refusal {
            Refusal::LongerThanPool { .. } => format!(
                "the prompt needs {} tokens of KV, more than the KV pool's ceiling of {ceiling}; \
                 send a shorter prompt or raise --kv-pool-bytes",
                s.prompt.len() + 1
            ),
            Refusal::NoRoom => format!(
                "the request needs more KV than the KV pool's ceiling of {ceiling} (or the memory \
                 for it could not be allocated); ask for fewer tokens or raise --kv-pool-bytes"
            ),
        }
    }
}
