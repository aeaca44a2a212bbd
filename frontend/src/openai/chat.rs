//! A chat completions request → a [`Conversation`], then a [`ValidRequest`].

use serde_json::Value;

use super::request::{ChatRequest, Content, Message, ResponseFormat};
use crate::chat::render::render;
use crate::chat::{Conversation, OutputFormat, Role, Thinking, Tool, ToolCall, ToolChoice, Turn};
use crate::error::ApiError;
use crate::text::ModelText;
use crate::validate::{self, Draft, Knobs, ValidRequest};

/// Validates a chat request and renders its prompt with the model's template.
pub fn validate(
    req: &ChatRequest,
    model: &ModelText,
    reasoning_inline: bool,
) -> Result<ValidRequest, ApiError> {
    let model_id = validate::check_model(req.model.as_deref(), model)?;
    let conv = conversation(req)?;
    let rendered = render(&conv, model, reasoning_inline)?;
    let (logprobs, top_logprobs) = validate::chat_logprobs(req.logprobs, req.top_logprobs)?;
    let mut knobs = Knobs::openai(&req.common);
    if let Some(m) = req.max_completion_tokens {
        knobs.max = Some(("max_completion_tokens", m));
    }
    let draft = Draft {
        model_id,
        prompt: rendered.prompt,
        prompt_field: "messages",
        grammar: rendered.grammar.map(|g| g.to_wire()),
        logit_bias: validate::logit_bias(req.logit_bias.as_ref(), model)?,
        pins: rendered.pins,
        reply: rendered.reply,
        logprobs,
        top_logprobs,
    };
    validate::finish(draft, knobs, model)
}

/// The request's conversation: messages, tools, tool choice, format, thinking.
pub fn conversation(req: &ChatRequest) -> Result<Conversation, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::param(
            "messages",
            "must contain at least one message",
        ));
    }
    let turns = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| turn(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = tools(req)?;
    let tool_choice = tool_choice(req.tool_choice.as_ref(), "tool_choice")?;
    if tools.is_empty() && req.tool_choice.is_some() && tool_choice != ToolChoice::None {
        return Err(ApiError::param(
            "tool_choice",
            "is only allowed when `tools` are specified",
        ));
    }
    let mut thinking = match req.reasoning_effort.as_deref() {
        None => Thinking::Default,
        Some("none" | "minimal") => Thinking::Off,
        Some("low" | "medium" | "high" | "xhigh" | "max") => Thinking::On,
        Some(other) => {
            return Err(ApiError::param(
                "reasoning_effort",
                format!("must be none, minimal, low, medium, high, xhigh or max, got `{other}`"),
            ));
        }
    };
    if let Some(Value::Bool(on)) = req
        .chat_template_kwargs
        .as_ref()
        .and_then(|k| k.get("enable_thinking"))
    {
        thinking = if *on { Thinking::On } else { Thinking::Off };
    }
    Ok(Conversation {
        turns,
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        format: format(req.response_format.as_ref(), "response_format")?,
        thinking,
        effort: req.reasoning_effort.clone(),
        breakpoints: Vec::new(),
        continue_last: false,
    })
}

fn tools(req: &ChatRequest) -> Result<Vec<Tool>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in req.tools.iter().flatten().enumerate() {
        let field = format!("tools[{i}]");
        let f = match (t.kind.as_str(), &t.function) {
            ("function", Some(f)) => f,
            ("function", None) => return Err(ApiError::param(&field, "has no `function`")),
            (kind, _) => {
                return Err(ApiError::param(
                    &format!("{field}.type"),
                    format!("`{kind}` is not supported (only `function` tools are)"),
                ));
            }
        };
        out.push(tool(
            &field,
            &f.name,
            f.description.clone(),
            f.parameters.clone(),
            &out,
        )?);
    }
    Ok(out)
}

