//! Requests → [`ValidRequest`], the only type that crosses to the daemon. Each API converts its
//! body into a rendered prompt and its sampling [`Knobs`]; the checks every API shares are here.
//! Every refusal names the field and the limit it broke.

use mlxcel_ipc::proto::daemon::{Pin, Sampling, limits};

use crate::chat::render::ReplySetup;
use crate::error::ApiError;
use crate::openai::request::{CompletionRequest, Prompt, Stop};
use crate::text::ModelText;

/// At most this many stop strings (OpenAI's limit).
pub const MAX_STOPS: usize = 4;
/// The longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// `top_logprobs` range (OpenAI's).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// The longest `cache_salt` accepted.
const MAX_SALT_BYTES: usize = 1024;

/// A request that can be sent as is.
#[derive(Debug, Clone)]
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
    /// The grammar the answer follows (llguidance's JSON).
    pub grammar: Option<String>,
    pub logit_bias: Vec<(u32, f32)>,
    pub pins: Vec<Pin>,
    /// How to read the answer (reasoning, tool calls).
    pub reply: ReplySetup,
}

/// What a route worked out: the model, the prompt, and what constrains the answer.
pub struct Draft {
    pub model_id: String,
    pub prompt: Vec<u32>,
    /// The field the prompt came from (named in context-window errors).
    pub prompt_field: &'static str,
    pub grammar: Option<String>,
    pub logit_bias: Vec<(u32, f32)>,
    pub pins: Vec<Pin>,
    pub reply: ReplySetup,
    pub logprobs: bool,
    pub top_logprobs: bool,
}

