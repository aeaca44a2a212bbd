//! Against the real stack: a web page cannot drive the API from the user's browser. A request
//! whose `Host` is a rebound name gets 421 (before: 200 from `/v1/cache/entries`), a browser
//! request from another origin gets 403 (its CORS preflight too); loopback names and origins,
//! and the configured extra ones, are served.

use mlxcel_tests::serve as stack;

use std::io::{Read, Write};
use std::net::TcpStream;

use serde_json::Value;
use stack::Served;

/// One request with exactly these headers; its status and JSON body.
fn raw(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = if method == "POST" {
        "{\"prompt\": \"hi\", \"max_tokens\": 1}"
    } else {
        ""
    };
    head.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    s.write_all(head.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let json = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

#[test]
fn rebound_hosts_and_foreign_origins_are_refused_and_ours_are_served() {
    let served = Served::start(&[
        ("MLXCEL_ALLOWED_HOSTS", "my-box.lan"),
        ("MLXCEL_ALLOWED_ORIGINS", "https://ui.example.com"),
    ]);
    let port = served.port;
    let local = format!("127.0.0.1:{port}");
    let rebound = format!("rebind.example:{port}");

    let (s, body) = raw(port, "GET", "/v1/cache/entries", &[("Host", &rebound)]);
    assert_eq!(
        (s, body["error"]["code"].as_str()),
        (421, Some("misdirected_host")),
        "{body}"
    );
    let (s, _) = raw(port, "POST", "/v1/cache/evict", &[("Host", &rebound)]);
    assert_eq!(s, 421);
    let (s, _) = raw(port, "POST", "/v1/completions", &[("Host", &rebound)]);
    assert_eq!(s, 421);

    for origin in [
        "https://evil.example",
        "null",
        &format!("http://rebind.example:{port}"),
    ] {
        let (s, body) = raw(
            port,
            "POST",
            "/v1/completions",
            &[("Host", &local), ("Origin", origin)],
        );
        assert_eq!(
            (s, body["error"]["code"].as_str()),
            (403, Some("forbidden_origin")),
            "{origin}: {body}"
        );
    }
    let preflight = [
        ("Host", local.as_str()),
        ("Origin", "https://evil.example"),
        ("Access-Control-Request-Method", "POST"),
    ];
    assert_eq!(
        raw(port, "OPTIONS", "/v1/chat/completions", &preflight).0,
        403
    );

    // Served: loopback and configured names and origins, and clients that send no Origin.
    for (host, origin) in [
        (local.as_str(), None),
        (&format!("localhost:{port}"), Some("http://localhost:3000")),
        (
            &format!("my-box.lan:{port}"),
            Some("https://ui.example.com"),
        ),
    ] {
        let mut headers = vec![("Host", host)];
        headers.extend(origin.map(|o| ("Origin", o)));
        let (s, body) = raw(port, "GET", "/v1/models", &headers);
        assert_eq!(s, 200, "{host} {origin:?}: {body}");
    }
    let (s, body) = raw(
        port,
        "POST",
        "/v1/completions",
        &[("Host", &local), ("Origin", "http://127.0.0.1:5173")],
    );
    assert_eq!(s, 200, "{body}");
}
