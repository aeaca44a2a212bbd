//! Answers in OpenAI's shapes: chat completion chunks (text, reasoning, tool calls streamed as
//! OpenAI streams them) and completions chunks, and their one-body forms.

use axum::Json;
use axum::response::{IntoResponse, Response};

use super::response::{
    AssistantMessage, ChatChoice, ChatChunk, ChatChunkChoice, ChatLogprobs, ChatResponse,
    CompletionChoice, CompletionLogprobs, CompletionResponse, Delta, FunctionDelta,
    ResponseToolCall, TokenLogprob, ToolCallDelta, Usage,
};
use crate::answer::{Collected, Event};
use crate::completion::Finish;
use crate::error::ApiError;
use crate::respond::{Frame, Writer, now_secs, to_json};

/// Which OpenAI shape to answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(finish: &Finish, calls: usize) -> &'static str {
    match finish {
        Finish::Stop if calls > 0 => "tool_calls",
        Finish::Stop | Finish::StopSequence(_) => "stop",
        Finish::Length => "length",
        Finish::Cancelled => "cancelled",
    }
}

/// Builds response bodies for one request.
#[derive(Debug, Clone)]
pub struct Chunker {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// Report logprobs (chat: also as each token's own top alternative).
    pub logprobs: bool,
    pub top_logprobs: bool,
    /// Text bytes sent so far (completions' `text_offset`).
    offset: usize,
    /// Tool calls sent so far (each call's `index`).
    calls: u32,
}

impl Chunker {
    pub fn new(kind: Kind, id: String, model: String) -> Self {
        Self {
            kind,
            id,
            created: now_secs(),
            model,
            include_usage: false,
            logprobs: false,
            top_logprobs: false,
            offset: 0,
            calls: 0,
        }
    }

    fn usage_field(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }

