//! One generation as text: the daemon's token events turned into text pieces (incremental
//! detokenization, stop strings), then a final piece with the finish reason and usage. Both
//! routes, streaming or not, read a [`Completion`]; dropping it cancels the request.

use std::sync::Arc;
use std::time::Instant;

use mlxcel_ipc::proto::ErrorCode;
use mlxcel_ipc::proto::daemon::{FinishReason, Generate};

use crate::daemon_link::{Event, Generation, Session};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::response::{TokenLogprob, Usage};
use crate::queue::QueueSlot;
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
    },
    Finished {
        finish_reason: &'static str,
        usage: Usage,
    },
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
}

impl Completion {
    /// Sends `req` to the daemon, its blocks hashed with `cache_salt` (see
    /// [`crate::tenants::cache_salt`]).
    pub fn start(
        session: &Arc<Session>,
        req: &ValidRequest,
        cache_salt: Option<String>,
        slot: QueueSlot,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ApiError> {
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
                    let usage = mlxcel_ipc::proto::daemon::Usage {
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
        let text = self.decoder.push(&self.model.tokenizer, token);
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
        })
    }

    /// The end: any held-back text, then `Finished` (queued behind it).
    fn finish(&mut self, finish: FinishReason, usage: &mlxcel_ipc::proto::daemon::Usage) -> Piece {
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
        let finish_reason = match finish {
            _ if self.stopped => "stop",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        };
        let usage = Usage::new(usage, self.tokens);
        self.metrics.finished(&usage, self.started.elapsed());
        let last = Piece::Finished {
            finish_reason,
            usage,
        };
        if tail.is_empty() {
            return last;
        }
        self.queued = Some(last);
        Piece::Text {
            text: tail,
            logprobs: Vec::new(),
        }
    }
}
