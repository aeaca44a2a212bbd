//! Qwen2 (q/k/v biases) and Qwen3 (per-head q/k RMS norms) through the engine, against the NumPy
//! float64 reference with the same extra parameters (scripts/reference_llama.py,
//! `variant_extras`). The variants are the default model's weights plus those parameters, written
//! as Hugging Face directories; their greedy tokens differ from the plain model's, so a path that
//! ignored the biases or norms would fail.

mod support;

use mlxcel_daemon::model::Arch;
use mlxcel_tests::{fixtures, ids};
use support::{HfDir, write_hf_dir};

fn check(arch: &'static str, expected: Arch) {
    let f = fixtures();
    let variant = f["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["arch"] == arch)
        .expect("variant fixture");
    let chat = &f["chats"][variant["chat"].as_u64().unwrap() as usize];
    let want = ids(&variant["greedy_ids"]);
    assert_ne!(
        want,
        ids(&chat["greedy_ids"])[..want.len()],
        "the variant must change the output"
    );
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(
        dir.path(),
        HfDir {
            arch: Some(arch),
            ..HfDir::default()
        },
    );
    let m = mlxcel_daemon::load(dir.path()).unwrap();
    assert_eq!(m.model.config.arch, expected);
    assert_eq!(
        support::greedy(&m.model, ids(&chat["prompt_ids"]), want.len()),
        want
    );
}

#[test]
fn qwen2_biases_match_the_reference() {
    check("qwen2", Arch::Qwen2);
}

#[test]
fn qwen3_qk_norms_match_the_reference() {
    check("qwen3", Arch::Qwen3);
}