    fn chat_chunk(
        &self,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> Frame {
        let choice = ChatChunkChoice {
            index: 0,
            delta,
            logprobs,
            finish_reason: finish,
        };
        Frame::data(to_json(
            &self.chat_chunk_with(vec![choice], self.usage_field()),
        ))
    }

    fn chat_chunk_with(
        &self,
        choices: Vec<ChatChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn completion_chunk(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> Frame {
        let choice = CompletionChoice {
            index: 0,
            text,
            logprobs,
            finish_reason: finish,
        };
        Frame::data(to_json(
            &self.completion_with(vec![choice], self.usage_field()),
        ))
    }

    /// A `text_completion` object (a whole response, or one chunk of a stream).
    fn completion_with(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<Usage>>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn text(&mut self, text: &str, logprobs: &[TokenLogprob]) -> Frame {
        let frame = match self.kind {
            Kind::Chat => self.chat_chunk(
                Delta {
                    content: Some(text.to_string()),
                    ..Delta::default()
                },
                self.chat_logprobs(logprobs),
                None,
            ),
            Kind::Completion => {
                let lp = self.completion_logprobs(logprobs);
                self.completion_chunk(text.to_string(), lp, None)
            }
        };
        self.offset += text.len();
        frame
    }

    /// The last chunk of `include_usage` streams: no choices, the usage.
    fn usage_chunk(&self, usage: Usage) -> Frame {
        Frame::data(match self.kind {
            Kind::Chat => to_json(&self.chat_chunk_with(Vec::new(), Some(Some(usage)))),
            Kind::Completion => to_json(&self.completion_with(Vec::new(), Some(Some(usage)))),
        })
    }

    fn chat_logprobs(&self, tokens: &[TokenLogprob]) -> Option<ChatLogprobs> {
        self.logprobs
            .then(|| ChatLogprobs::new(tokens, self.top_logprobs))
    }

    fn completion_logprobs(&self, tokens: &[TokenLogprob]) -> Option<CompletionLogprobs> {
        self.logprobs
            .then(|| CompletionLogprobs::new(tokens, self.offset))
    }

    /// The whole response of a non-streaming request.
    pub fn body(&mut self, all: Collected) -> Response {
        let finish = finish_reason(
            all.finish.as_ref().unwrap_or(&Finish::Stop),
            all.calls.len(),
        );
        let usage = Usage::new(&all.usage);
        match self.kind {
            Kind::Chat => {
                let reasoning = (!all.reasoning.is_empty()).then_some(all.reasoning);
                let content = match (all.text.is_empty(), all.calls.is_empty()) {
                    (true, false) => None,
                    _ => Some(all.text),
                };
                Json(ChatResponse {
                    id: self.id.clone(),
                    object: "chat.completion",
                    created: self.created,
                    model: self.model.clone(),
                    choices: vec![ChatChoice {
                        index: 0,
                        message: AssistantMessage {
                            role: "assistant",
                            content,
                            reasoning_content: reasoning.clone(),
                            reasoning,
                            tool_calls: all.calls.iter().map(ResponseToolCall::from).collect(),
                        },
                        logprobs: self.chat_logprobs(&all.logprobs),
                        finish_reason: finish,
                    }],
                    usage,
                })
                .into_response()
            }
            Kind::Completion => Json(self.completion_with(
                vec![CompletionChoice {
                    index: 0,
                    text: all.text,
                    logprobs: self.completion_logprobs(&all.logprobs),
                    finish_reason: Some(finish),
                }],
                Some(Some(usage)),
            ))
            .into_response(),
        }
    }
}

impl Writer for Chunker {
    /// Chat: the assistant role with empty content.
    fn opening(&mut self) -> Vec<Frame> {
        match self.kind {
            Kind::Chat => vec![self.chat_chunk(
                Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Delta::default()
                },
                None,
                None,
            )],
            Kind::Completion => Vec::new(),
        }
    }

    fn event(&mut self, event: &Event) -> Vec<Frame> {
        match event {
            Event::Text { text, logprobs } => vec![self.text(text, logprobs)],
            Event::Reasoning(text) if self.kind == Kind::Chat => vec![self.chat_chunk(
                Delta {
                    reasoning_content: Some(text.clone()),
                    reasoning: Some(text.clone()),
                    ..Delta::default()
                },
                None,
                None,
            )],
            Event::Call(call) if self.kind == Kind::Chat => {
                let index = self.calls;
                self.calls += 1;
                let head = ToolCallDelta {
                    index,
                    id: Some(call.id.clone()),
                    kind: Some("function"),
                    function: FunctionDelta {
                        name: Some(call.name.clone()),
                        arguments: String::new(),
                    },
                };
                let args = ToolCallDelta {
                    index,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: call.arguments.clone(),
                    },
                };
                [head, args]
                    .into_iter()
                    .map(|d| {
                        let delta = Delta {
                            tool_calls: Some(vec![d]),
                            ..Delta::default()
                        };
                        self.chat_chunk(delta, None, None)
                    })
                    .collect()
            }
            // Completions have no reasoning or tool calls: their text is plain.
            Event::Reasoning(_) | Event::Call(_) => Vec::new(),
            Event::Finished {
                finish,
                usage,
                calls,
            } => {
                let reason = finish_reason(finish, *calls);
                let mut out = vec![match self.kind {
                    Kind::Chat => self.chat_chunk(Delta::default(), None, Some(reason)),
                    Kind::Completion => self.completion_chunk(String::new(), None, Some(reason)),
                }];
                if self.include_usage {
                    out.push(self.usage_chunk(Usage::new(usage)));
                }
                out
            }
        }
    }

    fn closing(&mut self) -> Vec<Frame> {
        vec![Frame::data("[DONE]".into())]
    }

    /// One `data: {"error": ...}` event, then the stream ends.
    fn error(&mut self, error: &ApiError) -> Vec<Frame> {
        vec![Frame::data(to_json(&error.body()))]
    }
}

#[cfg(test)]
mod tests;
