//! While the daemon loads its model and warms up it already listens: `/health` answers 503 with
//! `status: "starting"` and the daemon's stage, `mlxcelctl status` says the same, a request gets
//! a clear 503, and once the warm-up ends `/health` says "ok" and requests are served. The warm-up
//! is held (the daemon's hidden `--hold-warm-up-until FILE`) until the test has seen all that.

use std::time::Duration;

use mlxcel_tests::http::request;
use mlxcel_tests::stack::{Stack, StackOptions, blocking_get};
use mlxcel_tests::{bin, wait_until};
use serde_json::json;

#[test]
fn health_says_starting_with_the_stage_until_the_warm_up_ends_then_ok() {
    let hold = mlxcel_tests::temp_dir("mxh");
    let go = hold.path().join("go");
    let stack = Stack::spawn(StackOptions {
        daemon_args: vec![
            "--hold-warm-up-until".into(),
            go.to_string_lossy().into_owned(),
        ],
        ..StackOptions::default()
    });
    let mut seen = None;
    wait_until(
        Duration::from_secs(60),
        "/health said the daemon is starting",
        || {
            let Ok((status, body)) = blocking_get(&stack.url("/health")) else {
                return false;
            };
            let daemon = &body["processes"]["daemon"];
            let held = daemon["stage"]
                .as_str()
                .is_some_and(|s| s.contains("held until"));
            if held {
                seen = Some((status, body.clone()));
            }
            held
        },
    );
    let (status, body) = seen.expect("a starting answer");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "starting", "{body}");
    assert_eq!(body["processes"]["daemon"]["status"], "starting", "{body}");

    // mlxcelctl status says the same, and does not call the stack ready.
    let out = std::process::Command::new(bin("mlxcelctl"))
        .args(["status", "--socket-dir"])
        .arg(stack.dir.path())
        .env("MLXCEL_PORT", port(&stack).to_string())
        .env("XDG_CONFIG_HOME", stack.dir.path())
        .output()
        .expect("mlxcelctl status");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("daemon    starting") && stdout.contains("held until"),
        "{stdout}"
    );

    // A request meanwhile is refused with the reason, not left waiting.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    let port = port(&stack);
    let (status, reply) =
        request(port, "POST", "/v1/chat/completions", Some(&body)).expect("an answer");
    assert_eq!(status, 503, "{reply}");
    assert!(reply.to_string().contains("starting"), "{reply}");

    std::fs::write(&go, b"").expect("release the warm-up");
    stack.wait_healthy(Duration::from_secs(120));
    let (status, body) = blocking_get(&stack.url("/health")).expect("health");
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
    let (status, reply) =
        request(port, "POST", "/v1/chat/completions", Some(&greedy())).expect("an answer");
    assert_eq!(status, 200, "{reply}");
}

fn port(stack: &Stack) -> u16 {
    let port = stack
        .frontend
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok());
    port.expect("the front end's port")
}

fn greedy() -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0})
}
