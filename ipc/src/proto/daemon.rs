//! Front end ↔ daemon: token-level requests in, streamed tokens out.
//!
//! The front end renders templates and tokenizes (from the tokenizer the daemon hands over in
//! [`ModelInfo`]); the daemon sees token ids only. One connection carries many requests at once,
//! each named by a [`RequestId`] the front end chooses; every `Generate` ends with exactly one
//! `Done` or `Failed`. Closing the connection cancels all of its requests.

use serde::{Deserialize, Serialize};

use super::WireError;
use super::cache::Epoch;
use crate::{Geometry, TokenId};

/// Names a request on its connection.
pub type RequestId = u64;

/// Sampling settings (OpenAI's names; neutral values disable each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    pub min_p: f32,
    pub seed: Option<u64>,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// The accepted range of each sampling parameter, inclusive, for requests and defaults alike.
pub mod limits {
    pub const TEMPERATURE: (f64, f64) = (0.0, 2.0);
    /// Above 0.
    pub const TOP_P: (f64, f64) = (f64::MIN_POSITIVE, 1.0);
    pub const MIN_P: (f64, f64) = (0.0, 1.0);
    pub const REPETITION_PENALTY: (f64, f64) = (0.01, 10.0);
    pub const PENALTY: (f64, f64) = (-2.0, 2.0);

    /// `value` if it is finite and within `range`, else what a person should be told.
    pub fn check(value: f64, (lo, hi): (f64, f64)) -> Result<f32, String> {
        if value.is_finite() && value >= lo && value <= hi {
            return Ok(value as f32);
        }
        let low = if lo == f64::MIN_POSITIVE {
            "above 0".to_string()
        } else {
            format!("at least {lo}")
        };
        Err(format!("must be {low} and at most {hi}, got {value}"))
    }
}

/// What a request gets for each sampling parameter it omits: the model's own setting (its
/// `generation_config.json`), else the operator's (`--default-temperature`, ...), else the
/// server's ([`SamplingDefaults::default`], OpenAI's values). The daemon resolves them at
/// startup; the front end applies them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: f32,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generate {
    pub request_id: RequestId,
    /// Prompt token ids (template already applied).
    pub prompt: Vec<TokenId>,
    pub max_tokens: u32,
    /// Token ids that end generation (not emitted).
    pub stop_ids: Vec<TokenId>,
    pub sampling: Sampling,
    /// Send each token's log-probability.
    pub logprobs: bool,
    /// Requests with different salts never share cached blocks.
    pub cache_salt: Option<String>,
    /// A grammar the answer must follow: llguidance's `TopLevelGrammar` as JSON (see
    /// `mlxcel_grammar::Grammar`).
    pub grammar: Option<String>,
    /// Added to these tokens' logits before sampling (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Prompt prefixes to keep cached for a while (Anthropic's `cache_control`).
    pub pins: Vec<Pin>,
}

/// A prompt prefix the cache keeps for `ttl_secs` (within its share of the cache's cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// The prefix's length in tokens (its full blocks are pinned).
    pub tokens: u32,
    pub ttl_secs: u32,
}

/// Messages from the front end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FrontendToDaemon {
    Generate(Generate),
    /// Stop a request; it ends with `Done { finish: Cancelled }` (or nothing if already done).
    Cancel {
        request_id: RequestId,
    },
    /// Ask for [`ModelInfo`].
    Info,
    /// Ask for [`DaemonHealth`].
    Health,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
}

/// Token counts and timings of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache (not computed).
    pub cached_tokens: u32,
    pub generated_tokens: u32,
    pub queue_ms: u64,
    pub prefill_ms: u64,
    pub decode_ms: u64,
    /// Prompt tokens whose blocks the cache holds pinned after this request (0 without pins).
    pub pinned_tokens: u32,
}

/// The pool's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PoolStats {
    pub total_blocks: u32,
    pub free_blocks: u32,
    /// Blocks the daemon holds a cache reference on.
    pub cache_blocks: u32,
    pub block_bytes: u64,
    /// Bytes of the pool's resident slabs as MLX reports its arrays (the pool takes memory as
    /// blocks are used: this is at most `total_blocks × block_bytes`).
    pub pool_bytes_measured: u64,
    /// Blocks whose memory is resident (held, or free in a slab that still holds others).
    pub resident_blocks: u32,
    /// Bytes of the model's weights as MLX measured them after loading.
    pub weights_bytes: u64,
    /// MLX's active memory now: weights, KV slabs and what requests hold (an independent
    /// measure of the resident KV: active − weights).
    pub mlx_active_bytes: u64,
    /// Freed buffers MLX keeps for reuse (given back when the engine goes idle).
    pub mlx_cache_bytes: u64,
    /// The process's resident set (phys_footprint on macOS), 0 where unknown.
    pub process_resident_bytes: u64,
}

