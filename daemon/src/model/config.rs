//! Architecture and geometry of a model.

use super::activation::Activation;
use super::moe::Routing;
use crate::{EngineError, Result};

/// The transformer families the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama, Llama 3.x, Mistral, SmolLM2.
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k, v.
    Qwen2,
    /// Qwen3: RMS norm on q and k per head.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, mixture-of-experts feed-forward blocks.
    Qwen3Moe,
    /// Gemma 3 (text): sliding-window local layers and periodic global ones.
    Gemma3,
    /// gpt-oss: alternating sliding-window and full attention with sinks, biases everywhere,
    /// mixture-of-experts blocks (MXFP4 experts in its releases), YaRN.
    GptOss,
}

impl Arch {
    /// Parses an architecture name (GGUF `general.architecture`, HF `model_type`).
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "llama" | "mistral" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "qwen3_moe" | "qwen3moe" => Some(Arch::Qwen3Moe),
            "gemma3_text" => Some(Arch::Gemma3),
            "gpt_oss" | "gpt-oss" => Some(Arch::GptOss),
            _ => None,
        }
    }

    /// The names [`Arch::parse`] takes, for errors that list them.
    pub const NAMES: &'static str = "llama, mistral, qwen2, qwen3, qwen3_moe, gemma3_text, gpt_oss";
}

/// Gemma 3's settings beyond the common ones (its local layers are [`ModelConfig::windows`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Config {
    /// Local layers' RoPE base (global layers use [`ModelConfig::rope_theta`] and
    /// [`ModelConfig::rope_scaling`]).
    pub local_rope_theta: f32,
    /// Scores are scaled by `query_pre_attn_scalar^-1/2`.
    pub query_pre_attn_scalar: f32,
}

/// How RoPE stretches positions past the trained context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// YaRN: low frequencies interpolated by `factor`, high ones kept, a ramp between (the
    /// `beta_fast`/`beta_slow` rotations over `original` positions), and attention logits
    /// scaled up to make up for it.
    Yarn {
        factor: f32,
        beta_fast: f32,
        beta_slow: f32,
        original: usize,
        mscale: f32,
        mscale_all_dim: f32,
    },
    /// Llama 3.1's: wavelengths past `original / low_freq_factor` divided by `factor`, those
    /// under `original / high_freq_factor` kept, a smooth blend between.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original: usize,
    },
}

/// A mixture-of-experts model's experts.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    /// Experts each token runs through.
    pub top_k: usize,
    /// An expert's hidden width.
    pub expert_ffn: usize,
    /// Every `sparse_step`-th layer is a mixture of experts ...
    pub sparse_step: usize,
    /// ... except these, which keep a dense feed-forward block.
    pub dense_layers: Vec<usize>,
    pub routing: Routing,
    pub activation: Activation,
}

impl MoeConfig {
    /// Whether layer `i` is a mixture of experts.
    pub fn is_moe(&self, i: usize) -> bool {
        self.experts > 0
            && !self.dense_layers.contains(&i)
            && (i + 1).is_multiple_of(self.sparse_step.max(1))
    }
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub context_length: usize,
    /// GGUF stores Q/K rows permuted for interleaved ("traditional") RoPE; HF weights use the
    /// rotate-half layout.
    pub rope_traditional: bool,
    pub rope_scaling: RopeScaling,
    /// Each layer's sliding window, in keys a query sees (itself included), or None for full
    /// attention; empty where every layer is full.
    pub windows: Vec<Option<usize>>,
    /// Mixture-of-experts feed-forward blocks, where the model has them.
    pub moe: Option<MoeConfig>,
    /// Gemma 3's own settings.
    pub gemma3: Option<Gemma3Config>,
}

impl ModelConfig {
    /// Layer `i`'s sliding window (None: full attention).
    pub fn window(&self, i: usize) -> Option<usize> {
        self.windows.get(i).copied().flatten()
    }

    /// Checks the figures are usable (non-zero, heads divide evenly).
    pub fn validate(&self, path: &str) -> Result<()> {
        let bad = |reason: String| {
            Err(EngineError::Model {
                path: path.into(),
                reason,
            })
        };
        for (name, v) in [
            ("layers", self.layers),
            ("hidden size", self.hidden),
            ("heads", self.heads),
            ("kv heads", self.kv_heads),
            ("head dim", self.head_dim),
            ("ffn size", self.ffn),
            ("vocab", self.vocab),
        ] {
            if v == 0 {
                return bad(format!("model {name} is 0"));
            }
        }
        if let Some(m) = &self.moe
            && (m.top_k == 0 || m.top_k > m.experts || m.expert_ffn == 0)
        {
            return bad(format!(
                "{} of {} experts per token (width {}) cannot be routed",
                m.top_k, m.experts, m.expert_ffn
            ));
        }
        if !self.windows.is_empty() && self.windows.len() != self.layers {
            return bad(format!(
                "{} layer kinds for {} layers",
                self.windows.len(),
                self.layers
            ));
        }
        if self.windows.contains(&Some(0)) {
            return bad("a sliding window of 0 keys".into());
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} heads are not a multiple of {} kv heads",
                self.heads, self.kv_heads
            ));
        }
        Ok(())
    }
}
