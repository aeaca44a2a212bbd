//! `mlxcelctl serve` end to end with the real processes and the default model: the stack comes
//! up and serves a chat request, `kill -9` of the daemon is followed by a restart after which
//! requests succeed again, and SIGTERM stops everything within 20 s with exit code 0.

#[path = "support/http.rs"]
mod http;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

fn ctl() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mlxcelctl"))
}

fn status(dir: &std::path::Path, port: u16) -> Value {
    let out = Command::new(ctl())
        .args(["status", "--json", "--socket-dir"])
        .arg(dir)
        .env("MLXCEL_PORT", port.to_string())
        .env("XDG_CONFIG_HOME", dir)
        .output()
        .expect("mlxcelctl status");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn pid_of(status: &Value, name: &str) -> Option<i32> {
    status["processes"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name && p["up"] == true)?["pid"]
        .as_i64()
        .map(|p| p as i32)
}

fn chat(port: u16) -> Result<(u16, Value), String> {
    let body = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                      "max_tokens": 8, "temperature": 0});
    http::request(port, "POST", "/v1/chat/completions", Some(&body))
}

fn wait_until(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn serve_runs_the_stack_restarts_a_killed_daemon_and_stops_on_sigterm() {
    let dir = tempfile::Builder::new()
        .prefix("mxs")
        .tempdir_in("/tmp")
        .unwrap();
    let port = http::free_port();
    let mut serve = Command::new(ctl())
        .args(["serve", "--socket-dir"])
        .arg(dir.path())
        .env("MLXCEL_PORT", port.to_string())
        .env("MLXCEL_KV_POOL_BYTES", "256MiB")
        .env("MLXCEL_LOG", "info")
        // No configuration file but the test's (there is none in this directory).
        .env("XDG_CONFIG_HOME", dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mlxcelctl serve");
    let log = Arc::new(Mutex::new(String::new()));
    let reader = {
        let log = log.clone();
        let stderr = serve.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        })
    };
    let log_text = || log.lock().unwrap().clone();

    wait_until(
        Duration::from_secs(180),
        "the stack answered /health with 200",
        || http::request(port, "GET", "/health", None).is_ok_and(|(s, _)| s == 200),
    );
    let (s, r) = chat(port).unwrap();
    assert_eq!(s, 200, "{r}");
    assert!(
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("Paris"),
        "{r}"
    );

    let st = status(dir.path(), port);
    let daemon = pid_of(&st, "daemon").unwrap_or_else(|| panic!("status: {st}"));
    let others = [
        pid_of(&st, "cachemgr").unwrap(),
        pid_of(&st, "frontend").unwrap(),
    ];
    assert_eq!(st["model"]["context_length"], 8192, "{st}");
    assert!(st["processes"][1]["uptime_secs"].is_u64(), "{st}");

    kill(Pid::from_raw(daemon), Signal::SIGKILL).unwrap();
    wait_until(Duration::from_secs(120), "a new daemon came up", || {
        pid_of(&status(dir.path(), port), "daemon").is_some_and(|p| p != daemon)
    });
    wait_until(
        Duration::from_secs(30),
        "a chat request succeeded after the restart",
        || chat(port).is_ok_and(|(s, _)| s == 200),
    );
    let text = log_text();
    assert!(
        text.contains("[serve] daemon exited (killed by signal 9)"),
        "{text}"
    );
    assert!(
        text.contains("[daemon] "),
        "child lines are prefixed: {text}"
    );
    let st = status(dir.path(), port);
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

    kill(Pid::from_raw(serve.id() as i32), Signal::SIGTERM).unwrap();
    let started = Instant::now();
    let code = loop {
        if let Some(code) = serve.try_wait().unwrap() {
            break code;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "serve did not stop within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code.code(), Some(0), "{}", log_text());
    for pid in all.into_iter().flatten() {
        assert!(
            kill(Pid::from_raw(pid), None).is_err(),
            "pid {pid} still runs"
        );
    }
    let _ = reader.join();
}
