//! One request on the engine: its prompt, block table, sampler and progress, what the runner
//! left for it (logits to sample on the host, or its next token drawn on the device), and what
//! the scheduler knows of it ([`Job`]).

use std::time::Instant;

use mlx_rs::Array;
use mlxcel_grammar::{Constraint, Verdict};
use mlxcel_ipc::BlockHash;
use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FinishReason, Pin, RequestId, Usage};

use crate::Result;
use crate::batch_draw::Drawn;
use crate::engine::EventSink;
use crate::sampler::Sampler;
use crate::scheduler::{BlockTable, Job, SeqKey};

/// What sampling the next token did.
pub enum Sampled {
    /// A token was emitted; it must be computed before the next one.
    Next(u32),
    /// Finished; the caller donates its blocks and frees it.
    Finished(FinishReason),
}

/// A running request.
pub struct Sequence {
    pub conn: u64,
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub generated: Vec<u32>,
    pub kv: BlockTable,
    /// Its cached prefix is still being asked of the cache manager (not admissible yet).
    pub awaiting_prefix: bool,
    pub cached_tokens: usize,
    pub sampler: Sampler,
    pub max_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub salt: Option<String>,
    pub events: EventSink,
    pub queued_at: Instant,
    pub started_at: Instant,
    pub prefill_done_at: Option<Instant>,
    /// Logits of the last computed position, waiting to be sampled on the host.
    pub next_logits: Option<Logits>,
    /// The next token to compute: sampled on the host (and sent), or drawn on the device by
    /// the last decode step and not read yet.
    pub input: Option<Input>,
    /// Which tokens may come next (a grammar) and logit biases, if the request has them.
    pub constraint: Option<Constraint>,
    /// Prompt prefixes to keep cached for a while once it finishes.
    pub pins: Vec<Pin>,
}

/// A decode step's input token.
pub enum Input {
    /// Sampled on the host: known, sent, the last of `generated`.
    Host(u32),
    /// Drawn on the device by the last step, not read yet.
    Device(Pending),
}

/// A token drawn on the device ([`crate::batch_draw`]), row `row` of a decode step's or a
/// prefill pass's draw: the next to send, and the input of the next step, which is queued
/// before it is read.
pub struct Pending {
    pub drawn: Drawn,
    pub row: usize,
    /// Which draw it is (the rows of one draw share its arrays).
    pub draw: u64,
}

impl Pending {
    /// Waits for the draw and reads the token and, when `logprob`, its log-probability.
    pub fn read(&self, logprob: bool) -> Result<(u32, Option<f32>)> {
        let internal = |e: mlx_rs::error::AsSliceError| {
            crate::EngineError::Internal(format!("drawn tokens: {e}"))
        };
        let token = self.drawn.tokens.try_as_slice::<u32>().map_err(internal)?;
        let token = *token
            .get(self.row)
            .ok_or_else(|| crate::EngineError::Internal("drawn tokens: no such row".into()))?;
        let logprob = match (&self.drawn.logprobs, logprob) {
            (Some(lp), true) => lp
                .try_as_slice::<f32>()
                .map_err(internal)?
                .get(self.row)
                .copied(),
            _ => None,
        };
        Ok((token, logprob))
    }
}

/// One row of a `[rows, vocab]` (or `[vocab]`) f32 logits array: a batched step's rows share
/// the array, and each is read in place on the host (evaluated then, if it was queued).
pub struct Logits {
    all: Array,
    row: usize,
}

impl Logits {
    /// Row `row` of `all`.
    pub fn row(all: &Array, row: usize) -> Logits {
        Logits {
            all: all.clone(),
            row,
        }
    }

    fn values(&self) -> Result<&[f32]> {
        let all = self
            .all
            .try_as_slice::<f32>()
            .map_err(|e| crate::EngineError::Internal(format!("logits: {e}")))?;
        let vocab = self.all.shape().last().copied().unwrap_or(0) as usize;
        all.get(self.row * vocab..(self.row + 1) * vocab)
            .ok_or_else(|| crate::EngineError::Internal("logits: no such row".into()))
    }
}

impl Job for Sequence {
    fn key(&self) -> SeqKey {
        SeqKey {
            conn: self.conn,
            request: self.id,
        }
    }
    fn tokens(&self) -> usize {
        let drawn = matches!(self.input, Some(Input::Device(_)));
        self.prompt.len() + self.generated.len() + usize::from(drawn)
    }
    fn decoding(&self) -> bool {
        self.input.is_some()
    }
    fn admissible(&self) -> bool {
        !self.awaiting_prefix
    }
    fn table(&self) -> &BlockTable {
        &self.kv
    }
    fn table_mut(&mut self) -> &mut BlockTable {
        &mut self.kv
    }
    fn preempted(&mut self) {
        tracing::info!(request = self.id, "preempted: the KV pool is full");
        self.next_logits = None;
        self.input = None;
    }
}

