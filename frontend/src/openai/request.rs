//! Request bodies as OpenAI clients send them. Which top-level fields are honoured, ignored or
//! refused is [`crate::fields`]' table; values that cannot be honoured are refused where the
//! request is converted ([`crate::validate`], [`super::chat`]). Nested objects tolerate fields
//! they do not know (SDKs echo a response's extras back in the next request).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

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
    pub tools: Option<Vec<ChatTool>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    /// Token id (as a string) → bias added to its logit, -100 to 100.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// `none`/`minimal` turn a reasoning model's thinking off, others on.
    pub reasoning_effort: Option<String>,
    /// Variables for the chat template (vLLM's extension), e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// A tool in chat completions: `{"type": "function", "function": {...}}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Option<FunctionDef>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    pub json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub schema: Option<Value>,
    pub strict: Option<bool>,
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
    /// Token id (as a string) → bias added to its logit, -100 to 100.
    pub logit_bias: Option<BTreeMap<String, f64>>,
}

impl RequestBody for ChatRequest {
    const FIELDS: &'static [&'static [crate::fields::Field]] = crate::fields::CHAT;

    fn complete(&mut self, raw: &[u8]) -> Result<(), ApiError> {
        self.common = parse(raw)?;
        Ok(())
    }
}

impl RequestBody for CompletionRequest {
    const FIELDS: &'static [&'static [crate::fields::Field]] = crate::fields::COMPLETIONS;

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
    /// An assistant's calls.
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A tool result: the call it answers.
    pub tool_call_id: Option<String>,
    /// An assistant's reasoning (`reasoning` is accepted as an alias).
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
}

/// An assistant's earlier call.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageToolCall {
    pub id: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: CalledFunction,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CalledFunction {
    pub name: String,
    /// JSON text (an object given as an object is accepted too).
    pub arguments: Value,
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
