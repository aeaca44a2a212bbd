//! Request bodies as OpenAI clients send them. Fields we do not use are ignored; fields whose
//! values we cannot honour are refused in [`crate::validate`], not here.

use serde::Deserialize;

use crate::body::{RequestBody, parse};
use crate::error::ApiError;

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<Message>,
    /// Filled from the same body by [`crate::body::RequestBody::complete`] (not `flatten`,
    /// which would hide the failing field's name).
    #[serde(skip)]
    pub common: CommonParams,
    /// Chat: return the chosen token's log-probability.
    #[serde(default)]
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub max_completion_tokens: Option<u64>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Filled from the same body by [`crate::body::RequestBody::complete`] (not `flatten`,
    /// which would hide the failing field's name).
    #[serde(skip)]
    pub common: CommonParams,
    /// Completions: the number of alternatives per position (we return the chosen token).
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    pub best_of: Option<u32>,
}

impl RequestBody for ChatRequest {
    fn complete(&mut self, raw: &[u8]) -> Result<(), ApiError> {
        self.common = parse(raw)?;
        Ok(())
    }
}

impl RequestBody for CompletionRequest {
    fn complete(&mut self, raw: &[u8]) -> Result<(), ApiError> {
        self.common = parse(raw)?;
        Ok(())
    }
}

/// Parameters both routes take.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub n: Option<u32>,
    pub user: Option<String>,
    /// Requests with different salts never share cached prefixes (as in vLLM).
    pub cache_salt: Option<String>,
    /// Generate to `max_tokens` past end-of-sequence tokens (as in vLLM; for benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `prompt`: text, a one-element list of text, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    Batches(Vec<Vec<u32>>),
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    pub name: Option<String>,
}

/// Message content: a string or a list of typed parts (only `text` parts are supported).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}
