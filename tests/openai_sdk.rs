//! The official `openai` Python SDK (installed in .venv by `make test`'s setup) drives the real
//! stack: models, chat with and without streaming, completions, and errors mapped to the SDK's
//! exception classes. The checks live in `openai_sdk.py`.

use std::process::Command;

use mlxcel_tests::root;
use mlxcel_tests::stack::{Stack, StackOptions};

#[test]
fn the_official_openai_python_sdk_works_against_the_front_end() {
    let python = root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make test` (its setup installs the openai SDK)",
        python.display()
    );
    let stack = Stack::start(StackOptions::default());
    let keyed = stack.another_frontend(&["--api-key", "sesame"]);
    let out = Command::new(python)
        .arg(root().join("tests/openai_sdk.py"))
        .env("MLXCEL_URL", &stack.frontend.url)
        .env("MLXCEL_KEYED_URL", &keyed.url)
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("SDK checks passed"), "{stdout}");
}
