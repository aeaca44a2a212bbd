//! The GPUs' formulations of the model (MLX's fused attention and RoPE; on CUDA prefill chunks
//! padded to a few shapes, on Metal exact ones), checked where the suite runs (CI has no GPU)
//! through MLX's CPU reference of the fused ops, with the default model in f32: greedy tokens
//! against the float64 reference, and last-position logits equal to the CPU formulation's for
//! prompts and chunk sizes that pad every way (short and long contexts, chunks that split them).
//! CUDA's padded formulation is its backend's, compiled in CUDA builds and with the `cuda`
//! feature (`make check-cuda` runs this file so); without it only Metal's is checked here.

use mlxcel_daemon::device::Placement;
use mlxcel_daemon::generate::{FinishReason, GenerateRequest, generate};
use mlxcel_daemon::kv::DenseKv;
use mlxcel_daemon::model::Model;
use mlxcel_daemon::sampler::SamplingParams;
use mlxcel_daemon::{Loaded, load_on, load_placed};
use mlxcel_tests::{fixtures, ids, root};

fn path() -> std::path::PathBuf {
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run `make setup`",
        path.display()
    );
    path
}

/// CUDA's formulation (`padded`) or Metal's.
fn gpu_formulation(padded: bool) -> Loaded {
    placed(Placement::formulation_on_cpu(padded))
}

fn placed(placement: Placement) -> Loaded {
    let m = load_placed(&path(), placement).expect("load");
    assert!(m.model.placement.gpu);
    m
}

/// The logits after prefilling `tokens` in chunks of `chunk`.
fn last_logits(model: &Model, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut kv = DenseKv::new(model.config.layers);
    let mut last = None;
    for piece in tokens.chunks(chunk) {
        last = Some(model.forward(piece, &mut kv).expect("forward"));
    }
    let last = last.expect("a prompt");
    last.eval().expect("eval");
    last.as_slice::<f32>().to_vec()
}

#[test]
fn greedy_tokens_match_the_float64_reference() {
    greedy_tokens(&gpu_formulation(false), &[7]);
}

#[cfg(mlxcel_cuda)]
#[test]
fn padded_greedy_tokens_match_the_float64_reference() {
    // 16 pads nothing but the last chunk and 7 pads every chunk (7 of 16 rows).
    greedy_tokens(&gpu_formulation(true), &[16, 7]);
}

fn greedy_tokens(m: &Loaded, chunks: &[usize]) {
    for chat in fixtures()["chats"].as_array().unwrap() {
        let prompt = ids(&chat["prompt_ids"]);
        let want = ids(&chat["greedy_ids"]);
        for &prefill_chunk in chunks {
            let mut kv = DenseKv::new(m.model.config.layers);
            let req = GenerateRequest {
                prompt: prompt.clone(),
                max_tokens: 32,
                stop_ids: vec![],
                sampling: SamplingParams::default(),
                prefill_chunk,
            };
            let got = generate(&m.model, &mut kv, &req, |_| true).unwrap();
            assert_eq!(got.finish, FinishReason::Length);
            assert_eq!(
                got.tokens, want,
                "chunk {prefill_chunk}: {:?}",
                chat["messages"]
            );
        }
    }
}

#[test]
fn metals_exact_prefill_gives_the_cpu_formulations_logits() {
    let cpu = load_on(&path(), mlxcel_daemon::device::DeviceChoice::Cpu).expect("load");
    let long = long_prompt();
    let cases = [(&long[..300], 100), (&long[..], 512)];
    same_logits(&cpu.model, &gpu_formulation(false).model, &cases);
}

fn long_prompt() -> Vec<u32> {
    let base = ids(&fixtures()["chats"][0]["prompt_ids"]);
    base.iter().copied().cycle().take(1100).collect()
}

#[cfg(mlxcel_cuda)]
#[test]
fn padded_prefill_gives_the_cpu_formulations_logits() {
    let cpu = load_on(&path(), mlxcel_daemon::device::DeviceChoice::Cpu).expect("load");
    assert!(!cpu.model.placement.gpu);
    let long = long_prompt();
    // Short contexts (one key bucket), past 1024 keys (queries padded to 512 rows, keys to
    // 2048), chunks that leave a short tail, and a tail of 6 tokens over 1030 keys (its 16
    // query rows kept).
    let cases = [
        (&long[..300], 512),
        (&long[..300], 100),
        (&long[..], 512),
        (&long[..1030], 512),
    ];
    same_logits(&cpu.model, &gpu_formulation(true).model, &cases);
}

fn same_logits(cpu: &Model, gpu: &Model, cases: &[(&[u32], usize)]) {
    for &(tokens, chunk) in cases {
        let want = last_logits(cpu, tokens, chunk);
        let got = last_logits(gpu, tokens, chunk);
        let worst = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let scale = want.iter().map(|a| a.abs()).fold(0f32, f32::max);
        assert!(
            // Measured: at most 5.3e-5 against logits up to 35 (f32, other op orders); a
            // padding row seen by a real query moved them by 3.7.
            worst <= 1e-4 * scale.max(1.0),
            "{} tokens in chunks of {chunk}, padded {}: logits differ by {worst} (largest {scale})",
            tokens.len(),
            gpu.placement.pads_prefill,
        );
    }
}
