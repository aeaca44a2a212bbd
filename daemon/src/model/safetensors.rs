//! Loading an MLX / Hugging Face model directory: `config.json`, `*.safetensors` (dense, or
//! mlx-community affine-quantized `weight`/`scales`/`biases`), `tokenizer.json` and
//! `tokenizer_config.json`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde_json::Value;

use super::config::{Arch, ModelConfig};
use super::decoder::{LayerPart, TensorNames};
use super::hf_config::{self, HfConfig};
use super::weights::Weights;
use crate::{EngineError, Result};

/// Hugging Face tensor names (`model.layers.N.self_attn.q_proj`, ...) as a family uses them,
/// under `prefix` (`language_model.` for Gemma 3's multimodal checkpoints).
pub struct HfNames {
    pub arch: Arch,
    pub prefix: &'static str,
}

impl TensorNames for HfNames {
    fn embed(&self) -> String {
        format!("{}model.embed_tokens", self.prefix)
    }
    fn output(&self) -> String {
        format!("{}lm_head", self.prefix)
    }
    fn output_norm(&self) -> String {
        format!("{}model.norm.weight", self.prefix)
    }
    fn layer(&self, i: usize, part: LayerPart) -> String {
        let (gemma, gpt_oss) = (self.arch == Arch::Gemma3, self.arch == Arch::GptOss);
        let p = match part {
            LayerPart::AttnNorm => "input_layernorm.weight",
            LayerPart::Q => "self_attn.q_proj",
            LayerPart::K => "self_attn.k_proj",
            LayerPart::V => "self_attn.v_proj",
            LayerPart::O => "self_attn.o_proj",
            LayerPart::QNorm => "self_attn.q_norm.weight",
            LayerPart::KNorm => "self_attn.k_norm.weight",
            LayerPart::Sinks => "self_attn.sinks",
            LayerPart::PostAttnNorm => "post_attention_layernorm.weight",
            LayerPart::FfnNorm if gemma => "pre_feedforward_layernorm.weight",
            LayerPart::FfnNorm => "post_attention_layernorm.weight",
            LayerPart::PostFfnNorm => "post_feedforward_layernorm.weight",
            LayerPart::Gate => "mlp.gate_proj",
            LayerPart::Up => "mlp.up_proj",
            LayerPart::Down => "mlp.down_proj",
            LayerPart::Router if gpt_oss => "mlp.router",
            LayerPart::Router => "mlp.gate",
            LayerPart::ExpertGate if gpt_oss => "mlp.experts.gate_proj",
            LayerPart::ExpertUp if gpt_oss => "mlp.experts.up_proj",
            LayerPart::ExpertDown if gpt_oss => "mlp.experts.down_proj",
            LayerPart::ExpertGate => "mlp.switch_mlp.gate_proj",
            LayerPart::ExpertUp => "mlp.switch_mlp.up_proj",
            LayerPart::ExpertDown => "mlp.switch_mlp.down_proj",
        };
        format!("{}model.layers.{i}.{p}", self.prefix)
    }
}

/// Reads the model in directory `dir`: its configuration, weights and tensor names.
pub fn load(dir: &Path) -> Result<(ModelConfig, Weights, HfNames)> {
    let shown = dir.display().to_string();
    let err = |reason: String| EngineError::Model {
        path: shown.clone(),
        reason,
    };
    let config_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| err(format!("config.json: {e}")))?;
    let mut json: Value =
        serde_json::from_str(&text).map_err(|e| err(format!("config.json: {e}")))?;
    // Gemma 3's multimodal checkpoints: the text model's config inside, its weights under
    // `language_model.` (the vision tower's are left unread).
    let mut prefix = "";
    if json["model_type"] == "gemma3" && json["text_config"].is_object() {
        let mut text_config = json["text_config"].take();
        text_config["model_type"] = "gemma3_text".into();
        for key in ["vocab_size", "quantization"] {
            if text_config.get(key).is_none() && !json[key].is_null() {
                text_config[key] = json[key].take();
            }
        }
        json = text_config;
        prefix = "language_model.";
    }
    let hf: HfConfig =
        serde_json::from_value(json).map_err(|e| err(format!("config.json: {e}")))?;
    let arch = Arch::parse(&hf.model_type).ok_or_else(|| {
        err(format!(
            "unsupported architecture `{}` (supported: {})",
            hf.model_type,
            Arch::NAMES
        ))
    })?;
    let config = hf_config::model_config(&hf, arch).map_err(err)?;
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
    if tensors.keys().any(|k| k.ends_with("gate_up_proj_blocks")) {
        return Err(err(
            "gpt-oss in its original layout (`gate_up_proj_blocks`) is not read \
             yet: convert it with `mlx_lm.convert`, or use an mlx-community conversion"
                .into(),
        ));
    }
    let (group_size, group_sizes) = hf_config::group_sizes(hf.quantization.as_ref());
    if let Some(q) = &hf.quantization {
        tracing::info!(quantization = %q, "quantized checkpoint");
    }
    let weights = Weights::new(tensors, &shown, group_size).with_group_sizes(group_sizes);
    Ok((config, weights, HfNames { arch, prefix }))
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
