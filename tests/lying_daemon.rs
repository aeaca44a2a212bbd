//! Red team: a daemon that lies to the front end. A relay stands where the front end expects
//! the daemon, passes everything through to the real daemon on the default model, and rewrites
//! its answers with one lie at a time. The front end must stay correct (its own prompt and token
//! counts, no garbage text, no panic), fail a request whose stream cannot be trusted with a
//! clear error, count every lie in `mlxcel_daemon_protocol_violations_total`, and serve honestly
//! again once the daemon does.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon, Usage};
use mlxcel_ipc::{Connection, Limits, Role, client, handshake, socket};
use mlxcel_tests::daemon::Daemon;
use mlxcel_tests::default_model;
use mlxcel_tests::stack::{client as http, post, start_frontend};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lie {
    None,
    TokenOutsideVocab,
    NanLogprob,
    ExtraTokens,
    UsageFigures,
    UnknownRequest,
    OversizedFrame,
}

type Shared = Arc<Mutex<Lie>>;

fn current(lie: &Shared) -> Lie {
    *lie.lock().unwrap_or_else(|p| p.into_inner())
}

/// Accepts front ends on `front`/daemon.sock; each connection is relayed to the real daemon.
async fn lying_daemon(front: PathBuf, real: PathBuf, lie: Shared) {
    let listener = socket::bind(&front.join("daemon.sock"))
        .await
        .expect("bind");
    let limits = Limits::new(64 << 20);
    loop {
        let Ok(stream) = listener.accept().await else {
            return;
        };
        let Some((conn, _)) =
            handshake::accept(stream, limits, Duration::from_secs(30), &[Role::Frontend]).await
        else {
            continue;
        };
        let upstream = client::connect(&real.join("daemon.sock"), Role::Frontend, limits)
            .await
            .expect("the real daemon");
        tokio::spawn(relay(conn, upstream, lie.clone()));
    }
}

async fn relay(
    front: Connection<socket::LocalStream>,
    real: Connection<socket::LocalStream>,
    lie: Shared,
) {
    let (mut front_r, mut front_w) = front.into_split();
    let (mut real_r, mut real_w) = real.into_split();
    let up = tokio::spawn(async move {
        while let Ok(Some(m)) = front_r.read_frame::<FrontendToDaemon>().await {
            if real_w.write_frame(&m).await.is_err() {
                return;
            }
        }
    });
    let mut tokens = 0u32;
    while let Ok(Some(m)) = real_r.read_frame::<DaemonToFrontend>().await {
        let out = match (current(&lie), m) {
            (
                Lie::TokenOutsideVocab,
                DaemonToFrontend::Token {
                    request_id,
                    logprob,
                    ..
                },
            ) => {
                tokens += 1;
                let token = if tokens == 3 { 1_000_000 } else { 28 };
                vec![DaemonToFrontend::Token {
                    request_id,
                    token,
                    logprob,
                }]
            }
            (
                Lie::NanLogprob,
                DaemonToFrontend::Token {
                    request_id, token, ..
                },
            ) => {
                vec![DaemonToFrontend::Token {
                    request_id,
                    token,
                    logprob: Some(f32::NAN),
                }]
            }
            (Lie::ExtraTokens, done @ DaemonToFrontend::Done { request_id, .. }) => {
                let extra = (0..3).map(|_| DaemonToFrontend::Token {
                    request_id,
                    token: 28,
                    logprob: None,
                });
                extra.chain([done]).collect()
            }
            (
                Lie::UsageFigures,
                DaemonToFrontend::Done {
                    request_id,
                    finish,
                    usage,
                },
            ) => {
                vec![DaemonToFrontend::Done {
                    request_id,
                    finish,
                    usage: Usage {
                        prompt_tokens: u32::MAX,
                        cached_tokens: u32::MAX,
                        generated_tokens: 0,
                        ..usage
                    },
                }]
            }
            (Lie::UnknownRequest, token @ DaemonToFrontend::Token { .. }) => vec![
                DaemonToFrontend::Token {
                    request_id: 1 << 40,
                    token: 28,
                    logprob: None,
                },
                token,
            ],
            (Lie::OversizedFrame, DaemonToFrontend::Token { .. }) => {
                let _ = front_w.write_raw(&u32::MAX.to_le_bytes()).await;
                break;
            }
            (_, m) => vec![m],
        };
        for m in out {
            if front_w.write_frame(&m).await.is_err() {
                up.abort();
                return;
            }
        }
    }
    up.abort();
}

