//! The test kit every end-to-end test shares: where the binaries and fixtures are, free ports,
//! waiting on events, and the real processes (the stack under `mlxcelctl serve`, the three
//! processes started one by one, a daemon alone, a cache manager alone), plus a test daemon
//! client of the cache manager and SmolLM2-135M's geometry.
//!
//! The tests themselves are the files next to this directory (`tests/*.rs`); the crates'
//! own tests use the kit as a dev-dependency.
//!
//! # Layout
//! - [`serve`]: the stack under `mlxcelctl serve`; [`stack`]: the three processes one by one.
//! - [`daemon`]: a daemon alone; [`manager`]: a cache manager alone; [`cache_daemon`]: a test
//!   daemon client of the manager; [`geometry`]: SmolLM2-135M's geometry.
//! - [`http`]: blocking HTTP/1.1 for tests, and free ports.
//! - Here: where binaries and fixtures are, waiting on events, and [`knob`], the benchmarks'
//!   and tests' own `MLXCEL_*` settings.

pub mod cache_daemon;
pub mod daemon;
pub mod geometry;
pub mod http;
pub mod manager;
pub mod serve;
pub mod stack;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory holding the workspace's binaries: `MLXCEL_TEST_BIN_DIR` when set, else the
/// running test's own target directory (`target/<profile>/`, above `deps/`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MLXCEL_TEST_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().expect("the test's directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.parent().map(PathBuf::from).unwrap_or(dir)
    } else {
        dir
    }
}

/// The path of the workspace binary `name`, which must have been built.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (make test does)",
        path.display()
    );
    path
}

/// The default model's file.
pub fn default_model() -> PathBuf {
    root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Whether MLX compiles CPU kernels here (and caches them): only on Linux where it finds a C++
/// compiler (`make setup` installs g++).
pub fn compiles_cpu_kernels() -> bool {
    let compiler = std::process::Command::new("g++")
        .arg("--version")
        .output()
        .is_ok();
    cfg!(target_os = "linux") && compiler
}

/// A benchmark's or test's own knob, `MLXCEL_<name>` in the environment (benchmark settings
/// such as `BENCH_CASES`, the kernel-source directory of `make check-cuda`): read here, in the
/// test kit, so that no crate reads `MLXCEL_*` variables outside the configuration table.
pub fn knob(name: &str) -> Option<String> {
    std::env::var(format!("MLXCEL_{name}")).ok()
}

/// [`knob`] parsed, or `default` where it is unset or does not parse.
pub fn knob_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    knob(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The engine's golden fixtures (prompts rendered by the reference template engine, token ids).
pub fn fixtures() -> Value {
    let path = root().join("daemon/tests/fixtures/smollm2_golden.json");
    let text = std::fs::read_to_string(&path).expect("golden fixtures");
    serde_json::from_str(&text).expect("fixture JSON")
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Polls `ok` until it holds; fails the test after `limit`, naming `what`. The limit is a
/// bound on a hang, not a timing: keep it far above what the work needs on a busy machine.
pub fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fresh private directory under /tmp (socket paths must stay short), named `prefix…`.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("temp dir")
}
