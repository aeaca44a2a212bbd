//! Shared test support: fixtures, and rewriting the default GGUF model as an MLX / Hugging Face
//! directory (optionally quantized, optionally as a Qwen2 / Qwen3 variant).
#![allow(dead_code)]

pub mod cuda;

use std::path::Path;

use mlx_rs::{Array, Dtype};
use mlxcel_daemon::export::{ExportOptions, write_mlx_dir};
use mlxcel_daemon::generate::{GenerateRequest, generate};
use mlxcel_daemon::kv::{DenseKv, GrowingKv};
use mlxcel_daemon::model::{Model, gguf};
use mlxcel_daemon::pool::BlockPool;
use mlxcel_daemon::sampler::SamplingParams;
use mlxcel_daemon::scheduler::BlockTable;

/// The logits after `tokens` run on `seq` alone (grown for them first).
pub fn forward_alone(
    model: &Model,
    seq: &mut BlockTable,
    pool: &mut BlockPool,
    tokens: &[u32],
) -> mlxcel_daemon::Result<Array> {
    let mut kv = seq.store(pool);
    kv.grow(tokens.len())?;
    model.forward(tokens, &mut kv)
}

/// Room for one more token in each of `seqs`, before a decode step.
pub fn grow_rows<'a>(seqs: impl IntoIterator<Item = &'a mut BlockTable>, pool: &mut BlockPool) {
    for s in seqs {
        s.grow(pool, 1).expect("room for a decode step");
    }
}

/// A greedy request for `max_tokens` tokens with no stop ids.
pub fn greedy_request(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        max_tokens,
        stop_ids: vec![],
        sampling: SamplingParams::default(),
        prefill_chunk: 512,
    }
}

/// `max_tokens` greedy tokens after `prompt`, with a fresh dense K/V store.
pub fn greedy(model: &Model, prompt: Vec<u32>, max_tokens: usize) -> Vec<u32> {
    greedy_with(
        model,
        &mut DenseKv::new(model.config.layers),
        prompt,
        max_tokens,
    )
}

/// `max_tokens` greedy tokens after `prompt` with the K/V store `kv`.
pub fn greedy_with(
    model: &Model,
    kv: &mut dyn GrowingKv,
    prompt: Vec<u32>,
    max_tokens: usize,
) -> Vec<u32> {
    generate(model, kv, &greedy_request(prompt, max_tokens), |_| true)
        .expect("generate")
        .tokens
}

/// [`mlxcel_daemon::export::unpermute`], unwrapped for tests.
pub fn unpermute(w: &Array, heads: i32) -> Array {
    mlxcel_daemon::export::unpermute(w, heads).unwrap()
}

/// What to write.
#[derive(Debug, Clone, Copy, Default)]
pub struct HfDir {
    /// Some((group, bits)): an mlx-community-style quantized checkpoint.
    pub quantize: Option<(i32, i32)>,
    /// "llama" (default), "qwen2" (adds q/k/v biases) or "qwen3" (adds q/k norms), with the
    /// extra parameters of scripts/reference_llama.py's `variant_extras`.
    pub arch: Option<&'static str>,
}

/// `variant_extras` of scripts/reference_llama.py, row `layer`, length `n` (GGUF row order).
fn extra(name: &str, layer: usize, n: usize) -> Array {
    let l = layer as f64;
    let v: Vec<f32> = (0..n)
        .map(|r| {
            let r = r as f64;
            (match name {
                "q_bias" => 0.1 * (0.37 * r + 1.1 * l).sin(),
                "k_bias" => 0.1 * (0.23 * r + 0.5 * l).cos(),
                "v_bias" => (0.11 * r + 0.3 * l).sin(),
                "q_norm" => 1.0 + 0.2 * (0.5 * r + l).sin(),
                "k_norm" => 1.0 + 0.2 * (0.3 * r + l).cos(),
                other => panic!("no extra {other}"),
            }) as f32
        })
        .collect();
    Array::from_slice(&v, &[n as i32])
}

