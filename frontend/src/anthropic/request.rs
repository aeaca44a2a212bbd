//! A Messages request → a [`Conversation`], then a [`ValidRequest`]: the system prompt (Claude
//! Code's billing line dropped), text, `tool_use`, `tool_result` and thinking blocks, tools,
//! `tool_choice`, thinking, `output_config`, and `cache_control` breakpoints.

use serde::Deserialize;
use serde_json::Value;

use super::blocks::{add_message, system_text, ttl};
use crate::body::RequestBody;
use crate::chat::render::render;
use crate::chat::{Breakpoint, Conversation, OutputFormat, Role, Thinking, ToolChoice, Turn};
use crate::error::ApiError;
use crate::openai::chat::tool;
use crate::state::TextOptions;
use crate::text::ModelText;
use crate::validate::{self, Draft, Knobs, ValidRequest};

/// Anthropic's limit on `cache_control` breakpoints.
const MAX_BREAKPOINTS: usize = 4;

/// The body of `POST /v1/messages` (and of `count_tokens`, without the generation settings).
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<InMessage>,
    pub system: Option<Value>,
    pub max_tokens: Option<u64>,
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: bool,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Value>,
    pub output_config: Option<Value>,
    pub output_format: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: Value,
}

impl RequestBody for MessagesRequest {
    const FIELDS: &'static [&'static [crate::fields::Field]] = crate::fields::MESSAGES;
}

/// `POST /v1/messages/count_tokens`'s body: a Messages prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct CountTokensRequest(pub MessagesRequest);

impl RequestBody for CountTokensRequest {
    const FIELDS: &'static [&'static [crate::fields::Field]] = crate::fields::COUNT_TOKENS;
}

/// The served model's id for `requested`: its own name, or any Claude model name (Claude Code
/// asks for `claude-*` models unless told otherwise).
pub fn model_for(requested: &str, model: &ModelText) -> Result<String, ApiError> {
    if requested.starts_with("claude") || requested.is_empty() {
        return Ok(model.model_id.clone());
    }
    validate::check_model(Some(requested), model)
}

/// Validates a Messages request and renders its prompt.
pub fn validate(
    req: &MessagesRequest,
    model: &ModelText,
    opts: TextOptions,
) -> Result<ValidRequest, ApiError> {
    let model_id = model_for(&req.model, model)?;
    let max = req
        .max_tokens
        .ok_or_else(|| ApiError::param("max_tokens", "is required"))?;
    let conv = conversation(req, opts.strip_billing_header)?;
    let rendered = render(&conv, model, opts.reasoning_inline)?;
    let knobs = Knobs {
        max: Some(("max_tokens", max)),
        clamp_max: true,
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stops: (
            "stop_sequences",
            req.stop_sequences.clone().unwrap_or_default(),
        ),
        stream: req.stream,
        ..Knobs::default()
    };
    let draft = Draft {
        model_id,
        prompt: rendered.prompt,
        prompt_field: "messages",
        grammar: rendered.grammar.map(|g| g.to_wire()),
        logit_bias: Vec::new(),
        pins: rendered.pins,
        reply: rendered.reply,
        logprobs: false,
        top_logprobs: false,
    };
    validate::finish(draft, knobs, model)
}

/// The prompt's token count (`count_tokens`): the same rendering a Messages request gets.
pub fn count(
    req: &MessagesRequest,
    model: &ModelText,
    opts: TextOptions,
) -> Result<usize, ApiError> {
    model_for(&req.model, model)?;
    let conv = conversation(req, opts.strip_billing_header)?;
    Ok(render(&conv, model, opts.reasoning_inline)?.prompt.len())
}

