//! `mlxcelctl serve`: the three processes in the foreground under one supervisor.
//!
//! It starts them in order (cache manager, daemon, front end), each only once the one before
//! it is ready (its socket answers; the front end's port answers), prefixes their log lines
//! with their names, restarts a child that exits with backoff (1 s doubling to 30 s, reset
//! after a minute of uptime), and on Ctrl-C or SIGTERM stops them in reverse order, each with
//! SIGTERM then SIGKILL, well within 20 s. It exits 0 after a requested stop and 1 when a child
//! keeps failing at startup (5 times in a row) or cannot be started at all.

use mlxcel_ipc::lifeline::Lifeline;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use mlxcel_ipc::runtime_dir::{CACHEMGR_SOCKET, DAEMON_SOCKET, RuntimeDir};
use tokio::sync::mpsc;

use crate::service::{self, Process};
use crate::settings;
use child::{describe, forward, signal};

mod child;

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Directory of the mlxcel binaries (default: the one holding mlxcelctl).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// How long each process may take to become ready. The daemon listens once it has loaded
    /// the model and warmed up: seconds on the CPU, minutes on a GPU machine's first start
    /// (MLX builds its kernels then; later starts reuse them).
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub startup_timeout: Duration,
}

/// A child exited.
#[derive(Debug)]
struct Exit {
    process: Process,
    generation: u64,
    status: std::io::Result<ExitStatus>,
}

/// A child that is running.
#[derive(Debug, Clone, Copy)]
struct Running {
    pid: u32,
    generation: u64,
    started: Instant,
}

/// Consecutive quick failures after which a child is given up on.
const MAX_FAST_FAILURES: u32 = 5;
/// A child that ran this long is considered healthy again (backoff and failure count reset).
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often a slow start is reported while it is awaited.
const WAITING_NOTE_EVERY: Duration = Duration::from_secs(30);

struct Supervisor {
    bin_dir: PathBuf,
    socket_dir: PathBuf,
    frontend: SocketAddr,
    startup_timeout: Duration,
    exits_tx: mpsc::UnboundedSender<Exit>,
    exits: mpsc::UnboundedReceiver<Exit>,
    /// Exits seen while waiting for something else.
    pending: VecDeque<Exit>,
    running: [Option<Running>; 3],
    next_generation: u64,
    /// The children stop when this closes, however we end (see `mlxcel_ipc::lifeline`).
    lifeline: Lifeline,
}

fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "[serve] {line}");
}

fn index(p: Process) -> usize {
    match p {
        Process::Cachemgr => 0,
        Process::Daemon => 1,
        Process::Frontend => 2,
    }
}

/// Runs the stack until a stop signal (Ok) or an unrecoverable failure (Err).
pub async fn run(args: ServeArgs, socket_dir: Option<&Path>) -> anyhow::Result<()> {
    let bin_dir = match args.bin_dir {
        Some(d) => d,
        None => service::default_bin_dir().context("cannot find mlxcelctl's directory")?,
    };
    for p in Process::ALL {
        let bin = bin_dir.join(p.binary());
        if !bin.exists() {
            bail!(
                "{} is missing: build with `make build` or pass --bin-dir",
                bin.display()
            );
        }
    }
    let dir = RuntimeDir::new(socket_dir);
    dir.ensure()?;
    let (exits_tx, exits) = mpsc::unbounded_channel();
    let mut sup = Supervisor {
        bin_dir,
        socket_dir: dir.path().to_path_buf(),
        frontend: settings::frontend_addr()?,
        startup_timeout: args.startup_timeout,
        exits_tx,
        exits,
        pending: VecDeque::new(),
        running: [None; 3],
        next_generation: 1,
        lifeline: Lifeline::new().context("cannot make the children's lifeline")?,
    };
    let signal =
        mlxcel_ipc::signals::terminate_or_interrupt(mlxcel_config::process_env::lifeline_fd());
    tokio::pin!(signal);
    let result = tokio::select! {
        _ = &mut signal => {
            say("stop requested");
            Ok(())
        }
        r = sup.supervise() => r,
    };
    sup.stop_all().await;
    // A failure is printed once, by main (`mlxcelctl: ...`).
    if result.is_ok() {
        say("stopped");
    }
    result
}

