//! Loading an MLX / Hugging Face model directory: `config.json`, `*.safetensors` (dense, or
//! mlx-community affine-quantized `weight`/`scales`/`biases`), `tokenizer.json` and
//! `tokenizer_config.json`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde::Deserialize;

use super::config::{Arch, ModelConfig};
use super::llama::{LayerPart, TensorNames};
use super::weights::Weights;
use crate::{EngineError, Result};

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
    pub rope_scaling: Option<serde_json::Value>,
    pub quantization: Option<Quantization>,
}

/// mlx-community quantization settings.
#[derive(Debug, Deserialize)]
pub struct Quantization {
    pub group_size: i32,
    pub bits: i32,
}

/// Hugging Face tensor names (`model.layers.N.self_attn.q_proj`, ...).
pub struct HfNames;

impl TensorNames for HfNames {
    fn embed(&self) -> String {
        "model.embed_tokens".into()
    }
    fn output(&self) -> String {
        "lm_head".into()
    }
    fn output_norm(&self) -> String {
        "model.norm.weight".into()
    }
    fn layer(&self, i: usize, part: LayerPart) -> String {
        let p = match part {
            LayerPart::AttnNorm => "input_layernorm.weight",
            LayerPart::Q => "self_attn.q_proj",
            LayerPart::K => "self_attn.k_proj",
            LayerPart::V => "self_attn.v_proj",
            LayerPart::O => "self_attn.o_proj",
            LayerPart::QNorm => "self_attn.q_norm.weight",
            LayerPart::KNorm => "self_attn.k_norm.weight",
            LayerPart::FfnNorm => "post_attention_layernorm.weight",
            LayerPart::Gate => "mlp.gate_proj",
            LayerPart::Up => "mlp.up_proj",
            LayerPart::Down => "mlp.down_proj",
        };
        format!("model.layers.{i}.{p}")
    }
}

/// Reads the model in directory `dir`.
pub fn load(dir: &Path) -> Result<(ModelConfig, Weights)> {
    let shown = dir.display().to_string();
    let err = |reason: String| EngineError::Model {
        path: shown.clone(),
        reason,
    };
    let config_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| err(format!("config.json: {e}")))?;
    let hf: HfConfig = serde_json::from_str(&text).map_err(|e| err(format!("config.json: {e}")))?;
    let arch = Arch::parse(&hf.model_type).ok_or_else(|| {
        err(format!(
            "unsupported architecture `{}` (supported: llama, mistral, qwen2, qwen3)",
            hf.model_type
        ))
    })?;
    if let Some(scaling) = hf.rope_scaling.as_ref().filter(|v| !v.is_null()) {
        return Err(err(format!("rope_scaling {scaling} is not supported yet")));
    }
    let config = ModelConfig {
        arch,
        layers: hf.num_hidden_layers,
        hidden: hf.hidden_size,
        heads: hf.num_attention_heads,
        kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim: hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1)),
        ffn: hf.intermediate_size,
        vocab: hf.vocab_size,
        rope_theta: hf.rope_theta.unwrap_or(10_000.0),
        rms_eps: hf.rms_norm_eps.unwrap_or(1e-5),
        context_length: hf.max_position_embeddings.unwrap_or(4096),
        rope_traditional: false,
    };
    config.validate(&shown)?;
    let files = weight_files(dir).map_err(|e| err(e.to_string()))?;
    if files.is_empty() {
        return Err(err("no *.safetensors files".into()));
    }
    let mut tensors: HashMap<String, Array> = HashMap::new();
    for file in &files {
        let part = Array::load_safetensors(file).map_err(|e| {
            err(format!(
                "{}: not a readable safetensors file: {e}",
                file.display()
            ))
        })?;
        tensors.extend(part);
    }
    let group_size = hf.quantization.as_ref().map_or(64, |q| q.group_size);
    if let Some(q) = &hf.quantization {
        tracing::info!(
            group_size = q.group_size,
            bits = q.bits,
            "quantized checkpoint"
        );
    }
    Ok((config, Weights::new(tensors, &shown, group_size)))
}

/// A model directory's `*.safetensors` files, sorted.
pub fn weight_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}
