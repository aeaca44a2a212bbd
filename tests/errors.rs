//! Every refusal the front end makes, against the real stack: its HTTP status, the OpenAI error
//! shape, the field it names, and headers such as `Retry-After`.

use std::time::{Duration, Instant};

use mlxcel_tests::stack::{Stack, StackOptions, client, get, post, start_frontend};
use serde_json::{Value, json};

/// Checks the OpenAI error shape; returns the error object.
fn error_of(status: u16, want: u16, body: &Value) -> Value {
    assert_eq!(status, want, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(e["type"].is_string(), "{body}");
    assert!(e.as_object().unwrap().contains_key("param"), "{body}");
    assert!(e.as_object().unwrap().contains_key("code"), "{body}");
    e.clone()
}

async fn raw(
    url: &str,
    method: reqwest::Method,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = client().request(method, url).body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    let value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"));
    (status, headers, value)
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_400_naming_the_field_and_the_limit() {
    let stack = Stack::start(StackOptions::default());
    let chat = stack.url("/v1/chat/completions");
    let cases = [
        (
            json!({"messages": user("hi"), "temperature": 3}),
            "temperature",
            "at most 2",
        ),
        (
            json!({"messages": user("hi"), "top_p": 0}),
            "top_p",
            "above 0",
        ),
        (
            json!({"messages": user("hi"), "temperature": -1}),
            "temperature",
            "at least 0",
        ),
        (
            json!({"messages": user("hi"), "min_p": 1.5}),
            "min_p",
            "at most 1",
        ),
        (
            json!({"messages": user("hi"), "top_k": -5}),
            "top_k",
            "positive",
        ),
        (
            json!({"messages": user("hi"), "seed": "x"}),
            "seed",
            "invalid type",
        ),
        (json!({"messages": user("hi"), "n": 2}), "n", "must be 1"),
        (
            json!({"messages": user("hi"), "max_tokens": 0}),
            "max_tokens",
            "at least 1",
        ),
        (
            json!({"messages": user("hi"), "max_tokens": 100000}),
            "max_tokens",
            "8192",
        ),
        (
            json!({"messages": user("hi"), "presence_penalty": -3}),
            "presence_penalty",
            "-2",
        ),
        (
            json!({"messages": user("hi"), "stop": ["a", "b", "c", "d", "e"]}),
            "stop",
            "at most 4",
        ),
        (
            json!({"messages": user("hi"), "top_logprobs": 3}),
            "top_logprobs",
            "logprobs",
        ),
        (
            json!({"messages": user("hi"), "top_logprobs": 30, "logprobs": true}),
            "top_logprobs",
            "20",
        ),
        (
            json!({"messages": user("hi"), "stream_options": {"include_usage": true}}),
            "stream_options",
            "stream",
        ),
        (json!({"messages": []}), "messages", "at least one"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
            "wizard",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content",
            "required",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0]",
            "text",
        ),
        (
            json!({"messages": user(&"word ".repeat(9000))}),
            "messages",
            "context window",
        ),
        (
            json!({"messages": user("hi"), "temperature": "hot"}),
            "temperature",
            "invalid type",
        ),
        (json!({"messages": "hi"}), "messages", "invalid type"),
    ];
    for (body, param, needle) in cases {
        let (status, r) = post(&chat, &body).await;
        let e = error_of(status, 400, &r);
        assert_eq!(e["param"], param, "{r}");
        assert_eq!(e["type"], "invalid_request_error");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        assert!(
            message.contains(param.split('[').next().unwrap()),
            "{message:?} names no field"
        );
    }
    let completions = stack.url("/v1/completions");
    for (body, param) in [
        (json!({"prompt": "x", "echo": true}), "echo"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": [999999]}), "prompt"),
        (json!({"prompt": ""}), "prompt"),
        (json!({"prompt": "x", "logprobs": 9}), "logprobs"),
    ] {
        let (status, r) = post(&completions, &body).await;
        assert_eq!(error_of(status, 400, &r)["param"], param, "{r}");
    }
    // Nothing above reached the engine.
    let (_, metrics) = get(&stack.url("/health")).await;
    assert_eq!(metrics["processes"]["daemon"]["running"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_routes_methods_models_and_sizes_get_their_statuses() {
    let stack = Stack::start(StackOptions::default());
    let chat = stack.url("/v1/chat/completions");
    let post_raw = |ct: Option<&'static str>, body: &[u8]| {
        raw(&chat, reqwest::Method::POST, ct, body.to_vec())
    };
    let (s, _, r) = post_raw(Some("application/json"), b"{\"messages\": [").await;
    assert_eq!(error_of(s, 400, &r)["code"], "invalid_json");
    let (s, _, r) = post_raw(Some("application/json"), b"\xff\xfe{}").await;
    assert_eq!(error_of(s, 400, &r)["code"], "invalid_json");
    let nan = br#"{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}"#;
    let (s, _, r) = post_raw(Some("application/json"), nan).await;
    assert_eq!(error_of(s, 400, &r)["code"], "invalid_json");
    let (s, _, r) = post_raw(Some("application/json"), b"[1, 2]").await;
    assert_eq!(error_of(s, 400, &r)["code"], "invalid_json");
    let deep = format!("{{\"messages\": {}{}}}", "[".repeat(5000), "]".repeat(5000));
    let (s, _, r) = post_raw(Some("application/json"), deep.as_bytes()).await;
    error_of(s, 400, &r);
    let (s, _, r) = post_raw(Some("text/plain"), b"{}").await;
    assert_eq!(error_of(s, 415, &r)["code"], "unsupported_media_type");
    let (s, _, r) = post_raw(None, b"{}").await;
    error_of(s, 415, &r);
    let big = vec![b' '; 9 << 20];
    let (s, _, r) = post_raw(Some("application/json"), &big).await;
    assert_eq!(error_of(s, 413, &r)["code"], "body_too_large");

    let (s, r) = post(&chat, &json!({"model": "gpt-4", "messages": user("hi")})).await;
    let e = error_of(s, 404, &r);
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("model_not_found"), Some("model"))
    );
    let (s, r) = get(&stack.url("/v1/nothing")).await;
    assert_eq!(error_of(s, 404, &r)["code"], "not_found");
    let (s, _, r) = raw(
        &stack.url("/v1/models"),
        reqwest::Method::DELETE,
        None,
        vec![],
    )
    .await;
    error_of(s, 405, &r);
    let (s, _, r) = raw(&chat, reqwest::Method::GET, None, vec![]).await;
    error_of(s, 405, &r);

    // The loaded model by its id, as /v1/models lists it with its context length.
    let (s, models) = get(&stack.url("/v1/models")).await;
    assert_eq!(s, 200);
    let id = models["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(models["data"][0]["context_length"], 8192);
    let (s, r) = post(
        &chat,
        &json!({"model": id, "messages": user("hi"), "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200, "{r}");

    // Request ids: ours echoed back, or one assigned.
    let r = client()
        .get(stack.url("/v1/models"))
        .header("x-request-id", "trace-123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "trace-123");
    let r = client().get(stack.url("/v1/models")).send().await.unwrap();
    assert!(!r.headers()["x-request-id"].is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_queue_limit_and_a_missing_daemon_get_401_429_503() {
    let stack = Stack::start(StackOptions::default());
    let body = json!({"messages": user("hi"), "max_tokens": 2});

    // --api-key: every route but /health needs the bearer token.
    let keyed = stack.another_frontend(&["--api-key", "sesame"]);
    let (s, r) = post(&format!("{}/v1/chat/completions", keyed.url), &body).await;
    assert_eq!(error_of(s, 401, &r)["type"], "authentication_error");
    for path in ["/v1/models", "/v1/cache/stats", "/metrics"] {
        let r = client()
            .get(format!("{}{path}", keyed.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }
    let r = client()
        .post(format!("{}/v1/cache/evict", keyed.url))
        .bearer_auth("wrong")
        .json(&json!({"all": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let (s, _) = get(&format!("{}/health", keyed.url)).await;
    assert_eq!(s, 200);
    let r = client()
        .post(format!("{}/v1/chat/completions", keyed.url))
        .bearer_auth("sesame")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // --max-queue 1: while one request waits for its first token, the next gets 429.
    let queued = stack.another_frontend(&["--max-queue", "1"]);
    let long = json!({"prompt": "lighthouse ".repeat(200), "max_tokens": 1});
    let url = format!("{}/v1/completions", queued.url);
    let first = tokio::spawn({
        let url = url.clone();
        async move { post(&url, &long).await }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, h) = get(&format!("{}/health", queued.url)).await;
        if h["processes"]["frontend"]["waiting"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the long request never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = client()
        .post(&url)
        .json(&json!({"prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    let (s, _) = first.await.unwrap();
    assert_eq!(s, 200);
    let (s, _) = post(&url, &json!({"prompt": "x", "max_tokens": 1})).await;
    assert_eq!(s, 200, "the slot did not come back");

    // No daemon behind a front end: 503 with Retry-After, and /health says which is down.
    let empty = mlxcel_tests::temp_dir("mxe");
    let lonely = start_frontend(empty.path(), &[]);
    let r = client()
        .post(format!("{}/v1/chat/completions", lonely.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "server_error");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("daemon"),
        "{v}"
    );
    let (s, h) = get(&format!("{}/health", lonely.url)).await;
    assert_eq!(s, 503);
    assert_eq!(h["processes"]["daemon"]["status"], "down");
    assert_eq!(h["processes"]["cachemgr"]["status"], "down");
    let (s, r) = get(&format!("{}/v1/cache/stats", lonely.url)).await;
    error_of(s, 503, &r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_keep_working_without_the_cache_manager_and_fail_cleanly_without_the_daemon() {
    let mut stack = Stack::start(StackOptions::default());
    let chat = stack.url("/v1/chat/completions");
    let body = json!({"messages": user("hi"), "max_tokens": 3, "temperature": 0});
    stack.cachemgr.kill9();
    let (s, h) = get(&stack.url("/health")).await;
    assert_eq!(s, 200);
    assert_eq!(h["status"], "degraded");
    assert_eq!(h["processes"]["cachemgr"]["status"], "down");
    let (s, r) = post(&chat, &body).await;
    assert_eq!(s, 200, "{r}");

    // The daemon dies mid-stream: the stream ends with an error event, not a hang.
    let streamed = json!({"messages": user("Write a long poem."), "max_tokens": 3000,
                          "temperature": 0.7, "stream": true});
    let response = client().post(&chat).json(&streamed).send().await.unwrap();
    assert_eq!(response.status(), 200);
    tokio::time::sleep(Duration::from_millis(800)).await;
    stack.daemon.kill9();
    let text = tokio::time::timeout(Duration::from_secs(20), response.text())
        .await
        .expect("the stream hung after the daemon died")
        .unwrap();
    let last = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .last()
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["error"]["code"], "service_unavailable", "{last}");
    let (s, r) = post(&chat, &body).await;
    assert_eq!(error_of(s, 503, &r)["code"], "service_unavailable");
}

/// Slowloris: headers that trickle in lose the connection; a body that trickles in gets 408.
#[test]
fn slow_headers_and_slow_bodies_are_cut_off() {
    use std::io::{Read, Write};
    let empty = mlxcel_tests::temp_dir("mxl");
    let fe = start_frontend(
        empty.path(),
        &["--header-timeout", "1s", "--body-timeout", "1s"],
    );
    let host = fe.url.trim_start_matches("http://").to_string();

    let mut s = std::net::TcpStream::connect(&host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "closed after {waited:?}"
    );

    let mut s = std::net::TcpStream::connect(&host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\nConnection: close\r\n\r\n{\"messages\"",
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
}
