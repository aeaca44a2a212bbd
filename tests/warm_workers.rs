//! Warm-up workers (`--warm-up-workers`): on an empty kernel cache the daemon starts copies of
//! itself that each run a share of the warm-up (its prefill part, then its decode part), takes
//! the kernels they built from the cache, and its own warm-up builds none of them; then it
//! serves. `auto` starts them only on a CUDA GPU (where the GPU check's first daemon start runs
//! them); here two are asked for on the CPU, whose MLX compiles its fused kernels with the C++
//! compiler and caches them the same way.

use mlxcel_tests::daemon::{Daemon, frontend, greedy_generate, run_to_exit, tokens_until_done};
use mlxcel_tests::{compiles_cpu_kernels, default_model};

/// The sum of `kernels_built=N` over `lines`.
fn kernels_built<'a>(lines: impl Iterator<Item = &'a str>) -> usize {
    lines
        .filter(|l| l.contains("mlxcel_daemon::engine::warmup: warm-up:"))
        .filter_map(|l| l.split("kernels_built=").nth(1))
        .filter_map(|n| n.split_whitespace().next()?.parse::<usize>().ok())
        .sum()
}

#[tokio::test]
async fn workers_build_a_first_starts_kernels_and_the_daemon_builds_none_of_them() {
    let tmp = mlxcel_tests::temp_dir("mxw");
    let (dir, cache, log) = (
        tmp.path().join("d"),
        tmp.path().join("cache"),
        tmp.path().join("daemon.log"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let model = default_model();
    let args = ["--kv-pool-bytes", "64MiB", "--warm-up-workers", "2"];
    let env = [("XDG_CACHE_HOME", cache.as_path())];
    let mut d = Daemon::spawn_logged(&dir, &model, &args, &env, &log);
    d.wait_serving(&dir);

    let mut c = frontend(&dir).await;
    c.write_frame(&greedy_generate(1, vec![1, 2, 3, 4, 5, 6], 4))
        .await
        .unwrap();
    assert_eq!(tokens_until_done(&mut c, 1).await.len(), 4);

    let text = std::fs::read_to_string(&log).unwrap();
    for share in ["prefill:0/2", "prefill:1/2", "decode:0/2", "decode:1/2"] {
        assert!(
            text.contains(&format!("warm-up worker done share={share}")),
            "worker {share} did not finish:\n{text}"
        );
    }
    assert!(text.contains("workers=2 done=4"), "{text}");
    let (workers, daemon): (Vec<&str>, Vec<&str>) =
        text.lines().partition(|l| l.contains("warm_up_worker{"));
    assert!(
        kernels_built(daemon.iter().copied()) == 0 || !compiles_cpu_kernels(),
        "the daemon built kernels its workers should have:\n{text}"
    );
    if compiles_cpu_kernels() {
        assert!(
            kernels_built(workers.iter().copied()) > 0,
            "the workers built nothing:\n{text}"
        );
    } else {
        eprintln!("skipped the kernel counts: no CPU kernels are compiled here");
    }
}

#[test]
fn a_bad_worker_count_is_refused_before_the_model_loads() {
    let tmp = mlxcel_tests::temp_dir("mxw");
    let model = default_model();
    let out = run_to_exit(tmp.path(), &model, &["--warm-up-workers", "many"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`many` is not a number of warm-up workers"),
        "{err}"
    );
}
