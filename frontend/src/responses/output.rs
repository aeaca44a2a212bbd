//! The response object and its output items (reasoning, message, function calls), built the
//! same way for one body and for the stream, whose events follow OpenAI's order: created,
//! in_progress, then per item added → deltas → done, then completed (or incomplete).

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::answer::{Collected, Event};
use crate::chat::ids;
use crate::completion::{Finish, Tally};
use crate::error::ApiError;
use crate::respond::{Frame, Writer, now_secs};

/// What the response echoes of its request.
#[derive(Debug, Clone)]
pub struct Echo {
    pub model: String,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub text: Value,
    pub reasoning_effort: Option<String>,
    pub metadata: Value,
}

/// The item being streamed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    None,
    Reasoning,
    Message,
}

/// One response: its output items so far.
pub struct ResponseOut {
    id: String,
    created: u64,
    echo: Echo,
    output: Vec<Value>,
    open: Open,
    /// The open item's text so far.
    text: String,
    seq: u64,
}

impl ResponseOut {
    pub fn new(echo: Echo) -> Self {
        Self {
            id: ids::fresh("resp"),
            created: now_secs(),
            echo,
            output: Vec::new(),
            open: Open::None,
            text: String::new(),
            seq: 0,
        }
    }

    /// The response object with `status` (and its usage, once known).
    fn object(&self, status: &str, finish: Option<&Finish>, usage: Option<&Tally>) -> Value {
        let incomplete = matches!(finish, Some(Finish::Length));
        let e = &self.echo;
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": if incomplete { "incomplete" } else { status },
            "completed_at": (status != "in_progress").then(now_secs),
            "background": false,
            "error": null,
            "incomplete_details": incomplete.then(|| json!({"reason": "max_output_tokens"})),
            "instructions": e.instructions,
            "max_output_tokens": e.max_output_tokens,
            "max_tool_calls": null,
            "model": e.model,
            "output": self.output,
            "parallel_tool_calls": e.parallel_tool_calls,
            "previous_response_id": null,
            "reasoning": {"effort": e.reasoning_effort, "summary": null},
            "service_tier": "default",
            "store": false,
            "temperature": e.temperature,
            "text": e.text,
            "tool_choice": e.tool_choice,
            "tools": e.tools,
            "top_p": e.top_p,
            "truncation": "disabled",
            "usage": usage.map(usage_json),
            "user": null,
            "metadata": e.metadata,
        })
    }

    /// One body: every item of `all`.
    pub fn body(mut self, all: Collected) -> Response {
        if !all.reasoning.is_empty() {
            self.output.push(reasoning_item(
                &ids::fresh("rs"),
                &all.reasoning,
                "completed",
            ));
        }
        if !all.text.is_empty() || all.calls.is_empty() {
            self.output
                .push(message_item(&ids::fresh("msg"), &all.text, "completed"));
        }
        for c in &all.calls {
            self.output
                .push(call_item(&ids::fresh("fc"), c, "completed"));
        }
        let finish = all.finish.unwrap_or(Finish::Stop);
        Json(self.object("completed", Some(&finish), Some(&all.usage))).into_response()
    }

    fn frame(&mut self, kind: &'static str, mut fields: Value) -> Frame {
        fields["type"] = Value::from(kind);
        fields["sequence_number"] = Value::from(self.seq);
        self.seq += 1;
        Frame::named(kind, &fields)
    }

    /// Closes the open item (its done events).
    fn close(&mut self, out: &mut Vec<Frame>) {
        let index = self.output.len().saturating_sub(1);
        let text = std::mem::take(&mut self.text);
        let id = self
            .output
            .last()
            .map(|i| i["id"].clone())
            .unwrap_or(Value::Null);
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Reasoning => {
                let item = reasoning_item(id.as_str().unwrap_or(""), &text, "completed");
                let f = self.frame(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                out.push(f);
                let f = self.frame("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": {"type": "reasoning_text", "text": text}}));
                out.push(f);
                self.output[index] = item;
            }
            Open::Message => {
                let item = message_item(id.as_str().unwrap_or(""), &text, "completed");
                let f = self.frame("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                out.push(f);
                let f = self.frame("response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": item["content"][0]}));
                out.push(f);
                self.output[index] = item;
            }
        }
        let item = self.output[index].clone();
        let f = self.frame(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        out.push(f);
    }

    /// Opens an item of kind `open` (closing another).
    fn open(&mut self, open: Open, out: &mut Vec<Frame>) {
        if self.open == open {
            return;
        }
        self.close(out);
        let index = self.output.len();
        let (item, part) = match open {
            Open::Reasoning => (
                reasoning_item(&ids::fresh("rs"), "", "in_progress"),
                json!({"type": "reasoning_text", "text": ""}),
            ),
            _ => {
                let mut item = message_item(&ids::fresh("msg"), "", "in_progress");
                item["content"] = json!([]);
                (
                    item,
                    json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
                )
            }
        };
        if open == Open::Reasoning {
            let mut added = item.clone();
            added["content"] = json!([]);
            let f = self.frame(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            out.push(f);
        } else {
            let f = self.frame(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            out.push(f);
        }
        let id = item["id"].clone();
        self.output.push(item);
        let f = self.frame(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        out.push(f);
        self.open = open;
    }
}

impl Writer for ResponseOut {
    fn opening(&mut self) -> Vec<Frame> {
        let response = self.object("in_progress", None, None);
        vec![
            self.frame("response.created", json!({"response": response})),
            self.frame("response.in_progress", json!({"response": response})),
        ]
    }

    fn event(&mut self, event: &Event) -> Vec<Frame> {
        let mut out = Vec::new();
        match event {
            Event::Reasoning(t) | Event::Text { text: t, .. } => {
                let (open, kind) = match event {
                    Event::Reasoning(_) => (Open::Reasoning, "response.reasoning_text.delta"),
                    _ => (Open::Message, "response.output_text.delta"),
                };
                self.open(open, &mut out);
                self.text.push_str(t);
                let index = self.output.len() - 1;
                let id = self.output[index]["id"].clone();
                let mut fields =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t});
                if open == Open::Message {
                    fields["logprobs"] = json!([]);
                }
                let f = self.frame(kind, fields);
                out.push(f);
            }
            Event::Call(c) => {
                self.close(&mut out);
                let index = self.output.len();
                let id = ids::fresh("fc");
                let mut added = call_item(&id, c, "in_progress");
                added["arguments"] = Value::from("");
                let f = self.frame(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                );
                out.push(f);
                let f = self.frame(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": c.arguments}),
                );
                out.push(f);
                let f = self.frame("response.function_call_arguments.done", json!({"item_id": id, "output_index": index, "name": c.name, "arguments": c.arguments}));
                out.push(f);
                let item = call_item(&id, c, "completed");
                self.output.push(item.clone());
                let f = self.frame(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                out.push(f);
            }
            Event::Finished { finish, usage, .. } => {
                self.close(&mut out);
                let response = self.object("completed", Some(finish), Some(usage));
                let kind = match finish {
                    Finish::Length => "response.incomplete",
                    _ => "response.completed",
                };
                let f = self.frame(kind, json!({"response": response}));
                out.push(f);
            }
        }
        out
    }

    fn closing(&mut self) -> Vec<Frame> {
        Vec::new()
    }

    fn error(&mut self, error: &ApiError) -> Vec<Frame> {
        let body = error.body().error;
        vec![self.frame(
            "error",
            json!({"code": body.code, "message": body.message, "param": body.param}),
        )]
    }
}

fn usage_json(u: &Tally) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": 0},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.prompt + u.completion,
    })
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    })
}

fn call_item(id: &str, c: &crate::chat::ToolCall, status: &str) -> Value {
    json!({
        "id": id,
        "type": "function_call",
        "status": status,
        "call_id": c.id,
        "name": c.name,
        "arguments": c.arguments,
    })
}

#[cfg(test)]
mod tests;
