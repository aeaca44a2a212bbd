//! Loading a GGUF file: tensors (through `mlx_rs::io`, quantized ones as MLX affine
//! weight/scales/biases with group 32), the model configuration, and tokenizer metadata.

use std::path::Path;

use mlx_rs::io::GgufFile;

use super::config::{Arch, ModelConfig};
use super::decoder::{LayerPart, TensorNames};
use super::weights::Weights;
use crate::tokenizer::GgufVocab;
use crate::{EngineError, Result};

/// MLX dequantizes GGUF Q4_0/Q4_1/Q8_0 blocks as affine groups of 32.
const GGUF_GROUP_SIZE: i32 = 32;

/// Everything read from a GGUF file.
pub struct GgufModel {
    pub config: ModelConfig,
    pub weights: Weights,
    pub vocab: GgufVocab,
}

/// GGUF tensor names (`blk.N.attn_q`, ...).
pub struct GgufNames;

impl TensorNames for GgufNames {
    fn embed(&self) -> String {
        "token_embd".into()
    }
    fn output(&self) -> String {
        "output".into()
    }
    fn output_norm(&self) -> String {
        "output_norm.weight".into()
    }
    fn layer(&self, i: usize, part: LayerPart) -> String {
        let p = match part {
            LayerPart::AttnNorm => "attn_norm.weight",
            LayerPart::Q => "attn_q",
            LayerPart::K => "attn_k",
            LayerPart::V => "attn_v",
            LayerPart::O => "attn_output",
            LayerPart::QNorm => "attn_q_norm.weight",
            LayerPart::KNorm => "attn_k_norm.weight",
            LayerPart::Sinks => "attn_sinks.weight",
            LayerPart::PostAttnNorm => "post_attention_norm.weight",
            LayerPart::FfnNorm => "ffn_norm.weight",
            LayerPart::PostFfnNorm => "post_ffw_norm.weight",
            LayerPart::Gate => "ffn_gate",
            LayerPart::Up => "ffn_up",
            LayerPart::Down => "ffn_down",
            LayerPart::Router => "ffn_gate_inp",
            LayerPart::ExpertGate => "ffn_gate_exps",
            LayerPart::ExpertUp => "ffn_up_exps",
            LayerPart::ExpertDown => "ffn_down_exps",
        };
        format!("blk.{i}.{p}")
    }
}

/// Reads `path`.
pub fn load(path: &Path) -> Result<GgufModel> {
    let shown = path.display().to_string();
    let err = |reason: String| EngineError::Model {
        path: shown.clone(),
        reason,
    };
    if !path.is_file() {
        return Err(err("no such file".into()));
    }
    // MLX's reader trusts the file's lengths; damage must be caught before it reads.
    super::gguf_check::check(path).map_err(|e| err(format!("not a readable GGUF file: {e}")))?;
    let file = GgufFile::load(path).map_err(|e| err(format!("not a readable GGUF file: {e}")))?;
    let meta = Meta {
        file: &file,
        path: &shown,
    };
    let arch_name = meta
        .string("general.architecture")?
        .ok_or_else(|| err("no general.architecture".into()))?;
    let arch = Arch::parse(&arch_name).ok_or_else(|| {
        err(format!(
            "unsupported architecture `{arch_name}` (supported: llama, mistral, qwen2, qwen3)"
        ))
    })?;
    let a = arch_name.as_str();
    let need = |key: &str| -> Result<usize> {
        meta.number(&format!("{a}.{key}"))?
            .map(|v| v as usize)
            .ok_or_else(|| err(format!("metadata `{a}.{key}` is missing")))
    };
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let tokens = meta
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| err("no tokenizer.ggml.tokens".into()))?;
    let config = ModelConfig {
        arch,
        layers: need("block_count")?,
        hidden,
        heads,
        kv_heads: meta
            .number(&format!("{a}.attention.head_count_kv"))?
            .map_or(heads, |v| v as usize),
        head_dim: meta
            .number(&format!("{a}.attention.key_length"))?
            .map_or(hidden / heads.max(1), |v| v as usize),
        ffn: need("feed_forward_length")?,
        vocab: tokens.len(),
        rope_theta: meta
            .number(&format!("{a}.rope.freq_base"))?
            .unwrap_or(10_000.0) as f32,
        rms_eps: meta
            .number(&format!("{a}.attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5) as f32,
        context_length: need("context_length")?,
        // llama.cpp permutes Q/K of llama-arch models for interleaved RoPE; Qwen keeps NeoX order.
        rope_traditional: arch == Arch::Llama,
        moe: match meta.number(&format!("{a}.expert_count"))? {
            Some(experts) if experts > 0.0 => Some(super::config::MoeConfig {
                experts: experts as usize,
                top_k: meta
                    .number(&format!("{a}.expert_used_count"))?
                    .unwrap_or(0.0) as usize,
                expert_ffn: meta
                    .number(&format!("{a}.expert_feed_forward_length"))?
                    .unwrap_or(0.0) as usize,
                sparse_step: 1,
                dense_layers: Vec::new(),
                // llama.cpp's qwen3moe renormalizes the top k weights.
                routing: super::moe::Routing::SoftmaxTopK { norm: true },
                activation: super::activation::Activation::SwiGlu,
            }),
            _ => None,
        },
        rope_scaling: super::config::RopeScaling::None,
        windows: Vec::new(),
        gemma3: None,
    };
    config.validate(&shown)?;
    let vocab = GgufVocab {
        model: meta.string("tokenizer.ggml.model")?.unwrap_or_default(),
        pre: meta
            .string("tokenizer.ggml.pre")?
            .unwrap_or_else(|| "default".into()),
        tokens,
        merges: meta.strings("tokenizer.ggml.merges")?.unwrap_or_default(),
        token_types: meta.ints("tokenizer.ggml.token_type")?.unwrap_or_default(),
        bos: meta
            .number("tokenizer.ggml.bos_token_id")?
            .map(|v| v as u32),
        eos: meta
            .number("tokenizer.ggml.eos_token_id")?
            .map(|v| v as u32),
        add_bos: meta
            .number("tokenizer.ggml.add_bos_token")?
            .is_some_and(|v| v != 0.0),
        chat_template: meta.string("tokenizer.chat_template")?,
        context_length: config.context_length,
    };
    let tensors = file
        .arrays()
        .map_err(|e| err(format!("cannot read tensors: {e}")))?;
    Ok(GgufModel {
        config,
        weights: Weights::new(tensors, &shown, GGUF_GROUP_SIZE),
        vocab,
    })
}

struct Meta<'a> {
    file: &'a GgufFile,
    path: &'a str,
}

