//! Daemons starting at once, with no compiled CPU kernels yet, each compile in a directory of
//! their own and both serve; the kernels they built reach the shared cache whole, and the next
//! daemon starts from them and sweeps the directories of daemons that were killed. Before,
//! every daemon compiled into `$TMPDIR/mlx`, where two could write (and one load) the same
//! half-written library.

use std::path::{Path, PathBuf};

use mlxcel_tests::daemon::{Daemon, frontend, greedy_generate, tokens_until_done};
use mlxcel_tests::root;

fn libraries(shared: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for v in std::fs::read_dir(shared.join("mlx"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for f in std::fs::read_dir(v.path().join("cpu"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if f.file_name().to_string_lossy().starts_with("lib") {
                out.push(f.path());
            }
        }
    }
    out
}

async fn generates(dir: &Path) {
    let mut c = frontend(dir).await;
    c.write_frame(&greedy_generate(1, vec![1, 2, 3, 4, 5, 6], 4))
        .await
        .unwrap();
    assert_eq!(tokens_until_done(&mut c, 1).await.len(), 4);
}

fn proc_dirs(cache: &Path) -> Vec<String> {
    std::fs::read_dir(cache.join("mlxcel/mlx-jit"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("proc-"))
        .collect()
}

#[tokio::test]
async fn concurrent_daemons_compile_apart_and_share_whole_kernels() {
    let tmp = mlxcel_tests::temp_dir("mxj");
    let cache = tmp.path().join("cache");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let dirs: Vec<PathBuf> = (0..2).map(|i| tmp.path().join(format!("d{i}"))).collect();
    let env = [("XDG_CACHE_HOME", cache.as_path())];
    let args = ["--kv-pool-bytes", "64MiB"];
    let mut daemons: Vec<Daemon> = dirs
        .iter()
        .map(|d| {
            std::fs::create_dir_all(d).unwrap();
            Daemon::spawn(d, &model, &args, &env)
        })
        .collect();
    for (d, dir) in daemons.iter_mut().zip(&dirs) {
        d.wait_serving(dir);
    }
    for dir in &dirs {
        generates(dir).await;
    }
    let shared = cache.join("mlxcel/mlx-jit/shared");
    if mlxcel_tests::compiles_cpu_kernels() {
        let libs = libraries(&shared);
        assert!(!libs.is_empty(), "no kernel reached the shared cache");
        for lib in &libs {
            let bytes = std::fs::read(lib).unwrap();
            assert!(
                bytes.starts_with(b"\x7fELF"),
                "{} is not a whole library",
                lib.display()
            );
        }
    } else {
        eprintln!("skipped the kernel checks: no CPU kernels are compiled here");
    }
    assert_eq!(
        proc_dirs(&cache).len(),
        2,
        "one directory per running daemon"
    );
    drop(daemons); // SIGKILL: their directories stay behind
    let third = tmp.path().join("d2");
    std::fs::create_dir_all(&third).unwrap();
    let mut d = Daemon::spawn(&third, &model, &args, &env);
    d.wait_serving(&third);
    generates(&third).await;
    let left = proc_dirs(&cache);
    assert_eq!(
        left,
        vec![format!("proc-{}", d.0.id())],
        "dead daemons' directories swept"
    );
}