/// Writes the default model into `dir` as described by `opts`.
pub fn write_hf_dir(dir: &Path, opts: HfDir) {
    let g = gguf::load(&mlxcel_tests::default_model()).expect("run `make setup`");
    let c = &g.config;
    let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim);
    let arch = opts.arch.unwrap_or("llama");
    let mut extras: Vec<(String, Array)> = Vec::new();
    for i in 0..c.layers {
        let h = format!("model.layers.{i}.");
        if arch == "qwen2" {
            extras.push((
                format!("{h}self_attn.q_proj.bias"),
                unpermute(&extra("q_bias", i, c.heads * hd), heads),
            ));
            extras.push((
                format!("{h}self_attn.k_proj.bias"),
                unpermute(&extra("k_bias", i, c.kv_heads * hd), kv_heads),
            ));
            extras.push((
                format!("{h}self_attn.v_proj.bias"),
                extra("v_bias", i, c.kv_heads * hd),
            ));
        }
        if arch == "qwen3" {
            extras.push((
                format!("{h}self_attn.q_norm.weight"),
                unpermute(&extra("q_norm", i, hd), 1),
            ));
            extras.push((
                format!("{h}self_attn.k_norm.weight"),
                unpermute(&extra("k_norm", i, hd), 1),
            ));
        }
    }
    let options = ExportOptions {
        dtype: Dtype::Float32,
        quantize: opts.quantize,
        model_type: arch.to_string(),
        extra: extras,
    };
    write_mlx_dir(&g, dir, &options).expect("export");
}

/// Writes the default model as a GGUF file with every tensor stored dense as `dtype` (F32 or
/// F16), with the metadata the engine reads.
pub fn write_dense_gguf(path: &Path, dtype: Dtype) {
    use mlx_rs::io::GgufFile;
    let src = mlxcel_tests::default_model();
    let g = gguf::load(&src).expect("run `make setup`");
    let c = &g.config;
    let v = &g.vocab;
    let mut f = GgufFile::new().unwrap();
    let num = |x: f64| Array::from_slice(&[x as f32], &[]);
    let int = |x: usize| Array::from_slice(&[x as u32], &[]);
    f.insert_metadata("general.architecture", "llama").unwrap();
    for (k, a) in [
        ("llama.block_count", int(c.layers)),
        ("llama.context_length", int(c.context_length)),
        ("llama.embedding_length", int(c.hidden)),
        ("llama.feed_forward_length", int(c.ffn)),
        ("llama.attention.head_count", int(c.heads)),
        ("llama.attention.head_count_kv", int(c.kv_heads)),
        ("llama.rope.freq_base", num(f64::from(c.rope_theta))),
        (
            "llama.attention.layer_norm_rms_epsilon",
            num(f64::from(c.rms_eps)),
        ),
        ("tokenizer.ggml.bos_token_id", int(v.bos.unwrap() as usize)),
        ("tokenizer.ggml.eos_token_id", int(v.eos.unwrap() as usize)),
    ] {
        f.insert_metadata(k, a).unwrap();
    }
    f.insert_metadata("tokenizer.ggml.model", v.model.as_str())
        .unwrap();
    f.insert_metadata("tokenizer.ggml.pre", v.pre.as_str())
        .unwrap();
    f.insert_metadata("tokenizer.ggml.tokens", v.tokens.clone())
        .unwrap();
    f.insert_metadata("tokenizer.ggml.merges", v.merges.clone())
        .unwrap();
    let types = Array::from_slice(&v.token_types, &[v.token_types.len() as i32]);
    f.insert_metadata("tokenizer.ggml.token_type", types)
        .unwrap();
    if let Some(t) = &v.chat_template {
        f.insert_metadata("tokenizer.chat_template", t.as_str())
            .unwrap();
    }
    let mut names = vec!["token_embd".to_string(), "output_norm".to_string()];
    for i in 0..c.layers {
        for p in [
            "attn_norm",
            "ffn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            names.push(format!("blk.{i}.{p}"));
        }
    }
    for n in names {
        let w = g.weights.dense(&n, dtype).unwrap();
        f.insert_array(format!("{n}.weight"), &w).unwrap();
    }
    f.save(path).unwrap();
}
