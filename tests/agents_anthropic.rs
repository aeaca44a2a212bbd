//! The official `anthropic` Python SDK against the real stack: messages and streams, forced tool
//! calls and their results, count_tokens, `cache_control` pins that outlive a churn of the whole
//! cache (the manager's capacity here is small), `x-api-key`, and errors in Anthropic's shape.
//! The checks live in `agents_anthropic.py`.

use std::process::Command;

use mlxcel_tests::root;
use mlxcel_tests::stack::{Stack, StackOptions};

/// The cache's capacity in blocks: room for the pinned system prompt (17 blocks, within half
/// of it) and for about one of the churn's prompts (28 blocks each) beside it.
const CAPACITY_BLOCKS: u64 = 48;

#[test]
fn the_official_anthropic_python_sdk_works_against_the_front_end() {
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (its setup installs the SDKs)",
        python.display()
    );
    let capacity = (CAPACITY_BLOCKS * mlxcel_tests::daemon::block_bytes()).to_string();
    let stack = Stack::start(StackOptions {
        cachemgr_args: vec!["--capacity-bytes".into(), capacity],
        ..StackOptions::default()
    });
    let keyed = stack.another_frontend(&["--api-key", "sesame"]);
    let out = Command::new(python)
        .arg(root().join("tests/agents_anthropic.py"))
        .env("MLXCEL_URL", &stack.frontend.url)
        .env("MLXCEL_KEYED_URL", &keyed.url)
        .env(
            "MLXCEL_BLOCK_TOKENS",
            mlxcel_tests::daemon::block_tokens().to_string(),
        )
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("anthropic checks passed"), "{stdout}");
}
