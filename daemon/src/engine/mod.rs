//! The engine thread: it owns the model, the paged pool and every running sequence, and is the
//! only place MLX runs. Sockets and timers live on tokio and talk to it through [`Command`]s; it
//! answers through per-connection event channels, so a slow client never stalls a step.
//!
//! A step is a short loop ([`Engine::step`]): the runner samples what waits on the host, the
//! scheduler plans (admission, prefill chunks, decode rows, the blocks they take, preemption),
//! the runner executes the plan, and the requests that ended are answered. Rooms: [`setup`]
//! loads the model and sizes the pool ([`ceiling`]); [`warmup`] runs the shapes serving will
//! before the daemon listens; [`lifecycle`] is a request's entry and end; [`cache_link`] is the
//! cache side of each request (prefix mapping, donations, the manager's orders, and the trust
//! boundary on the ids it sends); [`events`] carries a request's events to its connection.
//!
//! A request arrives before its cached prefix: the server submits it at once and asks the cache
//! manager in parallel, within a deadline. The prefix follows as [`Command::Prefix`] (empty when
//! the manager was away or late); only then is the request admitted, its leased blocks mapped
//! (the lease ends there: the sequence's references hold them) and the rest prefilled.

mod cache_link;
mod ceiling;
mod events;
mod lifecycle;
mod progress;
mod setup;
pub mod warmup;

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlxcel_ipc::proto::cache::LeaseId;
use mlxcel_ipc::proto::daemon::{Generate, ModelInfo, PoolStats, RequestId, StepTotals};
use mlxcel_ipc::{BlockHash, BlockId, Geometry};

pub use cache_link::{CacheLink, Refcounts};
pub use events::{EventQueue, EventSink, event_queue};
pub use progress::Progress;

use crate::cache_client::{CacheClient, ManagerOrder};
use crate::pool::BlockPool;
use crate::runner::Runner;
use crate::scheduler::Scheduler;
use crate::sequence::Sequence;
use crate::{EngineError, Loaded, Result};

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model: PathBuf,
    pub block_tokens: usize,
    /// The KV pool's ceiling in bytes (None = `auto`, see [`ceiling`]).
    pub kv_pool_bytes: Option<u64>,
    /// The cache manager's capacity, which an `auto` ceiling makes room for.
    pub cache_capacity: u64,
    pub prefill_chunk: usize,
    pub max_running: usize,
    /// Where the model runs.
    pub device: crate::device::DeviceChoice,
    /// The operator's sampling defaults (the model's own settings come first).
    pub sampling: crate::sampling_defaults::OperatorDefaults,
    /// The warm-up's jobs this process runs: all of them, or a warm-up worker's share.
    pub warm_up_share: crate::warm_workers::Share,
    /// Where each start-up stage is reported.
    pub progress: Progress,
}

/// The prefix the cache manager leased to a request.
#[derive(Debug, Clone, Default)]
pub struct Prefix {
    pub lease: Option<LeaseId>,
    pub blocks: Vec<BlockId>,
    /// The prompt's full-block hashes the acquire asked for (what each block must hold).
    pub hashes: Vec<BlockHash>,
}

/// Work for the engine thread.
pub enum Command {
    /// A new request; when `acquiring`, its cached prefix follows as [`Command::Prefix`].
    Submit {
        conn: u64,
        req: Generate,
        acquiring: bool,
        events: EventSink,
    },
    /// The cached prefix of a submitted request (empty: run it without reuse).
    Prefix {
        conn: u64,
        request_id: RequestId,
        prefix: Prefix,
    },
    Cancel {
        conn: u64,
        request_id: RequestId,
    },
    ConnectionClosed {
        conn: u64,
    },
    /// The cache-manager client, and the runtime its requests run on.
    AttachCache(CacheClient, tokio::runtime::Handle),
    Order(ManagerOrder),
    Shutdown,
}

/// The engine's counts, published after every scheduling round so that health questions are
/// answered at once, never queued behind a model step (a long prefill takes seconds).
#[derive(Debug, Clone, Copy, Default)]
pub struct EngineVitals {
    pub running: u32,
    pub waiting: u32,
    /// Sequences preempted so far.
    pub preemptions: u64,
    /// Block ids from the cache manager refused so far (see [`CacheLink`]).
    pub refused_block_ids: u64,
    pub pool: PoolStats,
    /// Where the engine's time went since it started.
    pub steps: StepTotals,
}

/// Where the engine publishes its [`EngineVitals`].
pub type Vitals = Arc<Mutex<EngineVitals>>;

/// The latest published vitals.
pub fn read_vitals(vitals: &Vitals) -> EngineVitals {
    *vitals.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the engine reports once the model is loaded.
pub struct Started {
    pub info: ModelInfo,
    pub geometry: Geometry,
    pub vitals: Vitals,
}

/// A warm-up worker's work ([`crate::warm_workers`]): loads the model as the daemon does and runs
/// its share of the warm-up, whose kernels reach the cache.
pub fn warm_only(config: &EngineConfig) -> Result<()> {
    Engine::load(config).map(drop)
}

/// Starts the engine thread: loads the model, builds the pool, then serves commands.
pub fn spawn(
    config: EngineConfig,
) -> Result<(Sender<Command>, Started, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || match Engine::load(&config) {
            Ok((engine, started)) => {
                let _ = started_tx.send(Ok(started));
                engine.run(rx);
            }
            Err(e) => {
                let _ = started_tx.send(Err(e));
            }
        })
        .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
    let started = started_rx
        .recv()
        .map_err(|_| EngineError::Internal("the engine thread died while loading".into()))??;
    Ok((tx, started, handle))
}