/// A function tool, checked: a usable name, unique, and an object schema.
pub fn tool(
    field: &str,
    name: &str,
    description: Option<String>,
    parameters: Option<Value>,
    earlier: &[Tool],
) -> Result<Tool, ApiError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(ApiError::param(
            &format!("{field}.name"),
            format!("`{name}` must be 1 to 64 letters, digits, `_`, `-` or `.`"),
        ));
    }
    if earlier.iter().any(|t| t.name == name) {
        return Err(ApiError::param(
            &format!("{field}.name"),
            format!("`{name}` names two tools"),
        ));
    }
    let parameters = match parameters {
        None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p,
        Some(_) => {
            return Err(ApiError::param(
                &format!("{field}.parameters"),
                "must be a JSON schema object",
            ));
        }
    };
    Ok(Tool {
        name: name.to_string(),
        description,
        parameters,
    })
}

/// `tool_choice` in chat's shape (`{"type": "function", "function": {"name"}}`) or in the
/// Responses API's (`{"type": "function", "name"}`).
pub fn tool_choice(v: Option<&Value>, field: &str) -> Result<ToolChoice, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::param(
                field,
                format!("must be `none`, `auto`, `required` or a named function, got `{other}`"),
            )),
        },
        Some(Value::Object(o)) if o.get("type") == Some(&Value::from("function")) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::param(field, "names no function"))?;
            Ok(ToolChoice::Named(name.to_string()))
        }
        Some(_) => Err(ApiError::param(
            field,
            "must be `none`, `auto`, `required` or {\"type\": \"function\", ...}",
        )),
    }
}

/// `response_format` (chat) or `text.format` (Responses, flat: `name`/`schema` beside `type`).
pub fn format(f: Option<&ResponseFormat>, field: &str) -> Result<OutputFormat, ApiError> {
    let Some(f) = f else {
        return Ok(OutputFormat::Text);
    };
    match f.kind.as_str() {
        "text" => Ok(OutputFormat::Text),
        "json_object" => Ok(OutputFormat::JsonObject),
        "json_schema" => {
            let spec = f.json_schema.as_ref().ok_or_else(|| {
                ApiError::param(
                    &format!("{field}.json_schema"),
                    "is required for `json_schema`",
                )
            })?;
            let schema = spec.schema.clone().unwrap_or(serde_json::json!({}));
            if !schema.is_object() && !schema.is_boolean() {
                return Err(ApiError::param(
                    &format!("{field}.json_schema.schema"),
                    "must be a JSON schema object",
                ));
            }
            Ok(OutputFormat::JsonSchema {
                schema,
                strict: spec.strict.unwrap_or(false),
            })
        }
        other => Err(ApiError::param(
            &format!("{field}.type"),
            format!("must be `text`, `json_object` or `json_schema`, got `{other}`"),
        )),
    }
}

fn turn(i: usize, m: &Message) -> Result<Turn, ApiError> {
    let param = |field: &str| format!("messages[{i}].{field}");
    let role = match m.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            return Err(ApiError::param(
                &param("role"),
                format!("must be one of system, developer, user, assistant, tool, got `{other}`"),
            ));
        }
    };
    let content = match &m.content {
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::param(
                            &param(&format!("content[{j}]")),
                            format!("must be a text part, got `{kind}`"),
                        ));
                    }
                }
            }
            text
        }
        None if role == Role::Assistant => String::new(),
        None => return Err(ApiError::param(&param("content"), "is required")),
    };
    let mut t = Turn::new(role, content);
    t.name = m.name.clone();
    t.reasoning = m.reasoning_content.clone().or_else(|| m.reasoning.clone());
    if role == Role::Tool {
        t.tool_call_id = Some(m.tool_call_id.clone().ok_or_else(|| {
            ApiError::param(&param("tool_call_id"), "is required in a tool message")
        })?);
    }
    for (j, c) in m.tool_calls.iter().flatten().enumerate() {
        if role != Role::Assistant {
            return Err(ApiError::param(
                &param("tool_calls"),
                "are only allowed in assistant messages",
            ));
        }
        let arguments = match &c.function.arguments {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        t.tool_calls.push(ToolCall {
            id: c.id.clone().unwrap_or_else(|| format!("call_{i}_{j}")),
            name: c.function.name.clone(),
            arguments,
        });
    }
    Ok(t)
}