impl Meta<'_> {
    fn err(&self, key: &str, e: impl std::fmt::Display) -> EngineError {
        EngineError::Model {
            path: self.path.into(),
            reason: format!("metadata `{key}`: {e}"),
        }
    }

    fn string(&self, key: &str) -> Result<Option<String>> {
        self.file
            .get_metadata_string(key)
            .map_err(|e| self.err(key, e))
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>> {
        self.file
            .get_metadata_strings(key)
            .map_err(|e| self.err(key, e))
    }

    /// A numeric scalar of any width, as f64 (exact for the integers GGUF metadata holds).
    fn number(&self, key: &str) -> Result<Option<f64>> {
        let Some(values) = self.numbers(key)? else {
            return Ok(None);
        };
        match values.as_slice() {
            [v] => Ok(Some(*v)),
            _ => Err(self.err(key, "expected a single number")),
        }
    }

    /// A numeric array (or scalar) of any width, read on the host in its stored dtype.
    fn numbers(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let Some(a) = self
            .file
            .get_metadata_array(key)
            .map_err(|e| self.err(key, e))?
        else {
            return Ok(None);
        };
        host_numbers(&a).map(Some).map_err(|e| self.err(key, e))
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i32>>> {
        Ok(self
            .numbers(key)?
            .map(|v| v.into_iter().map(|x| x as i32).collect()))
    }
}

/// The values of a metadata array, copied in the dtype the file stores them in and widened on
/// the host. No MLX operation runs: a cast would be an op on the default device, and neither
/// Metal nor CUDA has float64 (`"float64 is not supported on the GPU"`), so a cast to f64 there
/// stopped every GPU from loading a GGUF model.
fn host_numbers(a: &mlx_rs::Array) -> std::result::Result<Vec<f64>, String> {
    use mlx_rs::Dtype;
    fn widen<T: mlx_rs::ArrayElement + Copy>(
        a: &mlx_rs::Array,
        f: impl Fn(T) -> f64,
    ) -> std::result::Result<Vec<f64>, String> {
        let values = a.try_as_slice::<T>().map_err(|e| e.to_string())?;
        Ok(values.iter().map(|&v| f(v)).collect())
    }
    match a.dtype() {
        Dtype::Bool => widen::<bool>(a, |v| f64::from(u8::from(v))),
        Dtype::Uint8 => widen::<u8>(a, f64::from),
        Dtype::Uint16 => widen::<u16>(a, f64::from),
        Dtype::Uint32 => widen::<u32>(a, f64::from),
        Dtype::Uint64 => widen::<u64>(a, |v| v as f64),
        Dtype::Int8 => widen::<i8>(a, f64::from),
        Dtype::Int16 => widen::<i16>(a, f64::from),
        Dtype::Int32 => widen::<i32>(a, f64::from),
        Dtype::Int64 => widen::<i64>(a, |v| v as f64),
        Dtype::Float32 => widen::<f32>(a, f64::from),
        Dtype::Float64 => widen::<f64>(a, |v| v),
        other => Err(format!("unsupported metadata dtype {other:?}")),
    }
}