impl PoolStats {
    /// Blocks held now, by the cache or running requests.
    pub fn held_blocks(&self) -> u32 {
        self.total_blocks.saturating_sub(self.free_blocks)
    }

    /// Resident KV bytes: held for the cache, held only by running requests, and free but not
    /// yet given back (`[cache, running, free]`).
    pub fn kv_resident_split(&self) -> [u64; 3] {
        let held = self.held_blocks();
        let cache = self.cache_blocks.min(held);
        let free = self.resident_blocks.saturating_sub(held);
        [cache, held - cache, free].map(|b| u64::from(b) * self.block_bytes)
    }

    /// The independent measure of resident KV bytes (MLX's active memory minus the weights).
    pub fn kv_measured_bytes(&self) -> u64 {
        self.mlx_active_bytes.saturating_sub(self.weights_bytes)
    }
}

/// What the front end needs to know about the loaded model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub model_id: String,
    pub context_length: u32,
    pub vocab_size: u32,
    /// The tokenizer, serialized as `tokenizer.json`.
    pub tokenizer_json: String,
    pub chat_template: Option<String>,
    pub bos: Option<TokenId>,
    pub eos: Option<TokenId>,
    /// Token ids that end a turn.
    pub stop_ids: Vec<TokenId>,
    pub geometry: Geometry,
    pub pool: PoolStats,
    /// Sampling for parameters a request omits.
    pub sampling_defaults: SamplingDefaults,
}

/// Where the engine's time went since it started, summed over every step: prompt tokens
/// computed, batched decode steps (and the rows they carried), and microseconds in each phase
/// of a step. Deltas between two readings give the per-step breakdown of what ran between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StepTotals {
    pub prefill_tokens: u64,
    pub decode_steps: u64,
    pub decode_rows: u64,
    /// Prefill chunks (the forward passes over prompt tokens).
    pub prefill_us: u64,
    /// The batched decode forward passes.
    pub model_us: u64,
    /// Sampling the decode steps' logits.
    pub sampling_us: u64,
    /// The rest of a step: admission, retiring, publishing.
    pub other_us: u64,
    /// Prefill forward passes, and the chunks they computed: a pass computes the chunks of
    /// every sequence the step prefills at once.
    #[serde(default)]
    pub prefill_passes: u64,
    #[serde(default)]
    pub prefill_chunks: u64,
    /// Next-token masks computed for constrained requests, and the time they took.
    #[serde(default)]
    pub masks: u64,
    #[serde(default)]
    pub mask_us: u64,
}

/// The daemon's state, for `/health` and `mlxcelctl status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaemonHealth {
    pub cachemgr_connected: bool,
    pub epoch: Option<Epoch>,
    pub running: u32,
    pub waiting: u32,
    /// Sequences preempted (freed and recomputed later) because the pool was full.
    pub preemptions: u64,
    /// Block ids from the cache manager the daemon refused to use (not held for the cache under
    /// the hash claimed, out of range, never offered): each one a lie or a bug of the manager.
    pub refused_block_ids: u64,
    pub pool: PoolStats,
    pub steps: StepTotals,
}

/// Messages from the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DaemonToFrontend {
    /// The next generated token of a request.
    Token {
        request_id: RequestId,
        token: TokenId,
        logprob: Option<f32>,
    },
    /// A request finished.
    Done {
        request_id: RequestId,
        finish: FinishReason,
        usage: Usage,
    },
    /// A request failed (bad input, prompt too long, engine error); nothing more follows for it.
    Failed {
        request_id: RequestId,
        error: WireError,
    },
    Info(Box<ModelInfo>),
    Health(DaemonHealth),
    /// The answer to `Info` and `Health` while the daemon loads its model and warms up: what it
    /// is doing now (`Generate` then fails with [`super::ErrorCode::Starting`]).
    Starting {
        stage: String,
    },
    /// A frame that was not understood.
    Error(WireError),
}
