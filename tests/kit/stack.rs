//! The real stack for end-to-end tests: `mlxcel-cachemgr`, `mlxcel-daemon` on the default
//! model and `mlxcel-frontend`, each a separate process on a private socket directory, plus
//! helpers to talk HTTP to it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::free_port;
use crate::{bin, default_model};

/// A child process killed when dropped.
pub struct Process {
    pub name: &'static str,
    child: Child,
}

impl Process {
    fn spawn(name: &'static str, args: &[&str], dir: &Path) -> Process {
        let child = Command::new(bin(name))
            .arg("--socket-dir")
            .arg(dir)
            .args(args)
            .env("MLXCEL_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Process { name, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it exited (with its status).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A front end process and its base URL.
pub struct Frontend {
    pub process: Process,
    pub url: String,
}

/// The three processes.
pub struct Stack {
    pub frontend: Frontend,
    pub daemon: Process,
    pub cachemgr: Process,
    pub dir: tempfile::TempDir,
}

/// Options for [`Stack::start`].
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// Pool size in blocks.
    pub pool_blocks: u64,
    pub cachemgr_args: Vec<String>,
    pub daemon_args: Vec<String>,
    pub frontend_args: Vec<String>,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            pool_blocks: 256,
            cachemgr_args: Vec::new(),
            daemon_args: Vec::new(),
            frontend_args: Vec::new(),
        }
    }
}

impl Stack {
    /// Starts all three on the default model; returns when `/health` says the daemon is up.
    pub fn start(opts: StackOptions) -> Stack {
        let stack = Stack::spawn(opts);
        stack.wait_healthy(Duration::from_secs(90));
        stack
    }

    /// Starts all three without waiting for them.
    pub fn spawn(opts: StackOptions) -> Stack {
        let dir = crate::temp_dir("mxf");
        let args: Vec<&str> = opts.cachemgr_args.iter().map(String::as_str).collect();
        let cachemgr = Process::spawn("mlxcel-cachemgr", &args, dir.path());
        let model = default_model();
        let pool = (opts.pool_blocks * crate::daemon::block_bytes()).to_string();
        let model = model.to_string_lossy().into_owned();
        // Tests that count cached tokens must not depend on a 50 ms budget on a busy machine.
        let mut daemon_args = vec![
            "--model",
            &model,
            "--kv-pool-bytes",
            &pool,
            "--acquire-timeout",
            "30s",
        ];
        daemon_args.extend(opts.daemon_args.iter().map(String::as_str));
        let daemon = Process::spawn("mlxcel-daemon", &daemon_args, dir.path());
        let args: Vec<&str> = opts.frontend_args.iter().map(String::as_str).collect();
        let frontend = start_frontend(dir.path(), &args);
        Stack {
            frontend,
            daemon,
            cachemgr,
            dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.frontend.url)
    }

    /// Another front end on the same sockets, with `args`; returns once it reaches the daemon.
    pub fn another_frontend(&self, args: &[&str]) -> Frontend {
        let frontend = start_frontend(self.dir.path(), args);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !blocking_get(&format!("{}/health", frontend.url)).is_ok_and(|r| r.0 == 200) {
            assert!(
                Instant::now() < deadline,
                "the new front end did not reach the daemon"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        frontend
    }

    /// Waits until `/health` answers 200 with every process up.
    pub fn wait_healthy(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(r) = blocking_get(&self.url("/health"))
                && r.0 == 200
                && r.1["processes"]["cachemgr"]["status"] == "up"
                && r.1["processes"]["daemon"]["cachemgr_connected"] == true
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the stack was not healthy within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Starts a front end on a free port and waits until it answers HTTP.
pub fn start_frontend(dir: &Path, args: &[&str]) -> Frontend {
    let port = free_port().to_string();
    let mut all = vec!["--port", &port];
    all.extend_from_slice(args);
    let mut process = Process::spawn("mlxcel-frontend", &all, dir);
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while blocking_get(&format!("{url}/health")).is_err() {
        if let Some(status) = process.exited() {
            panic!("mlxcel-frontend exited during startup: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the front end did not listen within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Frontend { process, url }
}

/// GET with a plain blocking socket (used before a runtime exists): status and JSON body.
pub fn blocking_get(url: &str) -> Result<(u16, Value), String> {
    let rest = url.strip_prefix("http://").ok_or("not http")?;
    let (host, path) = rest.split_once('/').ok_or("no path")?;
    let port = host
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or("no port")?;
    crate::http::request(port, "GET", &format!("/{path}"), None)
}

/// An async HTTP client for the tests.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .expect("client")
}

/// POSTs JSON; returns the status and the JSON body.
pub async fn post(url: &str, body: &Value) -> (u16, Value) {
    let r = client().post(url).json(body).send().await.expect("POST");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

/// GETs JSON.
pub async fn get(url: &str) -> (u16, Value) {
    let r = client().get(url).send().await.expect("GET");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Reads a whole SSE stream: the `data:` payloads in order (including `[DONE]`).
pub async fn stream(url: &str, body: &Value) -> Vec<String> {
    let r = client().post(url).json(body).send().await.expect("POST");
    assert_eq!(r.status(), 200, "stream status");
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap_or(""),
        "text/event-stream"
    );
    let text = r.text().await.expect("stream body");
    text.split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_string)
        })
        .collect()
}

/// The daemon's part of `/health`.
pub async fn daemon_health(stack: &Stack) -> Value {
    get(&stack.url("/health")).await.1["processes"]["daemon"].clone()
}

/// Waits until no sequence runs and every block is either free or held for the cache.
pub async fn wait_idle(stack: &Stack) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let d = daemon_health(stack).await;
        let pool = &d["pool"];
        let accounted =
            pool["free_blocks"].as_u64().unwrap_or(0) + pool["cache_blocks"].as_u64().unwrap_or(0);
        if d["running"] == 0
            && d["waiting"] == 0
            && accounted == pool["total_blocks"].as_u64().unwrap_or(u64::MAX)
        {
            return d;
        }
        assert!(Instant::now() < deadline, "the daemon did not go idle: {d}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
