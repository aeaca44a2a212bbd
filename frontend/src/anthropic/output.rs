//! The answer as an Anthropic message: content blocks (thinking, text, tool_use) in one body or
//! as the stream events (`message_start`, `content_block_start`/`delta`/`stop`, `message_delta`,
//! `message_stop`, `ping` while idle), and usage that says what the cache really read and wrote.

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::answer::{Collected, Event};
use crate::chat::ids;
use crate::completion::{Finish, Tally};
use crate::error::ApiError;
use crate::respond::{Frame, Writer};

/// The block being streamed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    None,
    Thinking,
    Text,
}

/// One message being answered.
pub struct MessageOut {
    id: String,
    /// The model name as the request gave it.
    model: String,
    prompt_tokens: u32,
    /// Cache writes count as 1-hour ones (the request's longest breakpoint asked so).
    hour_pins: bool,
    open: Open,
    /// Blocks started so far.
    blocks: usize,
}

impl MessageOut {
    pub fn new(model: String, prompt_tokens: usize, hour_pins: bool) -> Self {
        Self {
            id: ids::fresh("msg"),
            model,
            prompt_tokens: prompt_tokens as u32,
            hour_pins,
            open: Open::None,
            blocks: 0,
        }
    }

    /// One body: every block of `all`.
    pub fn body(self, all: Collected) -> Response {
        let mut content = Vec::new();
        if !all.reasoning.is_empty() {
            content.push(
                json!({"type": "thinking", "thinking": all.reasoning, "signature": signature()}),
            );
        }
        if !all.text.is_empty() || all.calls.is_empty() {
            content.push(json!({"type": "text", "text": all.text}));
        }
        for c in &all.calls {
            content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input(&c.arguments)}));
        }
        let finish = all.finish.unwrap_or(Finish::Stop);
        let (reason, sequence) = stop_reason(&finish, all.calls.len());
        Json(json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self.usage(&all.usage),
        }))
        .into_response()
    }

    /// Usage as Anthropic counts it: `input_tokens` are the prompt tokens neither read from
    /// the cache nor written to it under a breakpoint; the three add up to the prompt.
    fn usage(&self, u: &Tally) -> Value {
        let read = u.cached.min(u.prompt);
        let written = u.pinned.min(u.prompt).saturating_sub(read);
        let (five, hour) = if self.hour_pins {
            (0, written)
        } else {
            (written, 0)
        };
        json!({
            "input_tokens": u.prompt - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": five, "ephemeral_1h_input_tokens": hour},
            "output_tokens": u.completion,
            "service_tier": "standard",
        })
    }

    fn close(&mut self, out: &mut Vec<Frame>) {
        let index = self.blocks.saturating_sub(1);
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Thinking => out.push(delta(
                index,
                json!({"type": "signature_delta", "signature": signature()}),
            )),
            Open::Text => {}
        }
        out.push(Frame::named(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }

    /// Starts block `block` (closing the open one).
    fn start(&mut self, block: Value, out: &mut Vec<Frame>) -> usize {
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        out.push(Frame::named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }
}

impl Writer for MessageOut {
    /// The message, empty; usage counts the whole prompt as input until the end says what
    /// the cache read (`message_delta` carries the final figures).
    fn opening(&mut self) -> Vec<Frame> {
        let usage = self.usage(&Tally {
            prompt: self.prompt_tokens,
            ..Tally::default()
        });
        vec![Frame::named(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage,
            }}),
        )]
    }

    fn event(&mut self, event: &Event) -> Vec<Frame> {
        let mut out = Vec::new();
        match event {
            Event::Reasoning(t) => {
                if self.open != Open::Thinking {
                    self.start(
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        &mut out,
                    );
                    self.open = Open::Thinking;
                }
                out.push(delta(
                    self.blocks - 1,
                    json!({"type": "thinking_delta", "thinking": t}),
                ));
            }
            Event::Text { text, .. } => {
                if self.open != Open::Text {
                    self.start(json!({"type": "text", "text": ""}), &mut out);
                    self.open = Open::Text;
                }
                out.push(delta(
                    self.blocks - 1,
                    json!({"type": "text_delta", "text": text}),
                ));
            }
            Event::Call(c) => {
                let index = self.start(
                    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}}),
                    &mut out,
                );
                out.push(delta(
                    index,
                    json!({"type": "input_json_delta", "partial_json": c.arguments}),
                ));
                out.push(Frame::named(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": index}),
                ));
            }
            Event::Finished {
                finish,
                usage,
                calls,
            } => {
                self.close(&mut out);
                let (reason, sequence) = stop_reason(finish, *calls);
                out.push(Frame::named(
                    "message_delta",
                    &json!({"type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": self.usage(usage)}),
                ));
                out.push(Frame::named(
                    "message_stop",
                    &json!({"type": "message_stop"}),
                ));
            }
        }
        out
    }

    fn closing(&mut self) -> Vec<Frame> {
        Vec::new()
    }

    fn error(&mut self, error: &ApiError) -> Vec<Frame> {
        vec![Frame::named("error", &super::errors::body(error, None))]
    }
}

fn delta(index: usize, delta: Value) -> Frame {
    Frame::named(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

/// A thinking block's signature: opaque, ours (any signature sent back is accepted).
fn signature() -> String {
    ids::fresh("mlxcel")
}

/// A call's arguments as the `input` object.
fn input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// `stop_reason` and `stop_sequence`.
fn stop_reason(finish: &Finish, calls: usize) -> (&'static str, Option<String>) {
    match finish {
        Finish::Stop if calls > 0 => ("tool_use", None),
        Finish::Stop | Finish::Cancelled => ("end_turn", None),
        Finish::StopSequence(s) => ("stop_sequence", Some(s.clone())),
        Finish::Length => ("max_tokens", None),
    }
}

#[cfg(test)]
mod tests;
