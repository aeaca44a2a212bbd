//! Checkpoint layouts beyond a plain text model's directory, from the architecture fixtures
//! (`tests/fixtures/archs/`, `scripts/make_arch_goldens.py`): Gemma 3's multimodal layout loads
//! its text model, and what the engine cannot run is refused by name, never run wrong.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use mlxcel_daemon::device::DeviceChoice;
use mlxcel_daemon::kv::DenseKv;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/archs")
        .join(name)
}

/// A copy of fixture `name` in a temporary directory, its config and tensors changed by `edit`.
fn variant(
    name: &str,
    edit: impl FnOnce(&mut Value, &mut HashMap<String, Array>),
) -> tempfile::TempDir {
    let from = fixture(name);
    let dir = tempfile::tempdir().expect("tempdir");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(from.join(file), dir.path().join(file)).expect("copy");
    }
    let text = std::fs::read_to_string(from.join("config.json")).expect("config");
    let mut config: Value = serde_json::from_str(&text).expect("json");
    let mut tensors = Array::load_safetensors(from.join("model.safetensors")).expect("safetensors");
    edit(&mut config, &mut tensors);
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("write");
    Array::save_safetensors(tensors, None, dir.path().join("model.safetensors")).expect("save");
    dir
}

fn refusal(dir: &Path) -> String {
    match mlxcel_daemon::load_on(dir, DeviceChoice::Cpu) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn gemma3_multimodal_checkpoints_serve_their_text_model() {
    let dir = variant("gemma3_text", |config, tensors| {
        let text_config = config.take();
        *config = json!({"model_type": "gemma3", "text_config": text_config});
        let moved: Vec<String> = tensors.keys().cloned().collect();
        for name in moved {
            if let Some(t) = tensors.remove(&name) {
                tensors.insert(format!("language_model.{name}"), t);
            }
        }
        // The vision tower's tensors are there, and left unread.
        tensors.insert(
            "vision_tower.patch_embedding.weight".into(),
            Array::from_slice(&[1f32; 4], &[2, 2]),
        );
    });
    let m = mlxcel_daemon::load_on(dir.path(), DeviceChoice::Cpu).expect("load");
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("gemma3_text").join("reference.json")).expect("ref"),
    )
    .expect("json");
    let case = &reference["cases"][0];
    let prompt: Vec<u32> = case["prompt"]
        .as_array()
        .expect("prompt")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect();
    let logits = m
        .model
        .forward(&prompt, &mut DenseKv::new(m.model.config.layers))
        .expect("forward");
    let worst = logits
        .as_slice::<f32>()
        .iter()
        .zip(case["last_logits"].as_array().expect("logits"))
        .map(|(a, b)| (a - b.as_f64().expect("f64") as f32).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "logits differ by up to {worst}");
}

#[test]
fn what_cannot_run_is_refused_by_name() {
    let dynamic = variant("qwen3_moe", |config, _| {
        config["rope_scaling"] = json!({"rope_type": "longrope", "factor": 4.0});
    });
    assert!(
        refusal(dynamic.path()).contains("rope_scaling type `longrope` is not supported"),
        "{}",
        refusal(dynamic.path())
    );
    let original = variant("gpt_oss", |_, tensors| {
        tensors.insert(
            "model.layers.0.mlp.experts.gate_up_proj_blocks".into(),
            Array::from_slice(&[0u8; 16], &[1, 16]),
        );
    });
    assert!(refusal(original.path()).contains("mlx_lm.convert"));
    let layer_type = variant("gpt_oss", |config, _| {
        config["layer_types"] = json!(vec!["chunked_attention"; 4]);
    });
    assert!(refusal(layer_type.path()).contains("layer type `chunked_attention`"));
    // A quantized tensor with scales but neither biases nor a float format's u8 scales.
    let garbled = variant("qwen3_moe_q4", |_, tensors| {
        tensors.remove("model.layers.0.self_attn.q_proj.biases");
    });
    let why = refusal(garbled.path());
    assert!(
        why.contains("model.layers.0.self_attn.q_proj") && why.contains("scales without biases"),
        "{why}"
    );
}