/// The request's conversation.
pub fn conversation(req: &MessagesRequest, strip_billing: bool) -> Result<Conversation, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::param(
            "messages",
            "must hold at least one message",
        ));
    }
    let mut conv = Conversation {
        parallel_tool_calls: true,
        ..Conversation::default()
    };
    let mut marks: Vec<(usize, usize, u32)> = Vec::new();
    let system = system_text(req.system.as_ref(), strip_billing, &mut marks)?;
    if !system.is_empty() {
        conv.turns.push(Turn::new(Role::System, system));
    }
    for (i, m) in req.messages.iter().enumerate() {
        add_message(&mut conv.turns, i, m, &mut marks)?;
    }
    conv.continue_last = conv.turns.last().is_some_and(|t| t.role == Role::Assistant);
    for (i, t) in req.tools.iter().flatten().enumerate() {
        let field = format!("tools.{i}");
        if let Some(kind) = t["type"].as_str().filter(|k| *k != "custom") {
            return Err(ApiError::param(
                &field,
                format!(
                    "tool type '{kind}' is not supported (only custom tools with an input_schema)"
                ),
            ));
        }
        let name = t["name"]
            .as_str()
            .ok_or_else(|| ApiError::param(&format!("{field}.name"), "is required"))?;
        let description = t["description"].as_str().map(str::to_string);
        let parsed = tool(
            &field,
            name,
            description,
            t.get("input_schema").cloned(),
            &conv.tools,
        )?;
        conv.tools.push(parsed);
        if let Some(ttl) = ttl(&t["cache_control"], &field)?
            && conv.turns.first().is_some_and(|t| t.role == Role::System)
        {
            marks.push((0, conv.turns[0].content.len(), ttl));
        }
    }
    choose(&mut conv, req.tool_choice.as_ref())?;
    thinking(&mut conv, req)?;
    if marks.len() > MAX_BREAKPOINTS {
        return Err(ApiError::param(
            "cache_control",
            format!(
                "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {}.",
                marks.len()
            ),
        ));
    }
    conv.breakpoints = marks
        .into_iter()
        .map(|(turn, offset, ttl_secs)| Breakpoint {
            turn,
            offset,
            ttl_secs,
        })
        .collect();
    Ok(conv)
}

/// `tool_choice`: `auto`, `any`, `tool` (named), `none`; `disable_parallel_tool_use`.
fn choose(conv: &mut Conversation, choice: Option<&Value>) -> Result<(), ApiError> {
    let Some(c) = choice.filter(|c| !c.is_null()) else {
        return Ok(());
    };
    conv.tool_choice = match c["type"].as_str() {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => ToolChoice::Named(
            c["name"]
                .as_str()
                .ok_or_else(|| ApiError::param("tool_choice.name", "is required"))?
                .to_string(),
        ),
        other => {
            return Err(ApiError::param(
                "tool_choice.type",
                format!("must be auto, any, tool or none, got {other:?}"),
            ));
        }
    };
    if c["disable_parallel_tool_use"] == Value::Bool(true) {
        conv.parallel_tool_calls = false;
    }
    if conv.tools.is_empty() && conv.tool_choice.forces() {
        return Err(ApiError::param(
            "tool_choice",
            "forces a tool call, but `tools` is empty",
        ));
    }
    Ok(())
}

/// `thinking`, and `output_config` (`effort`, `format`) or the older `output_format`.
fn thinking(conv: &mut Conversation, req: &MessagesRequest) -> Result<(), ApiError> {
    conv.thinking = match req.thinking.as_ref().and_then(|t| t["type"].as_str()) {
        None => Thinking::Default,
        Some("disabled") => Thinking::Off,
        Some(_) => Thinking::On,
    };
    let config = req.output_config.as_ref();
    if let Some(effort) = config.and_then(|c| c["effort"].as_str()) {
        conv.effort = Some(effort.to_string());
    }
    let format = config
        .map(|c| &c["format"])
        .filter(|f| !f.is_null())
        .or(req.output_format.as_ref());
    if let Some(f) = format {
        match f["type"].as_str() {
            Some("json_schema") => {
                conv.format = OutputFormat::JsonSchema {
                    schema: f["schema"].clone(),
                    strict: true,
                }
            }
            other => {
                return Err(ApiError::param(
                    "output_config.format.type",
                    format!("must be json_schema, got {other:?}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