/// The sampling and length settings of a request, by their fields in its API.
#[derive(Debug, Clone, Default)]
pub struct Knobs {
    /// The field that set the token limit, and its value.
    pub max: Option<(&'static str, u64)>,
    /// Cut a limit that does not fit the context to what does (Anthropic's clients send
    /// 32k and more whatever the model); otherwise such a limit is refused.
    pub clamp_max: bool,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    /// The stop strings and the field they came in.
    pub stops: (&'static str, Vec<String>),
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub n: Option<u32>,
    pub stream: bool,
    pub include_usage: bool,
    /// `stream_options` was sent (only allowed with `stream`).
    pub stream_options: bool,
    pub cache_salt: Option<String>,
    pub ignore_eos: bool,
}

impl Knobs {
    /// The knobs of OpenAI's shared parameters.
    pub fn openai(p: &crate::openai::request::CommonParams) -> Self {
        Knobs {
            max: p.max_tokens.map(|m| ("max_tokens", m)),
            clamp_max: false,
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            min_p: p.min_p,
            seed: p.seed,
            stops: (
                "stop",
                match &p.stop {
                    None => Vec::new(),
                    Some(Stop::One(s)) => vec![s.clone()],
                    Some(Stop::Many(v)) => v.clone(),
                },
            ),
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            repetition_penalty: p.repetition_penalty,
            n: p.n,
            stream: p.stream,
            include_usage: p.stream_options.as_ref().is_some_and(|o| o.include_usage),
            stream_options: p.stream_options.is_some(),
            cache_salt: p.cache_salt.clone(),
            ignore_eos: p.ignore_eos,
        }
    }
}

/// The served model's id for `requested` (absent or empty: the served one).
pub fn check_model(requested: Option<&str>, model: &ModelText) -> Result<String, ApiError> {
    match requested {
        None | Some("") => Ok(model.model_id.clone()),
        Some(m) if m == model.model_id => Ok(m.to_string()),
        Some(m) => Err(ApiError::ModelNotFound(m.to_string())),
    }
}

/// OpenAI's `logit_bias` (token id strings → -100..100) as the daemon takes it.
pub fn logit_bias(
    bias: Option<&std::collections::BTreeMap<String, f64>>,
    model: &ModelText,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::new();
    for (key, &value) in bias.into_iter().flatten() {
        let id: u32 = key.parse().map_err(|_| {
            ApiError::param(
                "logit_bias",
                format!("has the key `{key}`, which is not a token id"),
            )
        })?;
        if id >= model.vocab_size {
            return Err(ApiError::param(
                "logit_bias",
                format!(
                    "names token {id}, outside the vocabulary (size {})",
                    model.vocab_size
                ),
            ));
        }
        if !(-100.0..=100.0).contains(&value) {
            return Err(ApiError::param(
                "logit_bias",
                format!("gives token {id} the bias {value}; biases are from -100 to 100"),
            ));
        }
        out.push((id, value as f32));
    }
    Ok(out)
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
        grammar: None,
        logit_bias: logit_bias(req.logit_bias.as_ref(), model)?,
        pins: Vec::new(),
        reply: ReplySetup::text(),
        logprobs,
        top_logprobs: logprobs,
    };
    finish(draft, Knobs::openai(&req.common), model)
}

/// Chat's `logprobs` and `top_logprobs`.
pub fn chat_logprobs(logprobs: Option<bool>, top: Option<u32>) -> Result<(bool, bool), ApiError> {
    let logprobs = logprobs.unwrap_or(false);
    let top = match top {
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
    Ok((logprobs, top))
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
pub fn finish(draft: Draft, k: Knobs, model: &ModelText) -> Result<ValidRequest, ApiError> {
    if let Some(n) = k.n
        && n != 1
    {
        return Err(ApiError::param("n", format!("must be 1, got {n}")));
    }
    let prompt = draft.prompt;
    if prompt.is_empty() {
        return Err(ApiError::param(draft.prompt_field, "is empty (no tokens)"));
    }
    let context = u64::from(model.context_length);
    let len = prompt.len() as u64;
    if len >= context {
        return Err(ApiError::ContextOverflow {
            field: draft.prompt_field,
            tokens: len,
            limit: context,
        });
    }
    let room = context - len;
    let max_tokens = match k.max {
        None => room,
        Some((field, 0)) => {
            return Err(ApiError::param(field, "must be at least 1"));
        }
        Some((_, m)) if m > room && k.clamp_max => room,
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
    let sampling = sampling(&k, model)?;
    let (stop_field, stops) = k.stops;
    if stops.len() > MAX_STOPS {
        return Err(ApiError::param(
            stop_field,
            format!("may hold at most {MAX_STOPS} strings, got {}", stops.len()),
        ));
    }
    if let Some(s) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::param(
            stop_field,
            format!(
                "holds a string of {} bytes; the limit is {MAX_STOP_BYTES}",
                s.len()
            ),
        ));
    }
    if k.stream_options && !k.stream {
        return Err(ApiError::param(
            "stream_options",
            "is only allowed when `stream` is true",
        ));
    }
    if k.cache_salt
        .as_ref()
        .is_some_and(|s| s.is_empty() || s.len() > MAX_SALT_BYTES)
    {
        return Err(ApiError::param(
            "cache_salt",
            format!("must be a string of 1 to {MAX_SALT_BYTES} bytes"),
        ));
    }
    Ok(ValidRequest {
        model: draft.model_id,
        prompt,
        max_tokens: u32::try_from(max_tokens).unwrap_or(u32::MAX),
        sampling,
        stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
        logprobs: draft.logprobs,
        top_logprobs: draft.top_logprobs,
        stream: k.stream,
        include_usage: k.include_usage,
        cache_salt: k.cache_salt,
        ignore_eos: k.ignore_eos,
        grammar: draft.grammar,
        logit_bias: draft.logit_bias,
        pins: draft.pins,
        reply: draft.reply,
    })
}

fn sampling(k: &Knobs, model: &ModelText) -> Result<Sampling, ApiError> {
    let d = &model.sampling_defaults;
    Ok(Sampling {
        temperature: range(
            k.temperature,
            "temperature",
            limits::TEMPERATURE,
            d.temperature,
        )?,
        top_p: range(k.top_p, "top_p", limits::TOP_P, d.top_p)?,
        top_k: match k.top_k {
            None => d.top_k,
            Some(-1) => 0,
            Some(v) if (0..=i64::from(u32::MAX)).contains(&v) => v as u32,
            Some(v) => {
                return Err(ApiError::param(
                    "top_k",
                    format!("must be 0 (off) or a positive count, got {v}"),
                ));
            }
        },
        min_p: range(k.min_p, "min_p", limits::MIN_P, d.min_p)?,
        seed: k.seed.map(|s| s as u64),
        repetition_penalty: range(
            k.repetition_penalty,
            "repetition_penalty",
            limits::REPETITION_PENALTY,
            d.repetition_penalty,
        )?,
        presence_penalty: range(k.presence_penalty, "presence_penalty", limits::PENALTY, 0.0)?,
        frequency_penalty: range(
            k.frequency_penalty,
            "frequency_penalty",
            limits::PENALTY,
            0.0,
        )?,
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
