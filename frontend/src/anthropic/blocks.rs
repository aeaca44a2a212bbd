//! Messages' content as turns: the system prompt (Claude Code's billing line dropped), text,
//! `tool_use`, `tool_result`, thinking and document blocks, and where their `cache_control`
//! breakpoints stand (turn, byte offset, time to live).

use serde_json::Value;

use super::request::InMessage;
use crate::chat::{Role, ToolCall, Turn};
use crate::error::ApiError;

/// The start of the line Claude Code puts in its system prompt, different on every request.
const BILLING: &str = "x-anthropic-billing-header:";

/// Breakpoints found so far: (turn, byte offset in its content, seconds to live).
pub type Marks = Vec<(usize, usize, u32)>;

/// The system prompt's text (blocks joined by a newline), without the billing line; the
/// breakpoints of its blocks go to `marks` (turn 0).
pub fn system_text(
    system: Option<&Value>,
    strip_billing: bool,
    marks: &mut Marks,
) -> Result<String, ApiError> {
    let billing = |t: &str| strip_billing && t.trim_start().starts_with(BILLING);
    match system {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(match s.split_once('\n') {
            Some((first, rest)) if billing(first) => rest.to_string(),
            None if billing(s) => String::new(),
            _ => s.clone(),
        }),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let field = format!("system.{j}");
                let t = b["text"]
                    .as_str()
                    .ok_or_else(|| ApiError::param(&field, "must be a text block"))?;
                if billing(t) {
                    continue;
                }
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
                if let Some(ttl) = ttl(&b["cache_control"], &field)? {
                    marks.push((0, text.len(), ttl));
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::param(
            "system",
            "must be a string or a list of text blocks",
        )),
    }
}

/// A `cache_control`'s time to live in seconds (none: no breakpoint).
pub fn ttl(cc: &Value, field: &str) -> Result<Option<u32>, ApiError> {
    if cc.is_null() {
        return Ok(None);
    }
    match cc["ttl"].as_str() {
        None | Some("5m") => Ok(Some(300)),
        Some("1h") => Ok(Some(3600)),
        Some(other) => Err(ApiError::param(
            &format!("{field}.cache_control.ttl"),
            format!("must be `5m` or `1h`, got `{other}`"),
        )),
    }
}

/// Adds message `i` to `turns`: tool results first (as tool turns), then its text and calls,
/// merged into the last turn when that turn has the same role.
pub fn add_message(
    turns: &mut Vec<Turn>,
    i: usize,
    m: &InMessage,
    marks: &mut Marks,
) -> Result<(), ApiError> {
    let field = |f: &str| format!("messages.{i}.{f}");
    let role = match m.role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        // A mid-conversation system message joins the user turn before it (a template may
        // refuse system turns past the first; hoisting it would change the prompt's head).
        "system" => Role::System,
        other => {
            return Err(ApiError::param(
                &field("role"),
                format!("must be user, assistant or system, got `{other}`"),
            ));
        }
    };
    let blocks: Vec<Value> = match &m.content {
        Value::String(s) => vec![serde_json::json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => {
            return Err(ApiError::param(
                &field("content"),
                "must be a string or a list of blocks",
            ));
        }
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<String> = None;
    let mut text_marks = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bf = field(&format!("content.{j}"));
        match b["type"].as_str().unwrap_or("") {
            "text" => text.push_str(b["text"].as_str().unwrap_or("")),
            "tool_use" if role == Role::Assistant => calls.push(ToolCall {
                id: b["id"].as_str().unwrap_or("").to_string(),
                name: b["name"]
                    .as_str()
                    .ok_or_else(|| ApiError::param(&format!("{bf}.name"), "is required"))?
                    .to_string(),
                arguments: b
                    .get("input")
                    .cloned()
                    .unwrap_or(Value::Object(Default::default()))
                    .to_string(),
            }),
            "tool_result" if role == Role::User => {
                let mut t = Turn::new(Role::Tool, result_text(b, &bf)?);
                t.tool_call_id = b["tool_use_id"].as_str().map(str::to_string);
                turns.push(t);
                if let Some(ttl) = ttl(&b["cache_control"], &bf)? {
                    marks.push((turns.len() - 1, usize::MAX, ttl));
                }
                continue;
            }
            "thinking" if role == Role::Assistant => {
                reasoning
                    .get_or_insert_with(String::new)
                    .push_str(b["thinking"].as_str().unwrap_or(""));
            }
            // Encrypted by Anthropic: there is nothing to render.
            "redacted_thinking" => {}
            "document" if b["source"]["type"] == "text" => {
                text.push_str(b["source"]["data"].as_str().unwrap_or(""));
            }
            "tool_reference" => {
                text.push_str(&format!(
                    "Tool loaded: {}",
                    b["tool_name"].as_str().unwrap_or("")
                ));
            }
            other => {
                return Err(ApiError::param(
                    &format!("{bf}.type"),
                    format!("`{other}` blocks are not supported in {} messages", m.role),
                ));
            }
        }
        if let Some(ttl) = ttl(&b["cache_control"], &bf)? {
            text_marks.push((text.len(), ttl));
        }
    }
    if text.is_empty() && calls.is_empty() && reasoning.is_none() {
        return Ok(());
    }
    let merge = match turns.last() {
        Some(last) if role == Role::System => last.role == Role::User,
        Some(last) => last.role == role && last.tool_calls.is_empty(),
        None => false,
    };
    let role = if role == Role::System && !merge {
        Role::User
    } else {
        role
    };
    if merge && let Some(last) = turns.last_mut() {
        let base = if last.content.is_empty() {
            0
        } else {
            last.content.len() + 1
        };
        if !last.content.is_empty() && !text.is_empty() {
            last.content.push('\n');
        }
        last.content.push_str(&text);
        last.tool_calls.extend(calls);
        if reasoning.is_some() {
            last.reasoning = reasoning;
        }
        let at = turns.len() - 1;
        marks.extend(text_marks.into_iter().map(|(o, ttl)| (at, base + o, ttl)));
        return Ok(());
    }
    let mut t = Turn::new(role, text);
    t.tool_calls = calls;
    t.reasoning = reasoning;
    turns.push(t);
    let at = turns.len() - 1;
    marks.extend(text_marks.into_iter().map(|(o, ttl)| (at, o, ttl)));
    Ok(())
}

/// A tool result's text (an error result says so).
fn result_text(b: &Value, field: &str) -> Result<String, ApiError> {
    let mut text = match &b["content"] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(parts) => {
            let mut out = String::new();
            for (k, p) in parts.iter().enumerate() {
                match p["type"].as_str() {
                    Some("text") => out.push_str(p["text"].as_str().unwrap_or("")),
                    Some("tool_reference") => out.push_str(&format!(
                        "Tool loaded: {}",
                        p["tool_name"].as_str().unwrap_or("")
                    )),
                    other => {
                        return Err(ApiError::param(
                            &format!("{field}.content.{k}.type"),
                            format!("{other:?} is not supported in a tool result (text is)"),
                        ));
                    }
                }
            }
            out
        }
        _ => {
            return Err(ApiError::param(
                &format!("{field}.content"),
                "must be text or blocks",
            ));
        }
    };
    if b["is_error"] == Value::Bool(true) {
        text = format!("Error: {text}");
    }
    Ok(text)
}
