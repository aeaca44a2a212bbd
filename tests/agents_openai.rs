//! What agents send, through the official `openai` Python SDK against the real stack: structured
//! outputs, forced tool calls (created and streamed), a tool result's round trip and the cache
//! reuse of the turn before, logit_bias, the Responses API, and the 400s for tools a template
//! cannot offer and for unknown fields. The checks live in `agents_openai.py`.

use std::process::Command;

use mlxcel_tests::root;
use mlxcel_tests::stack::{Stack, StackOptions};

#[test]
fn agents_get_tools_structured_outputs_and_the_responses_api() {
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (its setup installs the SDKs)",
        python.display()
    );
    let stack = Stack::start(StackOptions::default());
    let out = Command::new(python)
        .arg(root().join("tests/agents_openai.py"))
        .env("MLXCEL_URL", &stack.frontend.url)
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
    assert!(stdout.contains("agent checks passed"), "{stdout}");
}