impl Supervisor {
    /// Starts everything, then restarts whatever exits; returns only on failure.
    async fn supervise(&mut self) -> anyhow::Result<()> {
        // A program already on the API's port would answer in our stead: say so, start nothing.
        if tokio::net::TcpStream::connect(self.frontend).await.is_ok() {
            bail!(
                "{} is already in use by another program: stop it, or choose another port \
                 (--port in [frontend], MLXCEL_PORT)",
                self.frontend
            );
        }
        let mut fast_failures = [0u32; 3];
        let mut backoff = [Duration::from_secs(1); 3];
        for p in Process::ALL {
            self.start_until_ready(p, &mut fast_failures, &mut backoff)
                .await?;
        }
        say(&format!(
            "all three are up; the API is on http://{}",
            self.frontend
        ));
        loop {
            let exit = self.next_exit().await;
            let i = index(exit.process);
            if self.running[i].map(|r| r.generation) != Some(exit.generation) {
                continue;
            }
            let ran = self.running[i].map_or(Duration::ZERO, |r| r.started.elapsed());
            self.running[i] = None;
            say(&format!(
                "{} exited ({}) after {}",
                exit.process.name(),
                describe(&exit.status),
                humantime::format_duration(Duration::from_secs(ran.as_secs()))
            ));
            if ran >= HEALTHY_AFTER {
                fast_failures[i] = 0;
                backoff[i] = Duration::from_secs(1);
            } else if fast_failures[i] >= MAX_FAST_FAILURES {
                // It starts, then crashes: restarting it for ever would only hide that.
                bail!(
                    "{} crashed {MAX_FAST_FAILURES} times in a row within {} of a good start; \
                     see its log lines above",
                    exit.process.name(),
                    humantime::format_duration(HEALTHY_AFTER)
                );
            }
            self.start_until_ready(exit.process, &mut fast_failures, &mut backoff)
                .await?;
        }
    }

    /// Starts `p` and waits until it is ready, retrying with backoff; fails after
    /// [`MAX_FAST_FAILURES`] failures in a row.
    async fn start_until_ready(
        &mut self,
        p: Process,
        fast_failures: &mut [u32; 3],
        backoff: &mut [Duration; 3],
    ) -> anyhow::Result<()> {
        let i = index(p);
        loop {
            if fast_failures[i] > 0 {
                say(&format!("restarting {} in {:?}", p.name(), backoff[i]));
                tokio::time::sleep(backoff[i]).await;
                backoff[i] = (backoff[i] * 2).min(MAX_BACKOFF);
            }
            let running = self.spawn(p)?;
            self.running[i] = Some(running);
            match self.wait_ready(p, running).await {
                Ok(()) => {
                    say(&format!("{} ready (pid {})", p.name(), running.pid));
                    // Counted as a failure until it has run a while, so a crash loop backs off.
                    fast_failures[i] += 1;
                    return Ok(());
                }
                Err(why) => {
                    self.stop(p).await;
                    fast_failures[i] += 1;
                    say(&format!("{} did not start: {why}", p.name()));
                    if fast_failures[i] >= MAX_FAST_FAILURES {
                        bail!(
                            "{} failed {MAX_FAST_FAILURES} times in a row at startup (last: {why}); \
                             see its log lines above",
                            p.name()
                        );
                    }
                }
            }
        }
    }

    fn spawn(&mut self, p: Process) -> anyhow::Result<Running> {
        let generation = self.next_generation;
        self.next_generation += 1;
        let program = self.bin_dir.join(p.binary());
        let mut child = tokio::process::Command::new(&program)
            .arg("--socket-dir")
            .arg(&self.socket_dir)
            .env(mlxcel_ipc::lifeline::ENV, self.lifeline.env_value())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a terminal's Ctrl-C reaches only us, and we stop the
            // children in order.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        let pid = child.id().unwrap_or(0);
        if let Some(out) = child.stdout.take() {
            tokio::spawn(forward(out, p.name()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(forward(err, p.name()));
        }
        let tx = self.exits_tx.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            let _ = tx.send(Exit {
                process: p,
                generation,
                status,
            });
        });
        Ok(Running {
            pid,
            generation,
            started: Instant::now(),
        })
    }

