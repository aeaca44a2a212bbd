//! Response bodies and stream chunks, shaped as OpenAI's.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::chat::ToolCall;
use crate::completion::Tally;

/// `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CompletionTokensDetails {
    /// Completion tokens generated while the model reasoned.
    pub reasoning_tokens: u32,
}

impl Usage {
    /// `completion_tokens` counts the tokens the client got (a stop string ends them early).
    pub fn new(t: &Tally) -> Self {
        Self {
            prompt_tokens: t.prompt,
            completion_tokens: t.completion,
            total_tokens: t.prompt.saturating_add(t.completion),
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: t.cached,
            },
            completion_tokens_details: CompletionTokensDetails {
                reasoning_tokens: t.reasoning,
            },
        }
    }
}

/// A tool call in a response: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

impl From<&ToolCall> for ResponseToolCall {
    fn from(c: &ToolCall) -> Self {
        Self {
            id: c.id.clone(),
            kind: "function",
            function: FunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        }
    }
}

/// One tool call's piece of a stream: the first carries its id, type and name (with empty
/// arguments); the next its arguments. Strings are never repeated (clients concatenate them).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// The log-probability of one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
}

/// Chat `logprobs`: `{"content": [...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// The chosen token (the daemon reports only it).
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    pub fn new(tokens: &[TokenLogprob], top: bool) -> Self {
        let content = tokens
            .iter()
            .map(|t| ChatTokenLogprob {
                token: t.token.clone(),
                logprob: t.logprob,
                bytes: t.token.as_bytes().to_vec(),
                top_logprobs: if top {
                    vec![ChatTopLogprob {
                        token: t.token.clone(),
                        logprob: t.logprob,
                        bytes: t.token.as_bytes().to_vec(),
                    }]
                } else {
                    Vec::new()
                },
            })
            .collect();
        Self { content }
    }
}

/// Completions `logprobs`.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// `offset`: the text length before these tokens.
    pub fn new(tokens: &[TokenLogprob], mut offset: usize) -> Self {
        let mut out = CompletionLogprobs {
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
        };
        for t in tokens {
            out.tokens.push(t.token.clone());
            out.token_logprobs.push(t.logprob);
            out.top_logprobs
                .push(BTreeMap::from([(t.token.clone(), t.logprob)]));
            out.text_offset.push(offset);
            offset += t.token.len();
        }
        out
    }
}

/// A chat message in a response. Reasoning is reported under both names clients read
/// (`reasoning_content`, and vLLM's newer `reasoning`).
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when the answer is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ResponseToolCall>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

/// `chat.completion`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// The delta of a chat stream chunk.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// Present (null until the last chunk) when `stream_options.include_usage` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// `text_completion` (also each chunk of a completions stream).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub context_length: u32,
    /// What a request gets for the sampling parameters it omits.
    pub sampling_defaults: mlxcel_ipc::proto::daemon::SamplingDefaults,
}
