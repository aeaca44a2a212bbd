//! The engine against independent implementations of the same GGUF file (fixtures made by
//! `scripts/make_goldens.py`): llama.cpp's tokenizer, and a NumPy float64 reference forward pass
//! for greedy tokens. Uses the default model that `make setup` places in `models/`.

mod support;

use mlxcel_daemon::generate::{FinishReason, GenerateRequest, generate};
use mlxcel_daemon::kv::DenseKv;
use mlxcel_daemon::sampler::SamplingParams;
use mlxcel_daemon::{Loaded, load};
use mlxcel_tests::{fixtures, ids, root};

/// MLX arrays stay on the thread that made them, so each test loads its own copy (~1 s).
fn model() -> Loaded {
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run `make setup`",
        path.display()
    );
    let m = load(&path).expect("load the default model");
    // Which backend this run proves (CI has no GPU: the GPU half is skipped there, visibly).
    if m.model.placement.gpu {
        eprintln!("golden: on the GPU ({})", m.model.placement.kind);
    } else {
        eprintln!("golden: on the CPU; GPU golden run SKIPPED (this MLX build has no GPU)");
    }
    m
}

#[test]
fn tokenization_matches_llama_cpp_for_tricky_strings() {
    let m = model();
    let f = fixtures();
    let cases = f["tokenization"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            m.text.encode(text).unwrap(),
            ids(&case["ids"]),
            "tokenizing {text:?}"
        );
        assert_eq!(
            m.text.decode(&ids(&case["ids"])).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
}

#[test]
fn rendered_chat_prompts_tokenize_like_llama_cpp() {
    let m = model();
    for chat in fixtures()["chats"].as_array().unwrap() {
        assert_eq!(
            m.text.encode(chat["prompt"].as_str().unwrap()).unwrap(),
            ids(&chat["prompt_ids"])
        );
    }
}

#[test]
fn greedy_tokens_match_the_float64_reference() {
    let m = model();
    // f32 on the CPU matches all 32 tokens; f16 on Metal is held to the first 16.
    let required = if m.model.placement.gpu { 16 } else { 32 };
    for chat in fixtures()["chats"].as_array().unwrap() {
        let prompt = ids(&chat["prompt_ids"]);
        let want = ids(&chat["greedy_ids"]);
        let mut kv = DenseKv::new(m.model.config.layers);
        let req = GenerateRequest {
            prompt,
            max_tokens: 32,
            stop_ids: vec![],
            sampling: SamplingParams::default(),
            prefill_chunk: 16,
        };
        let got = generate(&m.model, &mut kv, &req, |_| true).unwrap();
        assert_eq!(got.finish, FinishReason::Length);
        assert_eq!(
            &got.tokens[..required],
            &want[..required],
            "prompt {:?}",
            chat["messages"]
        );
        assert!(got.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
    }
}

#[test]
fn tokenizer_json_round_trips_for_the_front_end() {
    let m = model();
    let json = m.text.tokenizer_json().unwrap();
    let rebuilt: tokenizers::Tokenizer = json.parse().expect("tokenizer.json parses");
    let f = fixtures();
    for case in f["tokenization"].as_array().unwrap() {
        let enc = rebuilt
            .encode(case["text"].as_str().unwrap(), true)
            .unwrap();
        assert_eq!(enc.get_ids(), ids(&case["ids"]).as_slice());
    }
    assert_eq!(m.text.context_length, 8192);
    assert_eq!(m.text.eos, Some(2));
    assert!(m.text.stop_ids.contains(&2), "<|im_end|> ends a turn");
    assert!(
        m.text
            .chat_template
            .as_deref()
            .unwrap()
            .contains("<|im_start|>")
    );
}

#[test]
fn stop_tokens_end_generation_and_seeds_reproduce_samples() {
    let m = model();
    let prompt = ids(&fixtures()["chats"][0]["prompt_ids"]);
    let run = |sampling: SamplingParams, stop: Vec<u32>| {
        let mut kv = DenseKv::new(m.model.config.layers);
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: 24,
            stop_ids: stop,
            sampling,
            prefill_chunk: 512,
        };
        generate(&m.model, &mut kv, &req, |_| true).unwrap()
    };
    let greedy = run(SamplingParams::default(), m.text.stop_ids.clone());
    assert_eq!(greedy.finish, FinishReason::Stop);
    assert_eq!(
        m.text.decode(&greedy.tokens).unwrap(),
        "The capital of France is Paris."
    );
    let sampled = |seed| SamplingParams {
        temperature: 1.0,
        top_p: 0.95,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let a = run(sampled(42), vec![]);
    let b = run(sampled(42), vec![]);
    assert_eq!(a.tokens, b.tokens, "same seed, same tokens");
    let c = run(sampled(43), vec![]);
    assert_ne!(a.tokens, c.tokens, "another seed, another sample");
}

#[test]
fn prompts_over_the_context_window_are_refused() {
    let m = model();
    let mut kv = DenseKv::new(m.model.config.layers);
    let req = GenerateRequest {
        prompt: vec![1; 8192],
        max_tokens: 1,
        stop_ids: vec![],
        sampling: SamplingParams::default(),
        prefill_chunk: 512,
    };
    let err = generate(&m.model, &mut kv, &req, |_| true).expect_err("refused");
    assert!(err.to_string().contains("context window is 8192"), "{err}");
}

#[test]
fn dense_f32_and_f16_gguf_files_load_and_match() {
    let dir = tempfile::tempdir().unwrap();
    let chat = &fixtures()["chats"][0];
    for (dtype, required) in [(mlx_rs::Dtype::Float32, 32), (mlx_rs::Dtype::Float16, 32)] {
        let path = dir.path().join(format!("smollm2-{dtype:?}.gguf"));
        support::write_dense_gguf(&path, dtype);
        let m = load(&path).expect("load the dense GGUF");
        let got = support::greedy(&m.model, ids(&chat["prompt_ids"]), required);
        assert_eq!(got, ids(&chat["greedy_ids"])[..required], "{dtype:?}");
    }
}
