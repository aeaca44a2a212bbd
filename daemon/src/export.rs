//! Writing a GGUF model as an MLX / Hugging Face directory (`config.json`, `model.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json`), dense in a chosen dtype or affine-quantized, so
//! other MLX servers (`mlx_lm.server`) can serve exactly the weights and tokenizer mlxcel serves.
//! GGUF stores the Q/K projections permuted for interleaved RoPE; they are permuted back.

use std::path::Path;

use mlx_rs::{Array, Dtype, ops};
use serde_json::json;

use crate::model::gguf::GgufModel;
use crate::tokenizer::TextInfo;
use crate::{EngineError, Result};

/// How to write the directory.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// The dtype of dense tensors (and of the matrices before quantizing).
    pub dtype: Dtype,
    /// `Some((group, bits))`: mlx-community-style affine quantization of the matrices.
    pub quantize: Option<(i32, i32)>,
    /// `config.json`'s `model_type` (default "llama").
    pub model_type: String,
    /// More tensors to write as they are (test variants add biases and norms).
    pub extra: Vec<(String, Array)>,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            dtype: Dtype::Float32,
            quantize: None,
            model_type: "llama".into(),
            extra: Vec::new(),
        }
    }
}

/// Undoes GGUF's Q/K row permutation (llama.cpp's `permute`, inverted). With `heads = 1` on a
/// head-sized vector it maps a per-head weight the same way.
pub fn unpermute(w: &Array, heads: i32) -> Result<Array> {
    let (out, inp) = (w.shape()[0], if w.ndim() > 1 { w.shape()[1] } else { 1 });
    w.reshape(&[heads, out / heads / 2, 2, inp])
        .and_then(|x| x.swap_axes(1, 2))
        .and_then(|x| x.reshape(w.shape()))
        .map_err(EngineError::from)
}

/// Writes `g` into `dir` (which must exist).
pub fn write_mlx_dir(g: &GgufModel, dir: &Path, opts: &ExportOptions) -> Result<()> {
    let c = &g.config;
    let (heads, kv_heads) = (c.heads as i32, c.kv_heads as i32);
    let mut out: Vec<(String, Array)> = Vec::new();
    let mut put = |name: String, w: Array, matrix: bool| -> Result<()> {
        match (opts.quantize, matrix) {
            (Some((group, bits)), true) => {
                let (q, s, b) = ops::quantize(&w, group, bits)?;
                out.push((format!("{name}.weight"), q));
                out.push((format!("{name}.scales"), s));
                out.push((format!("{name}.biases"), b));
            }
            _ => out.push((format!("{name}.weight"), w.as_dtype(opts.dtype)?)),
        }
        Ok(())
    };
    let dense = |n: &str| g.weights.dense(n, Dtype::Float32);
    put("model.embed_tokens".into(), dense("token_embd")?, true)?;
    put("model.norm".into(), dense("output_norm")?, false)?;
    for i in 0..c.layers {
        let (b, h) = (format!("blk.{i}."), format!("model.layers.{i}."));
        let layer = |part: &str| dense(&format!("{b}{part}"));
        put(format!("{h}input_layernorm"), layer("attn_norm")?, false)?;
        put(
            format!("{h}post_attention_layernorm"),
            layer("ffn_norm")?,
            false,
        )?;
        put(
            format!("{h}self_attn.q_proj"),
            unpermute(&layer("attn_q")?, heads)?,
            true,
        )?;
        put(
            format!("{h}self_attn.k_proj"),
            unpermute(&layer("attn_k")?, kv_heads)?,
            true,
        )?;
        put(format!("{h}self_attn.v_proj"), layer("attn_v")?, true)?;
        put(format!("{h}self_attn.o_proj"), layer("attn_output")?, true)?;
        put(format!("{h}mlp.gate_proj"), layer("ffn_gate")?, true)?;
        put(format!("{h}mlp.up_proj"), layer("ffn_up")?, true)?;
        put(format!("{h}mlp.down_proj"), layer("ffn_down")?, true)?;
    }
    out.extend(opts.extra.iter().cloned());
    let weights = dir.join("model.safetensors");
    Array::save_safetensors(out.iter().map(|(k, v)| (k.as_str(), v)), None, &weights)
        .map_err(|e| unwritable(&weights, e))?;
    let mut config = json!({
        "model_type": opts.model_type, "architectures": ["LlamaForCausalLM"],
        "hidden_size": c.hidden, "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
        "intermediate_size": c.ffn, "vocab_size": c.vocab, "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_eps, "max_position_embeddings": c.context_length,
        "tie_word_embeddings": true,
        "torch_dtype": match opts.dtype {
            Dtype::Float16 => "float16",
            Dtype::Bfloat16 => "bfloat16",
            _ => "float32",
        },
    });
    let text = TextInfo::from_gguf(&g.vocab)?;
    let token = |id: Option<u32>| id.and_then(|i| text.tokenizer.id_to_token(i));
    if let Some(bos) = text.bos {
        config["bos_token_id"] = json!(bos);
    }
    if let Some(eos) = text.eos {
        config["eos_token_id"] = json!(eos);
    }
    if let Some((group_size, bits)) = opts.quantize {
        config["quantization"] = json!({ "group_size": group_size, "bits": bits });
    }
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| unwritable(&path, e))
    };
    write("config.json", config.to_string())?;
    write("tokenizer.json", text.tokenizer_json()?)?;
    let tk_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": text.chat_template,
        "bos_token": token(text.bos),
        "eos_token": token(text.eos),
        "model_max_length": c.context_length,
    });
    write("tokenizer_config.json", tk_config.to_string())?;
    Ok(())
}

/// The error for a file of the directory that could not be written.
fn unwritable(path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Model {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}
