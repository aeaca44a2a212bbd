//! Architecture and geometry of a model.

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
}

impl Arch {
    /// Parses an architecture name (GGUF `general.architecture`, HF `model_type`).
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "llama" | "mistral" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
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
}

impl ModelConfig {
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
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} heads are not a multiple of {} kv heads",
                self.heads, self.kv_heads
            ));
        }
        Ok(())
    }
}
