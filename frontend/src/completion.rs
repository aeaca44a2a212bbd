//! One generation as text: the daemon's token events turned into text pieces (incremental
//! detokenization, stop strings), then a final piece with the finish reason and usage. Both
//! routes, streaming or not, read a [`Completion`]; dropping it cancels the request.

use std::sync::Arc;
use std::time::Instant;

use mlxcel_ipc::proto::ErrorCode;
use mlxcel_ipc::proto::daemon::{FinishReason, Generate, Usage as DaemonUsage};

use crate::daemon_link::{Event, Generation, Session};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::response::TokenLogprob;
use crate::queue::QueueSlot;
use crate::recall::Recall;
use crate::text::ModelText;
use crate::text::detokenize::IncrementalDecoder;
use crate::text::stop::StopMatcher;
use crate::validate::ValidRequest;

/// What a completion yields, in order: text pieces, then one `Finished`.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text {
        text: String,
        /// The tokens behind this piece (when logprobs were asked for).
        logprobs: Vec<TokenLogprob>,
        /// How many tokens it took.
        tokens: u32,
    },
    Finished {
        finish: Finish,
        usage: Tally,
    },
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// The model ended its turn (or its grammar was complete).
    Stop,
    /// A stop string matched (not part of the text).
    StopSequence(String),
    /// The token limit.
    Length,
    Cancelled,
}

/// Token counts of a finished generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    pub prompt: u32,
    /// Prompt tokens read from the prefix cache.
    pub cached: u32,
    /// Prompt tokens the cache holds pinned after it (requests with breakpoints).
    pub pinned: u32,
    /// Tokens the client received.
    pub completion: u32,
    /// Of those, reasoning.
    pub reasoning: u32,
}

impl Tally {
    fn new(daemon: &DaemonUsage, completion: u32) -> Self {
        Self {
            prompt: daemon.prompt_tokens,
            cached: daemon.cached_tokens,
            pinned: daemon.pinned_tokens,
            completion,
            reasoning: 0,
        }
    }
}

/// A running generation, read piece by piece.
pub struct Completion {
    generation: Generation,
    model: Arc<ModelText>,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    /// Our place in the waiting queue, given back at the first token.
    slot: Option<QueueSlot>,
    logprobs: bool,
    /// Tokens the client receives (those after a stop string are not counted).
    tokens: u32,
    /// A stop string matched; we cancelled and wait for the daemon's `Done` (for usage).
    stopped: bool,
    /// The final piece, held while a last text piece goes out.
    queued: Option<Piece>,
    ended: bool,
    /// The prompt's length (for usage if the daemon's report is lost after a stop string).
    prompt_tokens: u32,
    metrics: Arc<Metrics>,
    started: Instant,
    first_token: bool,
    /// Where the finished answer is remembered (prompt, salt, every token generated).
    recall: Option<(Arc<Recall>, Option<String>, Vec<u32>)>,
    generated: Vec<u32>,
}

impl Completion {
    /// Sends `req` to the daemon, its blocks hashed with `cache_salt` (see
    /// [`crate::tenants::cache_salt`]); the answer is remembered in `recall`.
    pub fn start(
        session: &Arc<Session>,
        req: &ValidRequest,
        cache_salt: Option<String>,
        slot: QueueSlot,
        metrics: Arc<Metrics>,
        recall: Option<Arc<Recall>>,
    ) -> Result<Self, ApiError> {
        let remembered = recall.map(|r| (r, cache_salt.clone(), req.prompt.clone()));
        let generation = session.generate(Generate {
            request_id: 0,
            prompt: req.prompt.clone(),
            max_tokens: req.max_tokens,
            stop_ids: if req.ignore_eos {
                Vec::new()
            } else {
                session.model.stop_ids.clone()
            },
            sampling: req.sampling.clone(),
            logprobs: req.logprobs,
            cache_salt,
            grammar: req.grammar.clone(),
            logit_bias: req.logit_bias.clone(),
            pins: req.pins.clone(),
        })?;
        Ok(Self {
            generation,
            model: session.model.clone(),
            decoder: IncrementalDecoder::default(),
            stop: StopMatcher::new(req.stops.clone()),
            slot: Some(slot),
            logprobs: req.logprobs,
            tokens: 0,
            stopped: false,
            queued: None,
            ended: false,
            prompt_tokens: u32::try_from(req.prompt.len()).unwrap_or(u32::MAX),
            metrics,
            started: Instant::now(),
            first_token: false,
            recall: remembered,
            generated: Vec::new(),
        })
    }

