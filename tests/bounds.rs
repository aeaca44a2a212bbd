//! Against the real stack: the front end bounds what clients can hold. Connections over
//! `--max-connections` get a 503 and are closed (before: no cap); a streaming client that stops
//! reading is disconnected after `--write-timeout` and its generation cancelled, so the daemon
//! stops working for it and frees its blocks (before: it ran on to `max_tokens`).

use mlxcel_tests::{http, serve as stack};

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrIn, sockopt};
use serde_json::json;
use stack::{Served, wait_until};

/// A connection whose receive buffer is as small as the OS allows, so a client that does not
/// read blocks the server's writes after a few KiB instead of megabytes.
fn small_buffer_connection(port: u16) -> TcpStream {
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    socket::setsockopt(&fd, sockopt::RcvBuf, &4096).unwrap();
    socket::connect(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(127, 0, 0, 1, port),
    )
    .unwrap();
    // SAFETY: the descriptor is a connected TCP socket we own; the stream takes it over.
    unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) }
}

fn running(served: &Served) -> u64 {
    served.status()["daemon"]["running"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[test]
fn connections_over_the_cap_get_503_and_a_client_that_stops_reading_is_cancelled() {
    let served = Served::start(&[
        ("MLXCEL_MAX_CONNECTIONS", "8"),
        ("MLXCEL_WRITE_TIMEOUT", "2s"),
        // Idle connections must outlive the test's checks even on a busy machine.
        ("MLXCEL_HEADER_TIMEOUT", "120s"),
    ]);
    let port = served.port;

    let idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut answer = String::new();
    extra.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("too_many_connections"),
        "{answer}"
    );
    drop(idle);
    wait_until(Duration::from_secs(60), "a slot came free", || {
        http::request(port, "GET", "/health", None).is_ok_and(|(s, _)| s == 200)
    });

    // A stream of 4,000 tokens takes minutes here; a client that reads none of it is cut off
    // once the front end's 32 KiB and the kernel's buffers are full (a few hundred tokens).
    let mut stalled = small_buffer_connection(port);
    let body = json!({
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 4000, "stream": true, "temperature": 0,
        "ignore_eos": true, "logprobs": true, "top_logprobs": 1,
    })
    .to_string();
    write!(
        stalled,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    wait_until(Duration::from_secs(120), "the stream started", || {
        running(&served) == 1
    });
    let started = Instant::now();
    wait_until(
        Duration::from_secs(300),
        "the front end disconnected the client that stopped reading",
        || served.log().contains("--write-timeout"),
    );
    wait_until(
        Duration::from_secs(120),
        "the stalled stream's generation was cancelled",
        || running(&served) == 0,
    );
    let log = served.log();
    eprintln!("cancelled {:?} after the stream started", started.elapsed());
    let (_, metrics) = http::request(port, "GET", "/v1/cache/stats", None).unwrap();
    assert!(metrics.is_object(), "the stack still serves: {metrics}");
    assert!(!log.contains("panicked"), "{log}");
    drop(stalled);
}
