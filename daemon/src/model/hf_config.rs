//! A Hugging Face / MLX `config.json` read into a [`ModelConfig`]: the common figures, RoPE
//! scaling, each layer's attention window, the experts, Gemma 3's own settings, and how the
//! weights are quantized.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use super::activation::Activation;
use super::config::{Arch, Gemma3Config, ModelConfig, MoeConfig, RopeScaling};
use super::moe::Routing;

/// The fields of `config.json` the engine reads.
#[derive(Debug, Deserialize)]
pub struct HfConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub rope_theta: Option<f32>,
    pub rms_norm_eps: Option<f32>,
    pub max_position_embeddings: Option<usize>,
    pub rope_scaling: Option<Value>,
    /// mlx-community's quantization: `group_size`, `bits`, `mode` and per-layer entries.
    pub quantization: Option<Value>,
    /// Experts: Qwen3-MoE's names ...
    pub num_experts: Option<usize>,
    pub num_experts_per_tok: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    pub decoder_sparse_step: Option<usize>,
    pub mlp_only_layers: Option<Vec<usize>>,
    /// ... and gpt-oss's.
    pub num_local_experts: Option<usize>,
    pub experts_per_token: Option<usize>,
    pub swiglu_limit: Option<f32>,
    /// Sliding-window layers (Gemma 3, gpt-oss).
    pub sliding_window: Option<usize>,
    pub sliding_window_pattern: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3.
    pub rope_local_base_freq: Option<f32>,
    pub query_pre_attn_scalar: Option<f32>,
}

/// `hf` as the engine's configuration (`Err`: why it cannot run).
pub fn model_config(hf: &HfConfig, arch: Arch) -> Result<ModelConfig, String> {
    let head_dim = hf
        .head_dim
        .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
    Ok(ModelConfig {
        arch,
        layers: hf.num_hidden_layers,
        hidden: hf.hidden_size,
        heads: hf.num_attention_heads,
        kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim,
        ffn: hf.intermediate_size,
        vocab: hf.vocab_size,
        rope_theta: hf.rope_theta.unwrap_or(10_000.0),
        rms_eps: hf.rms_norm_eps.unwrap_or(1e-5),
        context_length: hf.max_position_embeddings.unwrap_or(4096),
        rope_traditional: false,
        rope_scaling: rope_scaling(hf.rope_scaling.as_ref())?,
        windows: windows(hf, arch)?,
        moe: moe(hf, arch),
        gemma3: (arch == Arch::Gemma3).then(|| Gemma3Config {
            local_rope_theta: hf.rope_local_base_freq.unwrap_or(10_000.0),
            query_pre_attn_scalar: hf.query_pre_attn_scalar.unwrap_or(head_dim as f32),
        }),
    })
}

/// `rope_scaling` (`rope_type`, or the older `type`): linear, YaRN and Llama 3's; "default" or
/// none is no scaling; any other is refused rather than run wrong.
pub fn rope_scaling(s: Option<&Value>) -> Result<RopeScaling, String> {
    let Some(s) = s.filter(|v| !v.is_null()) else {
        return Ok(RopeScaling::None);
    };
    let kind = s["rope_type"].as_str().or_else(|| s["type"].as_str());
    let num = |key: &str, default: f64| s[key].as_f64().unwrap_or(default) as f32;
    let factor = num("factor", 1.0);
    if factor <= 0.0 {
        return Err(format!("rope_scaling {s}: factor must be positive"));
    }
    let original = s["original_max_position_embeddings"].as_u64();
    Ok(match kind {
        None | Some("default") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear { factor },
        Some("yarn") => RopeScaling::Yarn {
            factor,
            beta_fast: num("beta_fast", 32.0),
            beta_slow: num("beta_slow", 1.0),
            original: original.unwrap_or(4096) as usize,
            mscale: num("mscale", 1.0),
            mscale_all_dim: num("mscale_all_dim", 0.0),
        },
        Some("llama3") => RopeScaling::Llama3 {
            factor,
            low_freq_factor: num("low_freq_factor", 1.0),
            high_freq_factor: num("high_freq_factor", 4.0),
            original: original.unwrap_or(8192) as usize,
        },
        Some(other) => return Err(format!("rope_scaling type `{other}` is not supported")),
    })
}

/// Each layer's sliding window: Gemma 3's local layers (`layer_types`, else all but every
/// `sliding_window_pattern`-th), gpt-oss's (`layer_types`, else every other layer from the
/// first). Other families attend over everything (as their references do, whatever
/// `sliding_window` says).
fn windows(hf: &HfConfig, arch: Arch) -> Result<Vec<Option<usize>>, String> {
    let (default_window, sliding): (usize, Box<dyn Fn(usize) -> bool>) = match arch {
        Arch::Gemma3 => {
            let pattern = hf.sliding_window_pattern.unwrap_or(6).max(1);
            (512, Box::new(move |i| !(i + 1).is_multiple_of(pattern)))
        }
        Arch::GptOss => (128, Box::new(|i| i % 2 == 0)),
        _ => return Ok(Vec::new()),
    };
    let window = hf.sliding_window.unwrap_or(default_window);
    match &hf.layer_types {
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "sliding_attention" => Ok(Some(window)),
                "full_attention" => Ok(None),
                other => Err(format!("layer type `{other}` is not supported")),
            })
            .collect(),
        None => Ok((0..hf.num_hidden_layers)
            .map(|i| sliding(i).then_some(window))
            .collect()),
    }
}

/// The experts of a mixture-of-experts config.
fn moe(hf: &HfConfig, arch: Arch) -> Option<MoeConfig> {
    match arch {
        Arch::Qwen3Moe => Some(MoeConfig {
            experts: hf.num_experts.unwrap_or(0),
            top_k: hf.num_experts_per_tok.unwrap_or(0),
            expert_ffn: hf.moe_intermediate_size.unwrap_or(0),
            sparse_step: hf.decoder_sparse_step.unwrap_or(1),
            dense_layers: hf.mlp_only_layers.clone().unwrap_or_default(),
            routing: Routing::SoftmaxTopK {
                norm: hf.norm_topk_prob.unwrap_or(false),
            },
            activation: Activation::SwiGlu,
        }),
        Arch::GptOss => Some(MoeConfig {
            experts: hf.num_local_experts.unwrap_or(0),
            top_k: hf.num_experts_per_tok.or(hf.experts_per_token).unwrap_or(0),
            expert_ffn: hf.intermediate_size,
            sparse_step: 1,
            dense_layers: Vec::new(),
            routing: Routing::TopKSoftmax,
            activation: Activation::ClampedSwiGlu {
                alpha: 1.702,
                limit: hf.swiglu_limit.unwrap_or(7.0),
            },
        }),
        _ => None,
    }
}

/// The quantization's default group size and the layers quantized in another (mlx-community
/// files name them: `"model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}`).
pub fn group_sizes(q: Option<&Value>) -> (i32, HashMap<String, i32>) {
    let size = |v: &Value| v["group_size"].as_i64().map(|g| g as i32);
    let Some(q) = q else {
        return (64, HashMap::new());
    };
    let overrides = q
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), size(v)?)))
        .collect();
    (size(q).unwrap_or(64), overrides)
}
