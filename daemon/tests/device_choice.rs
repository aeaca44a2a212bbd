//! `--device auto|gpu|cpu`: the startup log names the backend; asking for a GPU that MLX does
//! not have here is a clear startup error, and a device that does not exist is refused by the
//! flag parser.

mod support;

use mlxcel_daemon::device::{DeviceChoice, DeviceKind, Placement};
use mlxcel_tests::daemon::{Daemon, run_to_exit};
use mlxcel_tests::root;

#[test]
fn a_gpu_that_is_not_there_is_a_clear_startup_error() {
    if Placement::choose(DeviceChoice::Gpu).is_ok() {
        eprintln!("SKIPPED: this machine has a GPU backend; the refusal cannot be shown here");
        return;
    }
    let dir = mlxcel_tests::temp_dir("mxv");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let out = run_to_exit(dir.path(), &model, &["--device", "gpu"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--device gpu: this MLX build has no GPU backend"),
        "{stderr}"
    );

    let out = run_to_exit(dir.path(), &model, &["--device", "tpu"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`tpu` is not a device: auto, gpu or cpu"),
        "{stderr}"
    );
}

#[test]
fn the_cpu_can_be_chosen_by_flag_and_is_named() {
    let cpu = Placement::choose(DeviceChoice::Cpu).unwrap();
    assert_eq!((cpu.kind, cpu.gpu), (DeviceKind::Cpu, false));
    assert_eq!(cpu.describe(), "cpu, Float32");
    let dir = mlxcel_tests::temp_dir("mxv");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    // Started with --device cpu, the daemon loads the model and serves.
    let _d = Daemon::start(
        dir.path(),
        &model,
        &["--device", "cpu", "--kv-pool-bytes", "64MiB"],
    );
}