    /// The next piece; `None` after `Finished` or an error.
    pub async fn next(&mut self) -> Option<Result<Piece, ApiError>> {
        if let Some(piece) = self.queued.take() {
            return Some(Ok(piece));
        }
        if self.ended {
            return None;
        }
        loop {
            match self.generation.next().await {
                Event::Token { token, logprob } => {
                    self.slot = None;
                    if !self.first_token {
                        self.first_token = true;
                        self.metrics.ttft.observe(self.started.elapsed());
                    }
                    if self.stopped {
                        continue;
                    }
                    if let Some(piece) = self.token(token, logprob) {
                        return Some(Ok(piece));
                    }
                }
                Event::Done { finish, usage } => {
                    self.ended = true;
                    self.slot = None;
                    return Some(Ok(self.finish(finish, &usage)));
                }
                Event::Failed(e) => {
                    self.ended = true;
                    self.metrics.generation_failed();
                    return Some(Err(match e.code {
                        ErrorCode::BadRequest => ApiError::InvalidParam {
                            param: None,
                            message: e.message,
                        },
                        ErrorCode::ShuttingDown => ApiError::daemon_down(e.message),
                        _ => ApiError::Generation(e.message),
                    }));
                }
                Event::Lost(_) if self.stopped => {
                    // Every token the client gets has arrived (a stop string matched); only
                    // the daemon's usage report is lost: count the prompt ourselves.
                    self.ended = true;
                    let usage = DaemonUsage {
                        prompt_tokens: self.prompt_tokens,
                        ..Default::default()
                    };
                    return Some(Ok(self.finish(FinishReason::Stop, &usage)));
                }
                Event::Lost(reason) => {
                    self.ended = true;
                    self.metrics.generation_failed();
                    return Some(Err(ApiError::daemon_down(reason)));
                }
            }
        }
    }

    fn token(&mut self, token: u32, logprob: Option<f32>) -> Option<Piece> {
        self.tokens += 1;
        self.generated.push(token);
        let text = match self.model.kept_specials.get(&token) {
            Some(literal) => self
                .decoder
                .push_literal(&self.model.tokenizer, token, literal),
            None => self.decoder.push(&self.model.tokenizer, token),
        };
        let released = self.stop.push(&text);
        if released.stopped {
            self.stopped = true;
            self.generation.cancel();
        }
        let logprobs = match (self.logprobs, logprob) {
            (true, Some(logprob)) => vec![TokenLogprob {
                token: self.model.token_text(token),
                logprob,
            }],
            _ => Vec::new(),
        };
        (!released.text.is_empty() || !logprobs.is_empty()).then_some(Piece::Text {
            text: released.text,
            logprobs,
            tokens: 1,
        })
    }

    /// The end: any held-back text, then `Finished` (queued behind it).
    fn finish(&mut self, finish: FinishReason, usage: &DaemonUsage) -> Piece {
        let mut tail = String::new();
        if !self.stopped {
            let flushed = self.decoder.flush(&self.model.tokenizer);
            let released = self.stop.push(&flushed);
            tail = released.text;
            self.stopped = released.stopped;
            if !self.stopped {
                tail.push_str(&self.stop.finish());
            }
        }
        let finish = match (self.stop.matched(), finish) {
            (Some(stop), _) if self.stopped => Finish::StopSequence(stop.to_string()),
            (_, FinishReason::Stop) => Finish::Stop,
            (_, FinishReason::Length) => Finish::Length,
            (_, FinishReason::Cancelled) => Finish::Cancelled,
        };
        let usage = Tally::new(usage, self.tokens);
        self.metrics.finished(&usage, self.started.elapsed());
        if let Some((recall, salt, prompt)) = self.recall.take() {
            recall.remember(salt.as_deref(), &prompt, &self.generated);
        }
        let last = Piece::Finished { finish, usage };
        if tail.is_empty() {
            return last;
        }
        self.queued = Some(last);
        Piece::Text {
            text: tail,
            logprobs: Vec::new(),
            tokens: 0,
        }
    }
}
