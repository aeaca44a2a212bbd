//! The real `mlxcel-daemon` process for end-to-end tests.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// A running daemon, killed when dropped.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn command(dir: &Path, model: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(crate::bin("mlxcel-daemon"));
    c.arg("--socket-dir")
        .arg(dir)
        .arg("--model")
        .arg(model)
        .args(args)
        // No configuration file but the test's own (none).
        .env("XDG_CONFIG_HOME", dir)
        .env_remove("MLXCEL_CONFIG")
        .stdin(Stdio::null());
    c
}

/// [`command`] with `env` on top.
fn with_env(dir: &Path, model: &Path, args: &[&str], env: &[(&str, &Path)]) -> Command {
    let mut c = command(dir, model, args);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

impl Daemon {
    /// Starts the daemon on `model` with `args` and waits until its socket answers (the model
    /// loaded). Panics with its exit status if it stops first.
    pub fn start(dir: &Path, model: &Path, args: &[&str]) -> Daemon {
        let mut d = Daemon::spawn(dir, model, args, &[]);
        d.wait_serving(dir);
        d
    }

    /// Starts the daemon with `env` on top, without waiting.
    pub fn spawn(dir: &Path, model: &Path, args: &[&str], env: &[(&str, &Path)]) -> Daemon {
        Daemon(
            with_env(dir, model, args, env)
                .spawn()
                .expect("start mlxcel-daemon"),
        )
    }

    /// [`Daemon::spawn`], its log (stderr) written to `log`.
    pub fn spawn_logged(
        dir: &Path,
        model: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
        log: &Path,
    ) -> Daemon {
        let mut c = with_env(dir, model, args, env);
        c.stderr(std::fs::File::create(log).expect("create the daemon's log"));
        Daemon(c.spawn().expect("start mlxcel-daemon"))
    }

    /// Waits until the daemon whose sockets are in `dir` serves (answers `Info` with its model,
    /// its warm-up done); panics if it stops first.
    pub fn wait_serving(&mut self, dir: &Path) {
        let socket = dir.join("daemon.sock");
        while !serves(&socket) {
            if let Ok(Some(status)) = self.0.try_wait() {
                panic!("mlxcel-daemon stopped before serving: {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether the daemon at `socket` answers `Info` with its model (not "starting", not absent).
/// Asked from a thread of its own, so that sync and async tests can both wait on it.
pub fn serves(socket: &Path) -> bool {
    use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon};
    let socket = socket.to_path_buf();
    let probe = async move {
        let Ok(mut c) = mlxcel_ipc::client::connect(
            &socket,
            mlxcel_ipc::Role::Admin,
            mlxcel_ipc::Limits::new(64 << 20),
        )
        .await
        else {
            return false;
        };
        if c.write_frame(&FrontendToDaemon::Info).await.is_err() {
            return false;
        }
        loop {
            match c.read_frame::<DaemonToFrontend>().await {
                Ok(Some(DaemonToFrontend::Info(_))) => return true,
                Ok(Some(DaemonToFrontend::Starting { .. })) | Ok(None) | Err(_) => return false,
                Ok(Some(_)) => {}
            }
        }
    };
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), probe).await })
            .unwrap_or(false)
    })
    .join()
    .unwrap_or(false)
}

