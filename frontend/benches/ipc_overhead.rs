//! What the front end and its IPC hop cost: the same short greedy request, alternately through
//! the full stack (HTTP → mlxcel-frontend → daemon socket) and straight to the daemon's socket
//! (tokenized here with the front end's own library), on the release-built processes and the
//! default model. Prints each path's latency percentiles and the difference.
//!
//! Run with `make bench-ipc` (N=40 pairs by default; IPC_PAIRS to change it).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mlxcel_frontend::text::ModelText;
use mlxcel_ipc::client::connect;
use mlxcel_ipc::proto::daemon::{
    DaemonToFrontend, FrontendToDaemon, Generate, ModelInfo, Sampling,
};
use mlxcel_ipc::{Limits, Role};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bin(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mlxcel-frontend")).with_file_name(name)
}

fn spawn(name: &str, args: &[&str]) -> Kill {
    Kill(
        Command::new(bin(name))
            .args(args)
            .env("MLXCEL_LOG", "warn")
            .env_remove("MLXCEL_CONFIG")
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start {name}: {e} (run `cargo build --release --workspace --bins`)")
            }),
    )
}

/// One chat request over HTTP: its latency, or the response when it was not a 200.
fn http_chat(port: u16, body: &str) -> Result<Duration, String> {
    let started = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    if !text.starts_with("HTTP/1.1 200") {
        return Err(text);
    }
    Ok(started.elapsed())
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pairs: usize = std::env::var("IPC_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let dir = tempfile::Builder::new()
        .prefix("mxi")
        .tempdir_in("/tmp")
        .unwrap();
    let d = dir.path().to_str().unwrap().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _cachemgr = spawn("mlxcel-cachemgr", &["--socket-dir", &d]);
    let _daemon = spawn(
        "mlxcel-daemon",
        &["--socket-dir", &d, "--kv-pool-bytes", "256MiB"],
    );
    let _frontend = spawn(
        "mlxcel-frontend",
        &["--socket-dir", &d, "--port", &port.to_string()],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let socket = dir.path().join("daemon.sock");
    let mut conn = loop {
        if let Ok(c) = connect(&socket, Role::Frontend, Limits::new(32 << 20)).await {
            break c;
        }
        assert!(Instant::now() < deadline, "the daemon did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    conn.write_frame(&FrontendToDaemon::Info).await.unwrap();
    let info: Box<ModelInfo> = loop {
        if let Ok(Some(DaemonToFrontend::Info(i))) = conn.read_frame().await {
            break i;
        }
    };
    let model = ModelText::new(&info).expect("model text");
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let messages = [mlxcel_frontend::text::template::TemplateMessage::new(
        "user",
        "What is the capital of France?",
    )];
    let prompt = model
        .encode(&model.render_chat(&messages).unwrap(), false)
        .unwrap();
    let body = |max_tokens: u32| {
        format!(
            r#"{{"messages":[{{"role":"user","content":"What is the capital of France?"}}],"max_tokens":{max_tokens},"temperature":0,"stop":[]}}"#
        )
    };
    // Warm both paths (and let the front end reach the daemon).
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(response) = http_chat(port, &body(1)) {
        assert!(
            Instant::now() < deadline,
            "the front end never answered 200: {response}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "ipc overhead: {pairs} alternating pairs of the same greedy chat request ({} prompt tokens, \
         prefix cached after the first), through the full stack (HTTP -> mlxcel-frontend -> daemon \
         socket) and straight to the daemon socket; 'difference' is the median of the per-pair \
         differences (full stack - direct)",
        prompt.len()
    );
    let mut request_id = 0;
    for max_tokens in [1, 16] {
        let (mut via_http, mut direct, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..pairs {
            let latency =
                http_chat(port, &body(max_tokens)).unwrap_or_else(|response| panic!("{response}"));
            request_id += 1;
            let started = Instant::now();
            let req = Generate {
                request_id,
                prompt: prompt.clone(),
                max_tokens,
                stop_ids: model.stop_ids.clone(),
                sampling: Sampling::default(),
                logprobs: false,
                cache_salt: None,
                grammar: None,
                logit_bias: Vec::new(),
                pins: Vec::new(),
            };
            conn.write_frame(&FrontendToDaemon::Generate(req))
                .await
                .unwrap();
            loop {
                match conn.read_frame::<DaemonToFrontend>().await.unwrap() {
                    Some(DaemonToFrontend::Done { .. }) => break,
                    Some(DaemonToFrontend::Failed { error, .. }) => panic!("{error}"),
                    Some(_) => {}
                    None => panic!("the daemon closed the connection"),
                }
            }
            let (h, d) = (
                latency.as_secs_f64() * 1e3,
                started.elapsed().as_secs_f64() * 1e3,
            );
            via_http.push(h);
            direct.push(d);
            diffs.push(h - d);
        }
        let (h50, d50) = (percentile(&mut via_http, 0.5), percentile(&mut direct, 0.5));
        let (h90, d90) = (percentile(&mut via_http, 0.9), percentile(&mut direct, 0.9));
        let (x10, x50, x90) = (
            percentile(&mut diffs, 0.1),
            percentile(&mut diffs, 0.5),
            percentile(&mut diffs, 0.9),
        );
        println!("max_tokens {max_tokens}:");
        println!("  full stack:     p50 {h50:.1} ms  p90 {h90:.1} ms");
        println!("  daemon socket:  p50 {d50:.1} ms  p90 {d90:.1} ms");
        println!(
            "  difference:     median {x50:.1} ms ({:.1}% of the direct p50), p10 {x10:.1} ms, p90 {x90:.1} ms",
            x50 / d50 * 100.0
        );
    }
}