    async fn next_exit(&mut self) -> Exit {
        if let Some(e) = self.pending.pop_front() {
            return e;
        }
        match self.exits.recv().await {
            Some(e) => e,
            // We hold a sender, so the channel never closes.
            None => std::future::pending().await,
        }
    }

    /// Waits until `p` answers, or fails if it exits or the startup timeout passes; says every
    /// [`WAITING_NOTE_EVERY`] that it is still waiting.
    async fn wait_ready(&mut self, p: Process, running: Running) -> Result<(), String> {
        let started = Instant::now();
        let deadline = started + self.startup_timeout;
        let mut next_note = started + WAITING_NOTE_EVERY;
        loop {
            if self.probe(p).await {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("not ready within {:?}", self.startup_timeout));
            }
            if now >= next_note {
                next_note += WAITING_NOTE_EVERY;
                say(&format!(
                    "{} not ready yet after {} s{} (gives up after {})",
                    p.name(),
                    (now - started).as_secs(),
                    match p {
                        Process::Daemon => ": loading and warming up the model",
                        _ => "",
                    },
                    humantime::format_duration(self.startup_timeout)
                ));
            }
            tokio::select! {
                exit = self.exits.recv() => match exit {
                    Some(e) if e.process == p && e.generation == running.generation => {
                        self.running[index(p)] = None;
                        return Err(format!("exited ({})", describe(&e.status)));
                    }
                    Some(e) => self.pending.push_back(e),
                    None => {}
                },
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Whether `p` answers; for the front end, whether the answer on its port is *its own*
    /// (the pid in `/health`), not another program's.
    async fn probe(&self, p: Process) -> bool {
        let probe = async {
            match p {
                Process::Cachemgr => {
                    tokio::net::UnixStream::connect(self.socket_dir.join(CACHEMGR_SOCKET))
                        .await
                        .is_ok()
                }
                Process::Daemon => {
                    tokio::net::UnixStream::connect(self.socket_dir.join(DAEMON_SOCKET))
                        .await
                        .is_ok()
                }
                Process::Frontend => {
                    let ours = self.running[index(p)].map(|r| r.pid);
                    crate::status::ask_frontend(self.frontend).await.ok() == ours
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(2), probe)
            .await
            .unwrap_or(false)
    }

    /// Stops `p`: SIGTERM, then SIGKILL if it has not exited within its grace period.
    async fn stop(&mut self, p: Process) {
        let Some(running) = self.running[index(p)].take() else {
            return;
        };
        let grace = match p {
            Process::Daemon => Duration::from_secs(8),
            _ => Duration::from_secs(4),
        };
        signal(running.pid, nix::sys::signal::Signal::SIGTERM);
        if !self.wait_exit(p, running.generation, grace).await {
            say(&format!(
                "{} did not stop within {grace:?}; killing it",
                p.name()
            ));
            signal(running.pid, nix::sys::signal::Signal::SIGKILL);
            self.wait_exit(p, running.generation, Duration::from_secs(2))
                .await;
        }
    }

    async fn wait_exit(&mut self, p: Process, generation: u64, limit: Duration) -> bool {
        if let Some(at) = self
            .pending
            .iter()
            .position(|e| e.process == p && e.generation == generation)
        {
            self.pending.remove(at);
            return true;
        }
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.exits.recv()).await {
                Ok(Some(e)) if e.process == p && e.generation == generation => return true,
                Ok(Some(e)) => self.pending.push_back(e),
                Ok(None) | Err(_) => return false,
            }
        }
    }

    /// Stops everything, front end first.
    async fn stop_all(&mut self) {
        for p in Process::ALL.into_iter().rev() {
            self.stop(p).await;
        }
    }
}
