//! A Responses request → a [`Conversation`], then a [`ValidRequest`].

use serde::Deserialize;
use serde_json::Value;

use crate::body::RequestBody;
use crate::chat::render::render;
use crate::chat::{Conversation, Role, Thinking, Tool, ToolCall, Turn};
use crate::error::ApiError;
use crate::openai::chat::{format, tool, tool_choice};
use crate::openai::request::{JsonSchemaFormat, ResponseFormat};
use crate::text::ModelText;
use crate::validate::{self, Draft, Knobs, ValidRequest};

/// The body of `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<TextConfig>,
    pub reasoning: Option<ReasoningConfig>,
    #[serde(default)]
    pub stream: bool,
    pub metadata: Option<Value>,
    pub truncation: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    pub format: Option<FlatFormat>,
}

/// `text.format`: `{"type": "json_schema", "name", "schema", "strict"}` (flat).
#[derive(Debug, Clone, Deserialize)]
pub struct FlatFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub schema: Option<Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReasoningConfig {
    pub effort: Option<String>,
}

impl RequestBody for ResponsesRequest {
    const FIELDS: &'static [&'static [crate::fields::Field]] = crate::fields::RESPONSES;
}

/// Validates a Responses request and renders its prompt.
pub fn validate(
    req: &ResponsesRequest,
    model: &ModelText,
    reasoning_inline: bool,
) -> Result<ValidRequest, ApiError> {
    let model_id = validate::check_model(req.model.as_deref(), model)?;
    if let Some(t) = req.truncation.as_deref()
        && t != "disabled"
    {
        return Err(ApiError::param(
            "truncation",
            format!("`{t}` is not supported: only `disabled` (a prompt too long is refused)"),
        ));
    }
    let conv = conversation(req)?;
    let rendered = render(&conv, model, reasoning_inline)?;
    let knobs = Knobs {
        max: req.max_output_tokens.map(|m| ("max_output_tokens", m)),
        temperature: req.temperature,
        top_p: req.top_p,
        stream: req.stream,
        ..Knobs::default()
    };
    let draft = Draft {
        model_id,
        prompt: rendered.prompt,
        prompt_field: "input",
        grammar: rendered.grammar.map(|g| g.to_wire()),
        logit_bias: Vec::new(),
        pins: rendered.pins,
        reply: rendered.reply,
        logprobs: false,
        top_logprobs: false,
    };
    validate::finish(draft, knobs, model)
}

/// The request's conversation.
pub fn conversation(req: &ResponsesRequest) -> Result<Conversation, ApiError> {
    let mut turns = Vec::new();
    if let Some(i) = &req.instructions {
        turns.push(Turn::new(Role::System, i.clone()));
    }
    match &req.input {
        None => return Err(ApiError::param("input", "is required")),
        Some(Value::String(s)) => turns.push(Turn::new(Role::User, s.clone())),
        Some(Value::Array(items)) => items_to_turns(items, &mut turns)?,
        Some(_) => {
            return Err(ApiError::param(
                "input",
                "must be a string or a list of items",
            ));
        }
    }
    if turns.iter().all(|t| t.role == Role::System) {
        return Err(ApiError::param("input", "holds no message to answer"));
    }
    let mut tools: Vec<Tool> = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        let field = format!("tools[{i}]");
        match t["type"].as_str() {
            Some("function") => {}
            other => {
                return Err(ApiError::param(
                    &format!("{field}.type"),
                    format!(
                        "`{}` is not supported (only `function` tools are)",
                        other.unwrap_or("?")
                    ),
                ));
            }
        }
        let name = t["name"].as_str().ok_or_else(|| {
            ApiError::param(
                &format!("{field}.name"),
                "is required (tools are flat here)",
            )
        })?;
        let description = t["description"].as_str().map(str::to_string);
        let parsed = tool(
            &field,
            name,
            description,
            t.get("parameters").cloned(),
            &tools,
        )?;
        tools.push(parsed);
    }
    let choice = tool_choice(req.tool_choice.as_ref(), "tool_choice")?;
    let format = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
        None => format(None, "text.format")?,
        Some(f) => format(
            Some(&ResponseFormat {
                kind: f.kind.clone(),
                json_schema: Some(JsonSchemaFormat {
                    name: f.name.clone(),
                    schema: f.schema.clone(),
                    strict: f.strict,
                }),
            }),
            "text.format",
        )?,
    };
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.clone());
    let thinking = match effort.as_deref() {
        None => Thinking::Default,
        Some("none" | "minimal") => Thinking::Off,
        Some(_) => Thinking::On,
    };
    Ok(Conversation {
        turns,
        tools,
        tool_choice: choice,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        format,
        thinking,
        effort,
        breakpoints: Vec::new(),
        continue_last: false,
    })
}

/// Input items as turns: messages, function calls (joined to the assistant turn they follow),
/// their outputs, and reasoning (given to the next assistant turn).
fn items_to_turns(items: &[Value], turns: &mut Vec<Turn>) -> Result<(), ApiError> {
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let field = |f: &str| format!("input[{i}].{f}");
        let kind = item["type"]
            .as_str()
            .unwrap_or(if item.get("role").is_some() {
                "message"
            } else {
                ""
            });
        match kind {
            "message" => {
                let role = match item["role"].as_str() {
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some("system" | "developer") => Role::System,
                    other => {
                        return Err(ApiError::param(
                            &field("role"),
                            format!("must be user, assistant, system or developer, got {other:?}"),
                        ));
                    }
                };
                let mut t = Turn::new(role, content_text(&item["content"], &field("content"))?);
                if role == Role::Assistant {
                    t.reasoning = reasoning.take();
                }
                turns.push(t);
            }
            "function_call" => {
                let call = ToolCall {
                    id: item["call_id"]
                        .as_str()
                        .ok_or_else(|| ApiError::param(&field("call_id"), "is required"))?
                        .to_string(),
                    name: item["name"]
                        .as_str()
                        .ok_or_else(|| ApiError::param(&field("name"), "is required"))?
                        .to_string(),
                    arguments: match &item["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => "{}".into(),
                        other => other.to_string(),
                    },
                };
                match turns.last_mut() {
                    Some(t) if t.role == Role::Assistant => t.tool_calls.push(call),
                    _ => {
                        let mut t = Turn::new(Role::Assistant, "");
                        t.reasoning = reasoning.take();
                        t.tool_calls.push(call);
                        turns.push(t);
                    }
                }
            }
            "function_call_output" => {
                let mut t = Turn::new(Role::Tool, content_text(&item["output"], &field("output"))?);
                t.tool_call_id = item["call_id"].as_str().map(str::to_string);
                turns.push(t);
            }
            "reasoning" => {
                let parts = item["content"]
                    .as_array()
                    .or_else(|| item["summary"].as_array());
                let text: String = parts
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["text"].as_str())
                    .collect();
                reasoning = Some(text);
            }
            other => {
                return Err(ApiError::param(
                    &field("type"),
                    format!(
                        "`{other}` is not supported (messages, function_call, \
                         function_call_output and reasoning items are; nothing is stored to refer to)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A message's or an output's text: a string, or text parts.
fn content_text(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    (Some("refusal"), _) => text.push_str(p["refusal"].as_str().unwrap_or("")),
                    (kind, _) => {
                        return Err(ApiError::param(
                            &format!("{field}[{j}]"),
                            format!("must be a text part, got {kind:?}"),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::param(
            field,
            "must be text or a list of text parts",
        )),
    }
}