impl Sequence {
    /// Whether tokens are waiting to be computed (the prompt, or after a preemption the prompt
    /// and the output so far).
    pub fn needs_prefill(&self) -> bool {
        self.kv.len < self.prompt.len() + self.generated.len()
    }

    /// The next at most `chunk` tokens not yet stored.
    pub fn next_piece(&self, chunk: usize) -> Vec<u32> {
        self.prompt
            .iter()
            .chain(self.generated.iter())
            .copied()
            .skip(self.kv.len)
            .take(chunk)
            .collect()
    }

    /// After a prefill pass stored a chunk whose last logits are row `row` of `logits`
    /// (evaluated): once every token is stored, those are the next to sample.
    pub fn prefilled(&mut self, logits: &Array, row: usize) {
        if !self.needs_prefill() {
            // Sampling continues where it stopped (a preempted request's output was already sent).
            self.next_logits = Some(Logits::row(logits, row));
            self.prefill_done_at.get_or_insert_with(Instant::now);
        }
    }

    /// Samples the next token from the last logits, sends it, and says whether to go on (its
    /// token is then the next decode input).
    pub fn sample_next(&mut self) -> Result<Sampled> {
        let Some(logits) = self.next_logits.take() else {
            return Ok(Sampled::Finished(FinishReason::Length));
        };
        let values = logits.values()?;
        let choice = match &self.constraint {
            Some(c) => self.sampler.sample_adjusted(values, |v| c.apply(v)),
            None => self.sampler.sample(values),
        };
        let sampled = self.accept(choice.token, choice.logprob)?;
        if let Sampled::Next(token) = sampled {
            self.input = Some(Input::Host(token));
        }
        Ok(sampled)
    }

    /// Whether the next token's mask depends on the token before it (a grammar): such a row's
    /// draw waits until that token is read.
    pub fn follows_grammar(&self) -> bool {
        self.constraint
            .as_ref()
            .is_some_and(Constraint::has_grammar)
    }

    /// Reads the token `pending` holds for this sequence, sends it, and says whether to go on.
    pub fn accept_drawn(&mut self, pending: Pending) -> Result<Sampled> {
        let (token, logprob) = pending.read(self.sampler.logprobs())?;
        self.sampler.record(token);
        self.accept(token, logprob)
    }

    /// Takes `token` as the next output: a stop token ends the sequence unsent; otherwise it is
    /// sent, and the sequence ends at `max_tokens` or where its grammar is complete. A grammar
    /// then computes the next token's mask.
    fn accept(&mut self, token: u32, logprob: Option<f32>) -> Result<Sampled> {
        if self.stop_ids.contains(&token) {
            return Ok(Sampled::Finished(FinishReason::Stop));
        }
        self.generated.push(token);
        self.events.send(DaemonToFrontend::Token {
            request_id: self.id,
            token,
            logprob,
        });
        if let Some(c) = self.constraint.as_mut() {
            let verdict = c.accept(token).map_err(|e| {
                crate::EngineError::Internal(format!("the answer left its grammar: {e}"))
            })?;
            if verdict == Verdict::Complete {
                return Ok(Sampled::Finished(FinishReason::Stop));
            }
        }
        if self.generated.len() >= self.max_tokens {
            return Ok(Sampled::Finished(FinishReason::Length));
        }
        let remaining = self.max_tokens - self.generated.len();
        if let Some(c) = self.constraint.as_mut() {
            c.prepare(remaining).map_err(|e| {
                crate::EngineError::Internal(format!("the grammar's next mask failed: {e}"))
            })?;
        }
        Ok(Sampled::Next(token))
    }

    /// Forgets this sequence's row of the last decode step: its input token ended the
    /// sequence, so what the step stored and drew for it is void.
    pub fn undo_last_step(&mut self) {
        self.kv.len = self.kv.len.saturating_sub(1);
        self.input = None;
        self.next_logits = None;
    }

    /// Token counts and timings so far.
    pub fn usage(&self) -> Usage {
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_millis() as u64;
        let now = Instant::now();
        let prefill_end = self.prefill_done_at.unwrap_or(now);
        Usage {
            prompt_tokens: self.prompt.len() as u32,
            cached_tokens: self.cached_tokens as u32,
            generated_tokens: self.generated.len() as u32,
            queue_ms: ms(self.queued_at, self.started_at),
            prefill_ms: ms(self.started_at, prefill_end),
            decode_ms: ms(prefill_end, now),
            pinned_tokens: 0,
        }
    }

    /// The tokens whose K/V the sequence's blocks hold, in order.
    pub fn stored_tokens(&self) -> Vec<u32> {
        self.prompt
            .iter()
            .chain(self.generated.iter())
            .copied()
            .take(self.kv.len)
            .collect()
    }

    /// Hashes of the full blocks of the stored tokens, from `seed` (made with this sequence's
    /// salt).
    pub fn full_block_hashes(
        &self,
        seed: &mlxcel_ipc::HashSeed,
        block_tokens: usize,
    ) -> Vec<BlockHash> {
        mlxcel_ipc::block_hash::block_hashes(seed, &self.stored_tokens(), block_tokens)
    }
}