/// Runs the daemon on `model` expecting it to stop by itself (a startup error); its output.
pub fn run_to_exit(dir: &Path, model: &Path, args: &[&str]) -> Output {
    command(dir, model, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run mlxcel-daemon")
}

/// A front end's connection to the daemon whose sockets are in `dir`.
pub async fn frontend(dir: &Path) -> mlxcel_ipc::Connection<mlxcel_ipc::socket::LocalStream> {
    use mlxcel_ipc::{Limits, Role};
    mlxcel_ipc::client::connect(
        &dir.join("daemon.sock"),
        Role::Frontend,
        Limits::new(32 << 20),
    )
    .await
    .expect("connect to the daemon")
}

/// A greedy request for `max_tokens` tokens, no stop ids, no log-probabilities.
pub fn greedy_generate(
    request_id: u64,
    prompt: Vec<u32>,
    max_tokens: u32,
) -> mlxcel_ipc::proto::daemon::FrontendToDaemon {
    use mlxcel_ipc::proto::daemon::{FrontendToDaemon, Generate, Sampling};
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

/// What the daemon sent for one request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<Option<f32>>,
    pub finish: mlxcel_ipc::proto::daemon::FinishReason,
    pub usage: mlxcel_ipc::proto::daemon::Usage,
}

/// Reads request `request_id`'s events until it is done (others' are skipped); panics if it
/// fails or the daemon closes.
pub async fn reply(
    c: &mut mlxcel_ipc::Connection<mlxcel_ipc::socket::LocalStream>,
    request_id: u64,
) -> Reply {
    use mlxcel_ipc::proto::daemon::DaemonToFrontend;
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    loop {
        match c
            .read_frame::<DaemonToFrontend>()
            .await
            .expect("a frame from the daemon")
            .expect("daemon closed")
        {
            DaemonToFrontend::Token {
                request_id: r,
                token,
                logprob,
            } if r == request_id => {
                tokens.push(token);
                logprobs.push(logprob);
            }
            DaemonToFrontend::Done {
                request_id: r,
                finish,
                usage,
            } if r == request_id => {
                return Reply {
                    tokens,
                    logprobs,
                    finish,
                    usage,
                };
            }
            DaemonToFrontend::Failed { error, .. } => panic!("request failed: {error}"),
            _ => {}
        }
    }
}

/// Reads every event until `n` requests are done, whichever they are; each one's reply by
/// request id. Panics if one fails or the daemon closes.
pub async fn replies(
    c: &mut mlxcel_ipc::Connection<mlxcel_ipc::socket::LocalStream>,
    n: usize,
) -> std::collections::HashMap<u64, Reply> {
    use mlxcel_ipc::proto::daemon::DaemonToFrontend;
    type Open = (Vec<u32>, Vec<Option<f32>>);
    let mut open: std::collections::HashMap<u64, Open> = Default::default();
    let mut done = std::collections::HashMap::new();
    while done.len() < n {
        match c
            .read_frame::<DaemonToFrontend>()
            .await
            .expect("a frame from the daemon")
            .expect("daemon closed")
        {
            DaemonToFrontend::Token {
                request_id,
                token,
                logprob,
            } => {
                let r = open.entry(request_id).or_default();
                r.0.push(token);
                r.1.push(logprob);
            }
            DaemonToFrontend::Done {
                request_id,
                finish,
                usage,
            } => {
                let (tokens, logprobs) = open.remove(&request_id).unwrap_or_default();
                let reply = Reply {
                    tokens,
                    logprobs,
                    finish,
                    usage,
                };
                done.insert(request_id, reply);
            }
            DaemonToFrontend::Failed { error, .. } => panic!("request failed: {error}"),
            _ => {}
        }
    }
    done
}

/// Request `request_id`'s tokens (see [`reply`]).
pub async fn tokens_until_done(
    c: &mut mlxcel_ipc::Connection<mlxcel_ipc::socket::LocalStream>,
    request_id: u64,
) -> Vec<u32> {
    reply(c, request_id).await.tokens
}

/// Asks the daemon for its health and waits for the answer (other frames are skipped).
pub async fn health(
    c: &mut mlxcel_ipc::Connection<mlxcel_ipc::socket::LocalStream>,
) -> mlxcel_ipc::proto::daemon::DaemonHealth {
    use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon};
    c.write_frame(&FrontendToDaemon::Health)
        .await
        .expect("ask for health");
    loop {
        match c.read_frame::<DaemonToFrontend>().await.expect("a frame") {
            Some(DaemonToFrontend::Health(h)) => return h,
            Some(_) => {}
            None => panic!("the daemon closed before answering"),
        }
    }
}

/// Tokens per KV block of a daemon started without `--block-tokens` (the key table's default).
pub fn block_tokens() -> u64 {
    mlxcel_config::keys::find(mlxcel_config::Section::Daemon, "block-tokens")
        .and_then(|k| k.default)
        .and_then(|d| d.parse().ok())
        .expect("the key table gives block-tokens a default")
}

/// The KV block size of the daemon on this machine's default device (f32 activations on the
/// CPU, 1,474,560 bytes for SmolLM2; f16 on a GPU, half that), asked once per test process of
/// a daemon started for the question.
pub fn block_bytes() -> u64 {
    static BYTES: OnceLock<u64> = OnceLock::new();
    *BYTES.get_or_init(|| {
        // Its own thread and runtime: callers may be inside a runtime already.
        std::thread::spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon};
                let dir = crate::temp_dir("mxq");
                let _d = Daemon::start(
                    dir.path(),
                    &crate::default_model(),
                    &["--log-level", "warn"],
                );
                let mut c = frontend(dir.path()).await;
                c.write_frame(&FrontendToDaemon::Health).await.expect("ask");
                loop {
                    match c.read_frame::<DaemonToFrontend>().await.expect("read") {
                        Some(DaemonToFrontend::Health(h)) => {
                            eprintln!("the daemon's KV block here: {} bytes", h.pool.block_bytes);
                            return h.pool.block_bytes;
                        }
                        Some(_) => {}
                        None => panic!("the daemon closed before answering"),
                    }
                }
            })
        })
        .join()
        .expect("the block size probe")
    })
}
