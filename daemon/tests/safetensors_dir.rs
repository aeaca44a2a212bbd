//! The MLX / Hugging Face directory path, end to end: the default GGUF model is rewritten as a
//! Hugging Face checkpoint (HF tensor names, Q/K rows un-permuted back to rotate-half RoPE order,
//! config.json, tokenizer.json, tokenizer_config.json), dense and mlx-community-style quantized,
//! then loaded through the directory loader and held to the same golden tokens.

use std::path::{Path, PathBuf};

use mlx_rs::{Array, Dtype, ops};
use mlxcel_daemon::generate::{GenerateRequest, generate};
use mlxcel_daemon::kv::DenseKv;
use mlxcel_daemon::model::gguf;
use mlxcel_daemon::sampler::SamplingParams;
use mlxcel_daemon::tokenizer::TextInfo;
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// GGUF stores Q/K rows permuted for interleaved RoPE; undo it (llama.cpp's `permute`, inverted).
fn unpermute(w: &Array, heads: i32) -> Array {
    let (out, inp) = (w.shape()[0], w.shape()[1]);
    w.reshape(&[heads, out / heads / 2, 2, inp])
        .and_then(|x| x.swap_axes(1, 2))
        .and_then(|x| x.reshape(&[out, inp]))
        .unwrap()
}

/// Writes the default model as an HF directory; `quantize` = Some((group, bits)) for an
/// mlx-community-style quantized checkpoint.
fn write_hf_dir(dir: &Path, quantize: Option<(i32, i32)>) {
    let g = gguf::load(&root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        .expect("run `make setup`");
    let c = &g.config;
    let mut out: Vec<(String, Array)> = Vec::new();
    let mut put = |name: String, w: Array, matrix: bool| match (quantize, matrix) {
        (Some((group, bits)), true) => {
            let (q, s, b) = ops::quantize(&w, group, bits).unwrap();
            out.push((format!("{name}.weight"), q));
            out.push((format!("{name}.scales"), s));
            out.push((format!("{name}.biases"), b));
        }
        _ => out.push((format!("{name}.weight"), w)),
    };
    let dense = |n: &str| g.weights.dense(n, Dtype::Float32).unwrap();
    put("model.embed_tokens".into(), dense("token_embd"), true);
    put("model.norm".into(), dense("output_norm"), false);
    for i in 0..c.layers {
        let (b, h) = (format!("blk.{i}."), format!("model.layers.{i}."));
        put(
            format!("{h}input_layernorm"),
            dense(&format!("{b}attn_norm")),
            false,
        );
        put(
            format!("{h}post_attention_layernorm"),
            dense(&format!("{b}ffn_norm")),
            false,
        );
        put(
            format!("{h}self_attn.q_proj"),
            unpermute(&dense(&format!("{b}attn_q")), c.heads as i32),
            true,
        );
        put(
            format!("{h}self_attn.k_proj"),
            unpermute(&dense(&format!("{b}attn_k")), c.kv_heads as i32),
            true,
        );
        put(
            format!("{h}self_attn.v_proj"),
            dense(&format!("{b}attn_v")),
            true,
        );
        put(
            format!("{h}self_attn.o_proj"),
            dense(&format!("{b}attn_output")),
            true,
        );
        put(
            format!("{h}mlp.gate_proj"),
            dense(&format!("{b}ffn_gate")),
            true,
        );
        put(
            format!("{h}mlp.up_proj"),
            dense(&format!("{b}ffn_up")),
            true,
        );
        put(
            format!("{h}mlp.down_proj"),
            dense(&format!("{b}ffn_down")),
            true,
        );
    }
    Array::save_safetensors(
        out.iter().map(|(k, v)| (k.as_str(), v)),
        None,
        dir.join("model.safetensors"),
    )
    .unwrap();
    let mut config = json!({
        "model_type": "llama", "hidden_size": c.hidden, "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads, "intermediate_size": c.ffn,
        "vocab_size": c.vocab, "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_eps,
        "max_position_embeddings": c.context_length, "tie_word_embeddings": true,
    });
    if let Some((group_size, bits)) = quantize {
        config["quantization"] = json!({ "group_size": group_size, "bits": bits });
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let text = TextInfo::from_gguf(&g.vocab).unwrap();
    std::fs::write(dir.join("tokenizer.json"), text.tokenizer_json().unwrap()).unwrap();
    let tk_config = json!({
        "chat_template": text.chat_template, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
    });
    std::fs::write(dir.join("tokenizer_config.json"), tk_config.to_string()).unwrap();
}

fn greedy_matches(dir: &Path, required: usize) {
    let m = mlxcel_daemon::load(dir).expect("load the directory");
    assert_eq!(m.text.context_length, 8192);
    assert_eq!(
        m.text.stop_ids,
        vec![2, 0],
        "eos <|im_end|> (tokenizer_config.json), then <|endoftext|>"
    );
    assert!(
        m.text
            .chat_template
            .as_deref()
            .unwrap()
            .contains("<|im_start|>")
    );
    let fixtures: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("daemon/tests/fixtures/smollm2_golden.json")).unwrap(),
    )
    .unwrap();
    for chat in fixtures["chats"].as_array().unwrap() {
        assert_eq!(
            m.text.encode(chat["prompt"].as_str().unwrap()).unwrap(),
            ids(&chat["prompt_ids"])
        );
        let mut kv = DenseKv::new(m.model.config.layers);
        let req = GenerateRequest {
            prompt: ids(&chat["prompt_ids"]),
            max_tokens: required,
            stop_ids: vec![],
            sampling: SamplingParams::default(),
            prefill_chunk: 512,
        };
        let got = generate(&m.model, &mut kv, &req, |_| true).unwrap();
        assert_eq!(
            got.tokens,
            ids(&chat["greedy_ids"])[..required],
            "prompt {:?}",
            chat["messages"]
        );
    }
}

#[test]
fn a_dense_hf_directory_gives_the_golden_tokens() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(dir.path(), None);
    greedy_matches(dir.path(), 32);
}

#[test]
fn an_mlx_quantized_directory_loads_and_generates_like_the_original() {
    // 8-bit groups of 32 hold the GGUF's 4-bit grid almost exactly.
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(dir.path(), Some((32, 8)));
    greedy_matches(dir.path(), 16);
}

#[test]
fn broken_directories_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let err = |d: &Path| {
        mlxcel_daemon::load(d)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(
        err(dir.path()).contains("config.json"),
        "{}",
        err(dir.path())
    );
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "gpt_neox"}"#,
    )
    .unwrap();
    assert!(
        err(dir.path()).contains("config.json"),
        "missing fields are named: {}",
        err(dir.path())
    );
    let cfg = json!({"model_type": "falcon", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
                     "intermediate_size": 8, "vocab_size": 8});
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    assert!(
        err(dir.path()).contains("unsupported architecture `falcon`"),
        "{}",
        err(dir.path())
    );
    let cfg = json!({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
                     "intermediate_size": 8, "vocab_size": 8});
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    assert!(
        err(dir.path()).contains("no *.safetensors files"),
        "{}",
        err(dir.path())
    );
    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
    assert!(
        err(dir.path()).contains("not a readable safetensors file"),
        "{}",
        err(dir.path())
    );
}