async fn violations(base: &str) -> u64 {
    let text = http()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix("mlxcel_daemon_protocol_violations_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no violation counter in /metrics:\n{text}"))
}

fn completion(logprobs: bool) -> Value {
    json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "prompt": "The capital of France is",
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": true,
        "logprobs": if logprobs { json!(1) } else { Value::Null },
    })
}

#[tokio::test]
async fn the_front_end_stays_correct_and_counts_each_lie_of_the_daemon() {
    let real = mlxcel_tests::temp_dir("mxr");
    let _daemon = Daemon::start(real.path(), &default_model(), &["--kv-pool-bytes", "64MiB"]);
    let front = mlxcel_tests::temp_dir("mxl");
    let lie: Shared = Arc::new(Mutex::new(Lie::None));
    tokio::spawn(lying_daemon(
        front.path().to_path_buf(),
        real.path().to_path_buf(),
        lie.clone(),
    ));
    let fe = start_frontend(front.path(), &[]);
    let url = format!("{}/v1/completions", fe.url);
    let set = |l: Lie| *lie.lock().unwrap_or_else(|p| p.into_inner()) = l;

    // Honest first: the reference answer, and no lie counted for an honest daemon.
    let honest = loop {
        let (status, body) = post(&url, &completion(true)).await;
        if status == 200 {
            break body;
        }
        assert_eq!(status, 503, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = honest["choices"][0]["text"].as_str().unwrap().to_string();
    let prompt_tokens = honest["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(honest["usage"]["completion_tokens"], 8);
    assert_eq!(violations(&fe.url).await, 0);

    // Each lie: what the client gets, and the count.
    set(Lie::TokenOutsideVocab);
    let (status, body) = post(&url, &completion(false)).await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("outside the vocabulary")
    );
    assert_eq!(violations(&fe.url).await, 1);

    set(Lie::NanLogprob);
    let (status, body) = post(&url, &completion(true)).await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("log-probability")
    );
    assert_eq!(violations(&fe.url).await, 2);

    set(Lie::ExtraTokens);
    let (status, body) = post(&url, &completion(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], text.as_str());
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 8);
    assert_eq!(violations(&fe.url).await, 3);

    set(Lie::UsageFigures);
    let (status, body) = post(&url, &completion(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], text.as_str());
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(prompt_tokens));
    assert_eq!(usage["completion_tokens"], 8);
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt_tokens + 8));
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    // Three figures, three lies.
    assert_eq!(violations(&fe.url).await, 6);

    set(Lie::UnknownRequest);
    let (status, body) = post(&url, &completion(false)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], text.as_str());
    // One injected event per token.
    assert_eq!(violations(&fe.url).await, 6 + 8);

    set(Lie::OversizedFrame);
    let (status, body) = post(&url, &completion(false)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(violations(&fe.url).await, 6 + 8 + 1);

    // The daemon is honest again: the front end reconnects and serves the same answer.
    set(Lie::None);
    // (The relay runs on this test's runtime: wait without blocking it.)
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let again = loop {
        let (status, body) = post(&url, &completion(false)).await;
        if status == 200 {
            break body;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            std::time::Instant::now() < deadline,
            "no honest answer within 120 s of the reconnection"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(again["choices"][0]["text"], text.as_str());
    assert_eq!(violations(&fe.url).await, 6 + 8 + 1);
    eprintln!("lying_daemon: every lie was counted; the honest text is {text:?}");
}
