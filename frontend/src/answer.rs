//! One answer as every API reports it: a [`Completion`]'s text split by the reply parser into
//! reasoning, text and tool calls, then the end (why, token counts, how many calls).

use std::collections::VecDeque;

use crate::chat::ToolCall;
use crate::chat::reply::{Part, ReplyParser};
use crate::completion::{Completion, Finish, Piece, Tally};
use crate::error::ApiError;
use crate::openai::response::TokenLogprob;

/// What an answer yields, in order; `Finished` last.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Reasoning(String),
    Text {
        text: String,
        /// The tokens behind it (when logprobs were asked for).
        logprobs: Vec<TokenLogprob>,
    },
    Call(ToolCall),
    Finished {
        finish: Finish,
        usage: Tally,
        /// Tool calls in the answer.
        calls: usize,
    },
}

/// A running answer.
pub struct Answer {
    completion: Completion,
    parser: ReplyParser,
    queue: VecDeque<Event>,
    /// Log-probabilities of text not released yet.
    logprobs: Vec<TokenLogprob>,
    /// Tokens generated while reasoning.
    reasoning_tokens: u32,
    ended: bool,
}

impl Answer {
    pub fn new(completion: Completion, parser: ReplyParser) -> Self {
        Self {
            completion,
            parser,
            queue: VecDeque::new(),
            logprobs: Vec::new(),
            reasoning_tokens: 0,
            ended: false,
        }
    }

    /// The next event; `None` after `Finished` or an error.
    pub async fn next(&mut self) -> Option<Result<Event, ApiError>> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some(Ok(e));
            }
            if self.ended {
                return None;
            }
            match self.completion.next().await? {
                Err(e) => {
                    self.ended = true;
                    return Some(Err(e));
                }
                Ok(Piece::Text {
                    text,
                    logprobs,
                    tokens,
                }) => {
                    if self.parser.thinking() {
                        self.reasoning_tokens += tokens;
                    }
                    self.logprobs.extend(logprobs);
                    let parts = self.parser.push(&text);
                    self.release(parts);
                }
                Ok(Piece::Finished { finish, mut usage }) => {
                    let parts = self.parser.finish();
                    self.release(parts);
                    self.ended = true;
                    usage.reasoning = self.reasoning_tokens.min(usage.completion);
                    self.queue.push_back(Event::Finished {
                        finish,
                        usage,
                        calls: self.parser.calls(),
                    });
                }
            }
        }
    }

    fn release(&mut self, parts: Vec<Part>) {
        for part in parts {
            self.queue.push_back(match part {
                Part::Text(text) => Event::Text {
                    text,
                    logprobs: std::mem::take(&mut self.logprobs),
                },
                Part::Reasoning(text) => {
                    self.logprobs.clear();
                    Event::Reasoning(text)
                }
                Part::Call(call) => {
                    self.logprobs.clear();
                    Event::Call(call)
                }
            });
        }
    }
}

/// Everything an answer said, for bodies that are not streamed.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    pub reasoning: String,
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub calls: Vec<ToolCall>,
    pub finish: Option<Finish>,
    pub usage: Tally,
}

impl Collected {
    /// Runs `answer` to its end.
    pub async fn of(mut answer: Answer) -> Result<Collected, ApiError> {
        let mut out = Collected::default();
        while let Some(event) = answer.next().await {
            match event? {
                Event::Reasoning(t) => out.reasoning.push_str(&t),
                Event::Text { text, logprobs } => {
                    out.text.push_str(&text);
                    out.logprobs.extend(logprobs);
                }
                Event::Call(c) => out.calls.push(c),
                Event::Finished { finish, usage, .. } => {
                    out.finish = Some(finish);
                    out.usage = usage;
                    return Ok(out);
                }
            }
        }
        Err(ApiError::Generation(
            "the generation ended without finishing".into(),
        ))
    }
}