/// MLX keeps freed buffers in its own cache until told otherwise, and glibc its free pages.
fn give_back_freed_memory() {
    crate::runner::give_back_transient_memory();
    let built = crate::jit_cache::publish();
    if !built.is_empty() {
        // A request met a shape the warm-up did not run, and waited on its build: the names say
        // which (a module's name carries its kernels' names, and their template constants).
        tracing::info!(kernels_built = built.len(), names = ?built, "kernels built while serving");
    }
}

struct Engine {
    loaded: Loaded,
    pool: BlockPool,
    config: EngineConfig,
    sched: Scheduler<Sequence>,
    cache: CacheLink,
    runner: Runner,
    preemptions: u64,
    vitals: Vitals,
    /// MLX's active memory right after the model loaded.
    weights_bytes: u64,
    /// Constrained decoding over the model's tokenizer (or why it is unavailable).
    grammars: std::result::Result<mlxcel_grammar::Grammars, String>,
}

impl Engine {
    fn pool_stats(&self) -> PoolStats {
        let shape = self.pool.shape();
        PoolStats {
            total_blocks: shape.num_blocks,
            free_blocks: self.pool.free_blocks(),
            cache_blocks: self.cache.held_blocks(),
            block_bytes: shape.block_bytes() as u64,
            pool_bytes_measured: self.pool.measured_bytes(),
            resident_blocks: self.pool.resident_blocks(),
            weights_bytes: self.weights_bytes,
            mlx_active_bytes: mlx_rs::memory::active_memory().unwrap_or(0) as u64,
            mlx_cache_bytes: mlx_rs::memory::cache_memory().unwrap_or(0) as u64,
            process_resident_bytes: crate::host_memory::resident_bytes().unwrap_or(0),
        }
    }

    fn publish(&self) {
        let now = EngineVitals {
            running: self.sched.running().len() as u32,
            waiting: self.sched.waiting_len() as u32,
            preemptions: self.preemptions,
            refused_block_ids: self.cache.refused(),
            pool: self.pool_stats(),
            steps: self.runner.totals(),
        };
        *self.vitals.lock().unwrap_or_else(|p| p.into_inner()) = now;
    }

    fn run(mut self, rx: Receiver<Command>) {
        loop {
            // Idle: wait for work. Waiting for room or a prefix: wait a little (releases and
            // prefixes arrive as commands). Busy: take whatever arrived, then step.
            if self.sched.is_idle() {
                let next = if !self.sched.has_waiting() {
                    // Nothing runs: what the last requests freed goes back to the system, now
                    // and once more after a quiet second (the I/O threads free their last
                    // buffers after the engine is done).
                    self.runner.report();
                    give_back_freed_memory();
                    match rx.recv_timeout(Duration::from_secs(1)) {
                        Err(RecvTimeoutError::Timeout) => {
                            give_back_freed_memory();
                            rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                        }
                        other => other,
                    }
                } else {
                    rx.recv_timeout(Duration::from_millis(20))
                };
                match next {
                    Ok(cmd) => {
                        if !self.command(cmd) {
                            break;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        if !self.command(cmd) {
                            self.shutdown();
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.shutdown();
                        return;
                    }
                }
            }
            self.step();
        }
        self.shutdown();
    }

    /// One step: the runner samples what waits on the host, the scheduler plans, the runner
    /// executes the plan, and the requests that ended are answered.
    fn step(&mut self) {
        let ends = self.runner.settle(self.sched.running_mut());
        let t = Instant::now();
        self.retire(ends);
        let mut plan = self
            .sched
            .schedule(&mut self.pool, self.cache.may_free_blocks());
        self.planned(&mut plan);
        self.publish();
        self.runner.lap_other(t);
        let ends = self.runner.execute(
            &self.loaded.model,
            &plan,
            self.sched.running_mut(),
            &mut self.pool,
        );
        let t = Instant::now();
        self.retire(ends);
        self.publish();
        self.runner.lap_other(t);
    }

    /// Applies one command; false to stop.
    fn command(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit {
                conn,
                req,
                acquiring,
                events,
            } => self.submit(conn, req, acquiring, events),
            Command::Prefix {
                conn,
                request_id,
                prefix,
            } => self.prefix(conn, request_id, prefix),
            Command::Cancel { conn, request_id } => {
                self.cancel(|s| s.conn == conn && s.id == request_id)
            }
            Command::ConnectionClosed { conn } => self.cancel(|s| s.conn == conn),
            Command::AttachCache(client, runtime) => self.cache.attach(client, runtime),
            Command::Order(order) => {
                let stats = self.pool_stats();
                self.cache.apply(&mut self.pool, order, || stats);
            }
            Command::Shutdown => return false,
        }
        true
    }

    fn shutdown(&mut self) {
        self.cancel(|_| true);
        self.cache.shutdown(&mut self.pool);
        tracing::info!(free_blocks = self.pool.free_blocks(), "engine stopped");
    }
}
