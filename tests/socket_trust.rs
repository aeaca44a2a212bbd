//! Clients trust a socket only in a directory that is ours alone. Before, the front end and
//! `mlxcelctl` connected to whatever socket directory they were given: another local user who
//! created it first (on macOS always `/tmp/mlxcel-<uid>`) would receive every prompt. Now a
//! directory others may enter, or one owned by another user, is one clear line and exit 1.

use mlxcel_tests::{http, serve as stack};

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use stack::{bin, wait_until};

fn ctl(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(bin("mlxcelctl"))
        .args(args)
        .arg("--socket-dir")
        .arg(dir)
        .env("XDG_CONFIG_HOME", dir)
        .env("XDG_STATE_HOME", dir)
        .output()
        .unwrap()
}

fn refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_socket_directory_others_can_enter_or_own_is_refused_by_clients() {
    let dir = mlxcel_tests::temp_dir("mxt");
    let d = dir.path();
    let _manager = Killed(
        Command::new(bin("mlxcel-cachemgr"))
            .arg("--socket-dir")
            .arg(d)
            .env("XDG_CONFIG_HOME", d)
            .env("XDG_STATE_HOME", d)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(Duration::from_secs(60), "the manager answered", || {
        ctl(&["cache", "stats"], d).status.success()
    });

    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    refused(&ctl(&["cache", "stats"], d), "must be 0700");
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(ctl(&["cache", "stats"], d).status.success());

    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped the other-owner half: needs root to chown the directory");
        return;
    }
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(d, nobody, None).unwrap();
    refused(&ctl(&["cache", "stats"], d), "belongs to uid 65534");
    let port = http::free_port().to_string();
    let front = Command::new(bin("mlxcel-frontend"))
        .args(["--port", &port, "--socket-dir"])
        .arg(d)
        .env("XDG_CONFIG_HOME", d)
        .output()
        .unwrap();
    refused(&front, "owned by uid 65534");
    nix::unistd::chown(d, Some(nix::unistd::geteuid()), None).unwrap();
}
