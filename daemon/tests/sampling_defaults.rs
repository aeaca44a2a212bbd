//! The real daemon resolves the sampling defaults of the model it loads and hands them to the
//! front end in its model info: the model's generation_config.json first, then the operator's
//! settings, then the server's; a malformed file stops it with a message naming the file.

mod support;

use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon, SamplingDefaults};
use mlxcel_tests::daemon::{Daemon, frontend, run_to_exit};
use mlxcel_tests::root;
use support::{HfDir, write_hf_dir};

async fn defaults_of(dir: &std::path::Path) -> SamplingDefaults {
    let mut c = frontend(dir).await;
    c.write_frame(&FrontendToDaemon::Info).await.unwrap();
    match c.read_frame::<DaemonToFrontend>().await.unwrap() {
        Some(DaemonToFrontend::Info(info)) => info.sampling_defaults,
        other => panic!("expected the model info, got {other:?}"),
    }
}

#[tokio::test]
async fn an_hf_directorys_generation_config_comes_before_the_settings() {
    let sockets = mlxcel_tests::temp_dir("mxd");
    let model = tempfile::tempdir().unwrap();
    write_hf_dir(model.path(), HfDir::default());
    std::fs::write(
        model.path().join("generation_config.json"),
        r#"{"eos_token_id": 2, "temperature": 0.0, "top_k": 7, "repetition_penalty": 1.1}"#,
    )
    .unwrap();
    let args = [
        "--kv-pool-bytes",
        "64MiB",
        "--default-temperature",
        "0.9",
        "--default-min-p",
        "0.05",
    ];
    let _d = Daemon::start(sockets.path(), model.path(), &args);
    let got = defaults_of(sockets.path()).await;
    let want = SamplingDefaults {
        temperature: 0.0,        // the model's file beats --default-temperature
        top_p: 1.0,              // nobody set it: the server's
        top_k: 7,                // the model's file
        min_p: 0.05,             // the operator's setting
        repetition_penalty: 1.1, // the model's file
    };
    assert_eq!(got, want);
}

#[tokio::test]
async fn the_default_model_ships_with_its_cards_settings() {
    let sockets = mlxcel_tests::temp_dir("mxd");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let _d = Daemon::start(sockets.path(), &model, &["--kv-pool-bytes", "64MiB"]);
    let got = defaults_of(sockets.path()).await;
    assert_eq!((got.temperature, got.top_p), (0.2, 0.9), "{got:?}");
}

#[test]
fn a_malformed_generation_config_stops_the_daemon_naming_the_file() {
    let sockets = mlxcel_tests::temp_dir("mxd");
    let model = tempfile::tempdir().unwrap();
    // A GGUF model's settings live beside it: link the default model into a folder of our own.
    let gguf = model.path().join("smol.gguf");
    std::os::unix::fs::symlink(root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"), &gguf)
        .unwrap();
    std::fs::write(
        model.path().join("smol.generation_config.json"),
        "{\"temperature\": }",
    )
    .unwrap();
    let out = run_to_exit(sockets.path(), &gguf, &["--kv-pool-bytes", "64MiB"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("smol.generation_config.json") && stderr.contains("not valid JSON"),
        "{stderr}"
    );
}
