//! Each process refuses a bad start with one clear line and a failure exit (never a panic):
//! missing or corrupt model files, a port in use, an unusable socket directory, a stale socket,
//! a non-loopback bind without a key, and an unwritable stderr. Also: a client running as
//! another user is refused by the daemon, and prompts and keys never reach the logs at the
//! default level.

use mlxcel_tests::{http, serve as stack};

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use stack::{Served, bin, wait_until};

/// Runs `name args...` with no configuration file; it must exit by itself within 60 s.
fn run(name: &str, args: &[&str], dir: &Path) -> Output {
    let mut child = Command::new(bin(name))
        .args(args)
        .env("XDG_CONFIG_HOME", dir)
        .env_remove("MLXCEL_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} {args:?} kept running instead of refusing to start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The process failed cleanly with a message containing `needle`.
fn refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(needle), "{needle:?} not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_models_ports_and_socket_dirs_are_clear_startup_errors() {
    let dir = mlxcel_tests::temp_dir("mxe");
    let d = dir.path().to_str().unwrap();
    let sockets = ["--socket-dir", d];

    let out = run(
        "mlxcel-daemon",
        &[&sockets[..], &["--model", "/nowhere/model.gguf"]].concat(),
        dir.path(),
    );
    refused(&out, "/nowhere/model.gguf");
    let corrupt = dir.path().join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\x00\x00\x00 this is not a model").unwrap();
    let c = corrupt.to_str().unwrap();
    let out = run(
        "mlxcel-daemon",
        &[&sockets[..], &["--model", c]].concat(),
        dir.path(),
    );
    refused(&out, "corrupt.gguf");
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "hello").unwrap();
    let out = run(
        "mlxcel-daemon",
        &[&sockets[..], &["--model", notes.to_str().unwrap()]].concat(),
        dir.path(),
    );
    refused(&out, "notes.txt");

    // A socket directory that cannot exist (below a regular file).
    let under_file = format!("{}/x", notes.display());
    for name in ["mlxcel-cachemgr", "mlxcel-daemon"] {
        let out = run(name, &["--socket-dir", &under_file], dir.path());
        refused(&out, &under_file);
    }

    // A port already in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = run(
        "mlxcel-frontend",
        &[&sockets[..], &["--port", &port]].concat(),
        dir.path(),
    );
    refused(&out, &format!("cannot listen on 127.0.0.1:{port}"));

    // Reachable from other machines without a key.
    let out = run(
        "mlxcel-frontend",
        &[&sockets[..], &["--host", "0.0.0.0"]].concat(),
        dir.path(),
    );
    refused(&out, "--api-key");

    // Unknown flags and bad values name the flag (clap's usage error, exit 2).
    let out = run("mlxcel-cachemgr", &["--capacity-bytes", "lots"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--capacity-bytes"));
}

#[test]
fn a_stale_socket_is_replaced_and_a_live_one_is_not_stolen() {
    let dir = mlxcel_tests::temp_dir("mxt");
    // A socket file nobody listens on (as a crashed process leaves it).
    let stale = dir.path().join("cachemgr.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    let mut first = Command::new(bin("mlxcel-cachemgr"))
        .args(["--socket-dir", dir.path().to_str().unwrap()])
        .env("XDG_CONFIG_HOME", dir.path())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the manager took over the stale socket",
        || std::os::unix::net::UnixStream::connect(&stale).is_ok(),
    );
    // A second manager on the same directory must refuse, not steal the live socket.
    let out = run(
        "mlxcel-cachemgr",
        &["--socket-dir", dir.path().to_str().unwrap()],
        dir.path(),
    );
    refused(&out, "cachemgr.sock");
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first manager died"
    );
    let _ = first.kill();
    let _ = first.wait();
}

#[test]
fn a_process_keeps_serving_when_its_stderr_is_full() {
    let dir = mlxcel_tests::temp_dir("mxf");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let mut child = Command::new(bin("mlxcel-cachemgr"))
        .args([
            "--socket-dir",
            dir.path().to_str().unwrap(),
            "--log-level",
            "debug",
        ])
        .env("XDG_CONFIG_HOME", dir.path())
        .stderr(Stdio::from(full))
        .spawn()
        .unwrap();
    let socket = dir.path().join("cachemgr.sock");
    wait_until(
        Duration::from_secs(10),
        "the manager listened with a full stderr",
        || std::os::unix::net::UnixStream::connect(&socket).is_ok(),
    );
    let out = Command::new(bin("mlxcelctl"))
        .args([
            "cache",
            "stats",
            "--json",
            "--socket-dir",
            dir.path().to_str().unwrap(),
        ])
        .env("XDG_CONFIG_HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the manager died writing logs"
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn another_user_is_refused_and_prompts_and_keys_stay_out_of_the_logs() {
    let served = Served::start(&[("MLXCEL_API_KEY", "key-6f1c3b")]);
    let secret_prompt = "zebra-quartz-71 is my password";
    let body = json!({"messages": [{"role": "user", "content": secret_prompt}],
                      "max_tokens": 3, "temperature": 0});
    let (status, _) =
        http::request(served.port, "POST", "/v1/chat/completions", Some(&body)).unwrap();
    assert_eq!(status, 401, "the key is required");
    let authed = http::request_with(
        served.port,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        &[("Authorization", "Bearer key-6f1c3b")],
    )
    .unwrap();
    assert_eq!(authed.0, 200, "{}", authed.1);
    let log = served.log();
    assert!(
        log.contains("[frontend]") && log.contains("[daemon]"),
        "{log}"
    );
    assert!(
        !log.contains("zebra-quartz"),
        "a prompt reached the logs:\n{log}"
    );
    assert!(
        !log.contains("key-6f1c3b"),
        "the API key reached the logs:\n{log}"
    );

    // As root, a child that switched to `nobody` is refused by the daemon's socket.
    if !nix::unistd::getuid().is_root() {
        eprintln!("not root: the other-user check needs to switch users; skipped");
        return;
    }
    let socket = served.path().join("daemon.sock");
    // The directory is 0700: open it to `nobody` so the connect reaches the peer check.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(served.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = format!(
        "import socket, sys\n\
         s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect({:?})\n\
         data = b''\n\
         while True:\n    chunk = s.recv(4096)\n    if not chunk: break\n    data += chunk\n\
         sys.stdout.buffer.write(data)",
        socket.display().to_string()
    );
    use std::os::unix::process::CommandExt;
    let out = Command::new("python3")
        .args(["-c", &script])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(
        reply.contains("peer uid 65534 is not our uid 0"),
        "the daemon did not refuse another user: {reply:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
