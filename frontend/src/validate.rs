//! OpenAI requests → [`ValidRequest`], the only type that crosses to the daemon. Every refusal
//! names the field and the limit it broke.

use mlxcel_ipc::proto::daemon::{Sampling, limits};

use crate::error::ApiError;
use crate::openai::request::{
    ChatRequest, CommonParams, CompletionRequest, Content, Message, Prompt, Stop,
};
use crate::text::ModelText;
use crate::text::template::TemplateMessage;

/// At most this many stop strings (OpenAI's limit).
pub const MAX_STOPS: usize = 4;
/// The longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// `top_logprobs` range (OpenAI's).
pub const MAX_TOP_LOGPROBS: u32 = 20;
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// A request that can be sent as is.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub model: String,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub sampling: Sampling,
    pub stops: Vec<String>,
    /// Return each token's log-probability.
    pub logprobs: bool,
    /// Also list it as its own top alternative.
    pub top_logprobs: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// The request's own `cache_salt`: requests with different salts never share cached blocks.
    pub cache_salt: Option<String>,
    /// Do not stop at the model's end-of-sequence tokens.
    pub ignore_eos: bool,
}

/// The longest `cache_salt` accepted.
const MAX_SALT_BYTES: usize = 1024;

/// Validates a chat request and renders its prompt with the model's template.
pub fn chat(req: &ChatRequest, model: &ModelText) -> Result<ValidRequest, ApiError> {
    let model_id = check_model(req.model.as_deref(), model)?;
    if req.messages.is_empty() {
        return Err(ApiError::param(
            "messages",
            "must contain at least one message",
        ));
    }
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let text = model.render_chat(&messages).map_err(|e| {
        ApiError::param(
            "messages",
            format!("were refused by the chat template: {e}"),
        )
    })?;
    let prompt = model
        .encode(&text, false)
        .map_err(|e| ApiError::param("messages", format!("could not be tokenized: {e}")))?;
    let max = match (req.max_completion_tokens, req.common.max_tokens) {
        (Some(m), _) => Some(("max_completion_tokens", m)),
        (None, m) => m.map(|m| ("max_tokens", m)),
    };
    let logprobs = req.logprobs.unwrap_or(false);
    let top = match req.top_logprobs {
        None => false,
        Some(n) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::param(
                "top_logprobs",
                format!("must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
            ));
        }
        Some(_) if !logprobs => {
            return Err(ApiError::param(
                "top_logprobs",
                "requires `logprobs` to be true",
            ));
        }
        Some(n) => n > 0,
    };
    let draft = Draft {
        model_id,
        prompt,
        prompt_field: "messages",
        max,
        logprobs,
        top_logprobs: top,
    };
    finish(draft, &req.common, model)
}

/// Validates a completions request and tokenizes its prompt.
pub fn completion(req: &CompletionRequest, model: &ModelText) -> Result<ValidRequest, ApiError> {
    let model_id = check_model(req.model.as_deref(), model)?;
    if req.echo {
        return Err(ApiError::param("echo", "is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param("suffix", "is not supported"));
    }
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::param(
            "best_of",
            "must be 1 (one candidate is generated)",
        ));
    }
    let prompt = match &req.prompt {
        Prompt::Text(t) => encode_prompt(t, model)?,
        Prompt::Texts(ts) if ts.len() == 1 => encode_prompt(&ts[0], model)?,
        Prompt::Tokens(ids) => check_ids(ids, model)?,
        Prompt::Batches(b) if b.len() == 1 => check_ids(&b[0], model)?,
        _ => {
            return Err(ApiError::param(
                "prompt",
                "must be one prompt (a string, or a list of token ids)",
            ));
        }
    };
    let logprobs = match req.logprobs {
        Some(n) if n > 5 => {
            return Err(ApiError::param(
                "logprobs",
                format!("must be between 0 and 5, got {n}"),
            ));
        }
        Some(_) => true,
        None => false,
    };
    let draft = Draft {
        model_id,
        prompt,
        prompt_field: "prompt",
        max: req.common.max_tokens.map(|m| ("max_tokens", m)),
        logprobs,
        top_logprobs: logprobs,
    };
    finish(draft, &req.common, model)
}

/// What each route worked out before the shared checks.
struct Draft {
    model_id: String,
    prompt: Vec<u32>,
    /// The field the prompt came from (named in context-window errors).
    prompt_field: &'static str,
    /// The field that set the token limit, and its value.
    max: Option<(&'static str, u64)>,
    logprobs: bool,
    top_logprobs: bool,
}

fn check_model(requested: Option<&str>, model: &ModelText) -> Result<String, ApiError> {
    match requested {
        None | Some("") => Ok(model.model_id.clone()),
        Some(m) if m == model.model_id => Ok(m.to_string()),
        Some(m) => Err(ApiError::ModelNotFound(m.to_string())),
    }
}

fn template_message(i: usize, m: &Message) -> Result<TemplateMessage, ApiError> {
    let param = |field: &str| format!("messages[{i}].{field}");
    if !ROLES.contains(&m.role.as_str()) {
        return Err(ApiError::param(
            &param("role"),
            format!("must be one of {}, got `{}`", ROLES.join(", "), m.role),
        ));
    }
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
        None if m.role == "assistant" => String::new(),
        None => return Err(ApiError::param(&param("content"), "is required")),
    };
    // Developer messages are system messages for templates that predate the role.
    let role = if m.role == "developer" {
        "system"
    } else {
        &m.role
    };
    Ok(TemplateMessage {
        role: role.to_string(),
        content,
    })
}

