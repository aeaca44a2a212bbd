//! The MLX / Hugging Face directory path, end to end: the default GGUF model is rewritten as a
//! Hugging Face checkpoint (HF tensor names, Q/K rows un-permuted back to rotate-half RoPE order,
//! config.json, tokenizer.json, tokenizer_config.json), dense and mlx-community-style quantized,
//! then loaded through the directory loader and held to the same golden tokens.

mod support;

use std::path::Path;

use mlxcel_tests::{fixtures, ids};
use serde_json::json;
use support::{HfDir, write_hf_dir};

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
    for chat in fixtures()["chats"].as_array().unwrap() {
        assert_eq!(
            m.text.encode(chat["prompt"].as_str().unwrap()).unwrap(),
            ids(&chat["prompt_ids"])
        );
        let got = support::greedy(&m.model, ids(&chat["prompt_ids"]), required);
        assert_eq!(
            got,
            ids(&chat["greedy_ids"])[..required],
            "prompt {:?}",
            chat["messages"]
        );
    }
}

#[test]
fn a_dense_hf_directory_gives_the_golden_tokens() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(dir.path(), HfDir::default());
    greedy_matches(dir.path(), 32);
}

#[test]
fn an_mlx_quantized_directory_loads_and_generates_like_the_original() {
    // 8-bit groups of 32 hold the GGUF's 4-bit grid almost exactly.
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(
        dir.path(),
        HfDir {
            quantize: Some((32, 8)),
            ..HfDir::default()
        },
    );
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
