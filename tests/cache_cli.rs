//! `mlxcelctl cache ...` as a user runs it: the real binary against a real cache manager.

use std::path::Path;
use std::process::{Command, Output};

use mlxcel_tests::bin;
use mlxcel_tests::cache_daemon::TestDaemon;
use mlxcel_tests::geometry::{prompt_hashes, smollm2};
use mlxcel_tests::manager::Manager;

fn ctl(dir: &Path, args: &[&str]) -> Output {
    Command::new(bin("mlxcelctl"))
        .arg("--socket-dir")
        .arg(dir)
        .args(args)
        .output()
        .expect("run mlxcelctl")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "mlxcelctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// Starts a manager and fills it with `prompts` distinct 3-block prompts through a test daemon.
async fn filled(prompts: u32, extra: &[&str]) -> (Manager, TestDaemon) {
    let m = Manager::start(&bin("mlxcel-cachemgr"), extra);
    let mut d = TestDaemon::register(&m.socket, smollm2(256)).await;
    for p in 0..prompts {
        d.donate(&prompt_hashes(p, 0, p, 3), &[p * 3, p * 3 + 1, p * 3 + 2])
            .await;
    }
    d.barrier().await;
    (m, d)
}

#[tokio::test]
async fn stats_json_has_raw_bytes_and_every_documented_field() {
    let (m, _d) = filled(2, &["--capacity-bytes", "512MiB"]).await;
    let v = json(&ctl(m.dir.path(), &["cache", "stats", "--json"]));
    assert_eq!(v["capacity_bytes"], 512u64 << 20);
    assert_eq!(v["used_bytes"], 6 * 737_280);
    assert_eq!(v["blocks"], 6);
    assert_eq!(v["block_bytes"], 737_280);
    assert_eq!(v["block_tokens"], 32);
    assert_eq!(v["entries"], 2);
    assert_eq!(v["daemon"]["geometry"]["layers"], 30);
    for field in [
        "pinned_bytes",
        "releasing_bytes",
        "prefix_hits",
        "prefix_misses",
        "hit_tokens",
        "miss_tokens",
        "inserted_blocks",
        "active_leases",
        "drift_bytes",
        "last_reconcile_ms_ago",
    ] {
        assert!(v.get(field).is_some(), "missing {field}");
    }
    for reason in ["capacity", "ttl", "max_blocks", "manual", "daemon_lost"] {
        assert_eq!(v["evicted_blocks"][reason], 0, "evicted_blocks.{reason}");
    }
    for reason in ["capacity", "max_blocks", "release_timeout", "invalid_block"] {
        assert!(
            v["rejected_blocks"].get(reason).is_some(),
            "rejected_blocks.{reason}"
        );
    }
    let table = ctl(m.dir.path(), &["cache", "stats"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("4.22 MiB in 6 blocks"), "{text}");
    assert!(text.contains("512.00 MiB"), "{text}");
}

#[tokio::test]
async fn evict_reduces_used_bytes_by_each_selector() {
    let (m, mut d) = filled(4, &[]).await;
    let dir = m.dir.path();
    let used = |dir: &Path| {
        json(&ctl(dir, &["cache", "stats", "--json"]))["used_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(used(dir), 12 * 737_280);

    let entries = json(&ctl(dir, &["cache", "ls", "--json"]));
    let id = entries[0]["id"].as_str().unwrap().to_string();
    let out = ctl(dir, &["cache", "evict", "--entry", &id]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("evicted 3 blocks (2.11 MiB)"));
    assert_eq!(used(dir), 9 * 737_280);

    let out = ctl(dir, &["cache", "evict", "--to-bytes", "2MiB"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(used(dir), 2 * 737_280);

    assert!(
        ctl(dir, &["cache", "evict", "--older-than", "1h"])
            .status
            .success()
    );
    assert_eq!(used(dir), 2 * 737_280, "nothing is an hour old");

    assert!(ctl(dir, &["cache", "evict", "--all"]).status.success());
    assert_eq!(used(dir), 0);
    d.barrier().await;
    assert!(
        d.held.is_empty(),
        "the daemon was told to release every block"
    );

    let out = ctl(dir, &["cache", "evict", "--entry", "feedfacefeedface"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no cache entry with id"));
}

#[tokio::test]
async fn set_capacity_and_reconcile_work_at_runtime() {
    let (m, mut d) = filled(3, &[]).await;
    let dir = m.dir.path().to_path_buf();
    let out = ctl(&dir, &["cache", "set-capacity", "3MiB"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("capacity set to 3.00 MiB"));
    d.barrier().await;
    let v = json(&ctl(&dir, &["cache", "stats", "--json"]));
    assert_eq!(v["capacity_bytes"], 3 << 20);
    assert_eq!(v["blocks"], 4, "3 MiB holds 4 whole 720 KiB blocks");
    assert_eq!(v["evicted_blocks"]["capacity"], 5);

    // Reconcile needs the daemon to answer: run the CLI while the test daemon reads.
    let ctl_run = tokio::task::spawn_blocking(move || ctl(&dir, &["cache", "reconcile", "--json"]));
    while !matches!(
        d.recv().await,
        Some(mlxcel_ipc::proto::cache::CacheToDaemon::InventoryRequest { .. })
    ) {}
    let v = json(&ctl_run.await.unwrap());
    assert_eq!(v["drift_bytes"], 0);
    assert_eq!(v["ledger_bytes"], 4 * 737_280);
}

#[test]
fn a_stopped_manager_is_a_one_line_error_and_a_failure_exit() {
    let dir = tempfile::tempdir().unwrap();
    let out = ctl(dir.path(), &["cache", "stats"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("cache manager is not running"), "{err}");
}

#[test]
fn bad_sizes_and_missing_selectors_are_refused_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let out = ctl(dir.path(), &["cache", "evict", "--to-bytes", "lots"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"));
    let out = ctl(dir.path(), &["cache", "evict"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--entry"));
}
