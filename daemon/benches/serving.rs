//! `make bench-serving`: the real cache manager and daemon (release builds, default model) driven
//! over the daemon's socket. Prints what it measured and how:
//! - TTFT of a ~3.7k-token prompt, cold and then warm (its prefix leased from the cache);
//! - aggregate decode tok/s with 1, 4 and 8 concurrent requests (distinct prompts, 64 tokens).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mlxcel_ipc::client::connect;
use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon, Generate, Sampling, Usage};
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{Connection, Limits, Role};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn request(request_id: u64, prompt: Vec<u32>, max_tokens: u32) -> FrontendToDaemon {
    FrontendToDaemon::Generate(Generate {
        request_id,
        prompt,
        max_tokens,
        stop_ids: vec![],
        sampling: Sampling::default(),
        logprobs: false,
        cache_salt: None,
        grammar: None,
        logit_bias: Vec::new(),
        pins: Vec::new(),
    })
}

/// Runs requests on one connection; returns (time to first token, usage) per request id order.
async fn run(
    c: &mut Connection<LocalStream>,
    prompts: Vec<Vec<u32>>,
    max_tokens: u32,
) -> Vec<(Duration, Usage)> {
    let start = Instant::now();
    let n = prompts.len();
    for (i, p) in prompts.into_iter().enumerate() {
        c.write_frame(&request(i as u64, p, max_tokens))
            .await
            .expect("send");
    }
    let mut first: Vec<Option<Duration>> = vec![None; n];
    let mut done: Vec<Option<Usage>> = vec![None; n];
    while done.iter().any(Option::is_none) {
        match c
            .read_frame::<DaemonToFrontend>()
            .await
            .expect("read")
            .expect("daemon closed")
        {
            DaemonToFrontend::Token { request_id, .. } => {
                first[request_id as usize].get_or_insert(start.elapsed());
            }
            DaemonToFrontend::Done {
                request_id, usage, ..
            } => done[request_id as usize] = Some(usage),
            DaemonToFrontend::Failed { error, .. } => panic!("request failed: {error}"),
            _ => {}
        }
    }
    first
        .into_iter()
        .zip(done)
        .map(|(f, u)| (f.unwrap_or_default(), u.unwrap_or_default()))
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let daemon_bin = PathBuf::from(env!("CARGO_BIN_EXE_mlxcel-daemon"));
    let manager_bin = daemon_bin.with_file_name("mlxcel-cachemgr");
    let dir = tempfile::Builder::new()
        .prefix("mxs")
        .tempdir_in("/tmp")
        .expect("dir");
    let _m = Killed(
        Command::new(&manager_bin)
            .arg("--socket-dir")
            .arg(dir.path())
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .spawn()
            .expect("run `cargo build --release --workspace` first"),
    );
    let _d = Killed(
        Command::new(&daemon_bin)
            .arg("--socket-dir")
            .arg(dir.path())
            .arg("--model")
            .arg(root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
            .args(["--kv-pool-bytes", "2GiB", "--log-level", "warn"])
            .stdin(Stdio::null())
            .spawn()
            .expect("daemon"),
    );
    let socket = dir.path().join("daemon.sock");
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "daemon did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = connect(&socket, Role::Frontend, Limits::new(32 << 20))
        .await
        .expect("connect");
    c.write_frame(&FrontendToDaemon::Info).await.expect("info");
    let info = loop {
        if let Some(DaemonToFrontend::Info(i)) = c.read_frame().await.expect("read") {
            break i;
        }
    };
    let tokenizer: tokenizers::Tokenizer = info.tokenizer_json.parse().expect("tokenizer");
    let text =
        "The history of the printing press is a story of many small improvements. ".repeat(300);
    let long: Vec<u32> = tokenizer
        .encode(text.as_str(), false)
        .expect("encode")
        .get_ids()[..3700]
        .to_vec();
    println!(
        "mlxcel serving benchmark: mlxcel-daemon + mlxcel-cachemgr (release), {}, {} cores, one connection",
        info.model_id,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let cold = run(&mut c, vec![long.clone()], 1).await[0];
    let warm = run(&mut c, vec![long], 1).await[0];
    println!(
        "TTFT 3700-token prompt: cold {:.2} s (cached {}), warm {:.3} s (cached {}), {:.0}x faster",
        cold.0.as_secs_f64(),
        cold.1.cached_tokens,
        warm.0.as_secs_f64(),
        warm.1.cached_tokens,
        cold.0.as_secs_f64() / warm.0.as_secs_f64().max(1e-9)
    );
    for n in [1usize, 4, 8] {
        let prompts: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                tokenizer
                    .encode(
                        format!("Request {i}: tell me a story about the number {i}.").as_str(),
                        false,
                    )
                    .expect("encode")
                    .get_ids()
                    .to_vec()
            })
            .collect();
        let t = Instant::now();
        let out = run(&mut c, prompts, 64).await;
        let secs = t.elapsed().as_secs_f64();
        let tokens: u32 = out.iter().map(|(_, u)| u.generated_tokens).sum();
        let ttft = out.iter().map(|(f, _)| f.as_secs_f64()).fold(0.0, f64::max);
        println!(
            "{n} concurrent x 64 tokens: {tokens} tokens in {secs:.2} s = {:.1} tok/s aggregate, worst TTFT {ttft:.2} s",
            f64::from(tokens) / secs
        );
    }
}