fn encode_prompt(text: &str, model: &ModelText) -> Result<Vec<u32>, ApiError> {
    model
        .encode(text, true)
        .map_err(|e| ApiError::param("prompt", format!("could not be tokenized: {e}")))
}

fn check_ids(ids: &[u32], model: &ModelText) -> Result<Vec<u32>, ApiError> {
    let vocab = model.tokenizer.get_vocab_size(true) as u32;
    if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
        return Err(ApiError::param(
            "prompt",
            format!("contains token id {bad}, outside the vocabulary (size {vocab})"),
        ));
    }
    Ok(ids.to_vec())
}

/// Checks the shared parameters and the context window.
fn finish(draft: Draft, p: &CommonParams, model: &ModelText) -> Result<ValidRequest, ApiError> {
    let Draft {
        model_id,
        prompt,
        prompt_field,
        max,
        logprobs,
        top_logprobs,
    } = draft;
    if let Some(n) = p.n
        && n != 1
    {
        return Err(ApiError::param("n", format!("must be 1, got {n}")));
    }
    if prompt.is_empty() {
        return Err(ApiError::param(prompt_field, "is empty (no tokens)"));
    }
    let context = u64::from(model.context_length);
    let len = prompt.len() as u64;
    if len >= context {
        return Err(ApiError::param(
            prompt_field,
            format!(
                "is {len} tokens long; the model's context window is {context} tokens \
                 (room must remain for at least one generated token)"
            ),
        ));
    }
    let room = context - len;
    let max_tokens = match max {
        None => room,
        Some((field, 0)) => {
            return Err(ApiError::param(field, "must be at least 1"));
        }
        Some((field, m)) if m > room => {
            return Err(ApiError::param(
                field,
                format!(
                    "= {m} does not fit: the prompt is {len} tokens and the context \
                     window is {context} tokens, so at most {room} can be generated"
                ),
            ));
        }
        Some((_, m)) => m,
    };
    let d = &model.sampling_defaults;
    let sampling = Sampling {
        temperature: range(
            p.temperature,
            "temperature",
            limits::TEMPERATURE,
            d.temperature,
        )?,
        top_p: range(p.top_p, "top_p", limits::TOP_P, d.top_p)?,
        top_k: match p.top_k {
            None => d.top_k,
            Some(-1) => 0,
            Some(k) if (0..=i64::from(u32::MAX)).contains(&k) => k as u32,
            Some(k) => {
                return Err(ApiError::param(
                    "top_k",
                    format!("must be 0 (off) or a positive count, got {k}"),
                ));
            }
        },
        min_p: range(p.min_p, "min_p", limits::MIN_P, d.min_p)?,
        seed: p.seed.map(|s| s as u64),
        repetition_penalty: range(
            p.repetition_penalty,
            "repetition_penalty",
            limits::REPETITION_PENALTY,
            d.repetition_penalty,
        )?,
        presence_penalty: range(p.presence_penalty, "presence_penalty", limits::PENALTY, 0.0)?,
        frequency_penalty: range(
            p.frequency_penalty,
            "frequency_penalty",
            limits::PENALTY,
            0.0,
        )?,
    };
    let stops = match &p.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::param(
            "stop",
            format!("may hold at most {MAX_STOPS} strings, got {}", stops.len()),
        ));
    }
    if let Some(s) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::param(
            "stop",
            format!(
                "holds a string of {} bytes; the limit is {MAX_STOP_BYTES}",
                s.len()
            ),
        ));
    }
    if p.stream_options.is_some() && !p.stream {
        return Err(ApiError::param(
            "stream_options",
            "is only allowed when `stream` is true",
        ));
    }
    let cache_salt = match &p.cache_salt {
        Some(s) if s.is_empty() || s.len() > MAX_SALT_BYTES => {
            return Err(ApiError::param(
                "cache_salt",
                format!("must be a string of 1 to {MAX_SALT_BYTES} bytes"),
            ));
        }
        salt => salt.clone(),
    };
    Ok(ValidRequest {
        model: model_id,
        prompt,
        max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
        sampling,
        stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
        logprobs,
        top_logprobs,
        stream: p.stream,
        include_usage: p.stream_options.as_ref().is_some_and(|o| o.include_usage),
        cache_salt,
        ignore_eos: p.ignore_eos,
    })
}

/// `value` (or `default`) if within `range`; a 400 naming `field` otherwise.
fn range(
    value: Option<f64>,
    field: &str,
    range: (f64, f64),
    default: f32,
) -> Result<f32, ApiError> {
    match value {
        None => Ok(default),
        Some(v) => limits::check(v, range).map_err(|e| ApiError::param(field, e)),
    }
}
