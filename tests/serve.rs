//! `mlxcelctl serve` end to end with the real processes and the default model: the stack comes
//! up and serves a chat request, `kill -9` of the daemon is followed by a restart after which
//! requests succeed again, and SIGTERM stops everything within 20 s with exit code 0.

use mlxcel_tests::{http, serve as stack};

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use stack::{Served, kill, pid_of, wait_until};

fn chat(port: u16) -> Result<(u16, Value), String> {
    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 8, "temperature": 0});
    http::request(port, "POST", "/v1/chat/completions", Some(&body))
}

#[test]
fn serve_runs_the_stack_restarts_a_killed_daemon_and_stops_on_sigterm() {
    let mut served = Served::start(&[]);
    let port = served.port;
    let (s, r) = chat(port).unwrap();
    assert_eq!(s, 200, "{r}");
    assert!(
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("Paris"),
        "{r}"
    );

    let st = served.status();
    let daemon = pid_of(&st, "daemon").unwrap_or_else(|| panic!("status: {st}"));
    let others = [
        pid_of(&st, "cachemgr").unwrap(),
        pid_of(&st, "frontend").unwrap(),
    ];
    assert_eq!(st["model"]["context_length"], 8192, "{st}");
    assert!(st["processes"][1]["uptime_secs"].is_u64(), "{st}");

    kill(daemon, Signal::SIGKILL);
    wait_until(Duration::from_secs(120), "a new daemon came up", || {
        served.pid("daemon").is_some_and(|p| p != daemon)
    });
    wait_until(
        Duration::from_secs(30),
        "a chat request succeeded after the restart",
        || chat(port).is_ok_and(|(s, _)| s == 200),
    );
    let text = served.log();
    assert!(
        text.contains("[serve] daemon exited (killed by signal 9)"),
        "{text}"
    );
    assert!(
        text.contains("[daemon] "),
        "child lines are prefixed: {text}"
    );
    let st = served.status();
    let all = [
        pid_of(&st, "cachemgr"),
        pid_of(&st, "daemon"),
        pid_of(&st, "frontend"),
    ];
    assert_eq!(
        &[all[0], all[2]],
        &others.map(Some),
        "only the daemon was restarted"
    );

    kill(served.child.id() as i32, Signal::SIGTERM);
    let started = Instant::now();
    let code = loop {
        if let Some(code) = served.child.try_wait().unwrap() {
            break code;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "serve did not stop within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code.code(), Some(0), "{}", served.log());
    for pid in all.into_iter().flatten() {
        assert!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
            "pid {pid} still runs"
        );
    }
}

/// Whether `pid` is gone (or only a zombie waiting for whoever adopted it to reap it).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
    }
}

/// Kills `mlxcelctl serve` with `signal`; its three children must be gone within 5 s.
fn children_die_with_serve(signal: Signal) {
    let mut served = Served::start(&[]);
    let st = served.status();
    let children: Vec<i32> = ["cachemgr", "daemon", "frontend"]
        .iter()
        .map(|n| pid_of(&st, n).unwrap_or_else(|| panic!("{n}: {st}")))
        .collect();
    kill(served.child.id() as i32, signal);
    wait_until(Duration::from_secs(60), "serve ended on the signal", || {
        served.child.try_wait().is_ok_and(|s| s.is_some())
    });
    let started = Instant::now();
    wait_until(
        Duration::from_secs(5),
        "every child stopped with serve",
        || children.iter().all(|&p| gone(p)),
    );
    eprintln!(
        "{signal:?}: children gone {:?} after serve",
        started.elapsed()
    );
}

#[test]
fn the_children_die_with_a_killed_serve() {
    children_die_with_serve(Signal::SIGKILL);
}

#[test]
fn the_children_die_with_serve_when_its_terminal_hangs_up() {
    children_die_with_serve(Signal::SIGHUP);
}

/// Runs `mlxcelctl serve args...` on `port`, with its own sockets and no configuration file,
/// until it exits by itself.
fn serve_to_exit(args: &[&std::ffi::OsStr], port: u16) -> std::process::Output {
    let dir = mlxcel_tests::temp_dir("mxq");
    std::process::Command::new(stack::bin("mlxcelctl"))
        .arg("serve")
        .args(args)
        .arg("--socket-dir")
        .arg(dir.path())
        .env("MLXCEL_PORT", port.to_string())
        .env("XDG_CONFIG_HOME", dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_port_squatter_is_one_clear_line_and_exit_1() {
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = squatter.local_addr().unwrap().port();
    let out = serve_to_exit(&[], port);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let line = format!("127.0.0.1:{port} is already in use by another program");
    assert_eq!(stderr.matches(&line).count(), 1, "{stderr}");
    assert!(
        !stderr.contains("restarting"),
        "nothing was started: {stderr}"
    );
    drop(squatter);
}

/// Stand-ins for the three processes, by name: the daemon and the front end start and stay (the
/// front end answers `/health` with its pid); the cache manager starts well (its socket
/// answers), writes a line that is not UTF-8 and one after it, and crashes half a second later.
const STAND_IN: &str = r#"#!/usr/bin/env python3
import http.server, json, os, socket, sys, time
name = os.path.basename(sys.argv[0]).removeprefix("mlxcel-")
d = sys.argv[sys.argv.index("--socket-dir") + 1]
if name == "frontend":
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"processes": {"frontend": {"pid": os.getpid()}}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    http.server.HTTPServer(("127.0.0.1", int(os.environ["MLXCEL_PORT"])), H).serve_forever()
if name == "cachemgr":
    sys.stderr.buffer.write(b"bad \xff\xfe bytes\n")
    sys.stderr.write("the line after the bad bytes\n")
    sys.stderr.flush()
p = os.path.join(d, name + ".sock")
if os.path.exists(p):
    os.unlink(p)
s = socket.socket(socket.AF_UNIX)
s.bind(p)
s.listen()
time.sleep(0.5 if name == "cachemgr" else 3600)
sys.exit(3)
"#;

#[test]
fn a_child_that_crashes_after_a_good_start_is_restarted_a_bounded_number_of_times() {
    use std::os::unix::fs::PermissionsExt;
    let bins = tempfile::tempdir().unwrap();
    for name in ["mlxcel-cachemgr", "mlxcel-daemon", "mlxcel-frontend"] {
        let path = bins.path().join(name);
        std::fs::write(&path, STAND_IN).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = serve_to_exit(
        &["--bin-dir".as_ref(), bins.path().as_os_str()],
        http::free_port(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.matches("cachemgr ready").count(), 5, "{stderr}");
    assert!(
        stderr.contains("cachemgr crashed 5 times in a row"),
        "{stderr}"
    );
    // Forwarding went on past the bytes that are not UTF-8, every time.
    assert_eq!(
        stderr
            .matches("[cachemgr] the line after the bad bytes")
            .count(),
        5,
        "{stderr}"
    );
}
