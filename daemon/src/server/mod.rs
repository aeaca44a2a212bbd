//! The daemon's socket: front ends (and operators) connect, send token-level requests and get
//! streamed tokens back. Socket I/O only: each connection has a reader loop and a writer task fed
//! by the engine's events, so the engine never waits on a socket, and the reader never waits on
//! anything but the socket. A request goes to the engine at once; its cached prefix is asked of
//! the cache manager by a task of its own, within a deadline from the request's arrival, so a
//! slow or hung manager costs each request at most that budget, concurrently. `Health` and
//! `Info` are answered from what the engine published, and a `Cancel` at once ([`ends`]),
//! whatever the engine or the manager is doing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlxcel_ipc::proto::daemon::{DaemonHealth, DaemonToFrontend, FrontendToDaemon, ModelInfo};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::socket::{LocalListener, LocalStream};
use mlxcel_ipc::{BlockHash, FRAME_DEADLINE, FrameError, HashSeed, Limits, Role, handshake};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cache_client::CacheClient;
use crate::engine::{Command, EventQueue, Prefix, Vitals, event_queue, read_vitals};
use ends::Ends;

mod ends;

/// Everything a connection needs.
#[derive(Clone)]
pub struct Shared {
    pub engine: Sender<Command>,
    pub info: Arc<ModelInfo>,
    pub cache: CacheClient,
    pub limits: Limits,
    pub block_tokens: usize,
    /// How long a request's acquire may take, from its arrival, before it runs without reuse.
    pub acquire_timeout: Duration,
    /// The engine's latest counts (health is answered from here, without waiting on it).
    pub vitals: Vitals,
    /// Events queued per connection before its front end counts as stuck ([`event_queue`]).
    pub event_backlog: usize,
}

/// Connections served at once (front ends and `mlxcelctl`; one front end uses one). More are
/// closed at once, so a runaway local client cannot exhaust the daemon's descriptors or memory.
pub const MAX_CONNECTIONS: usize = 64;

/// The server's own answers (health, info, cancels, errors) queued for one connection.
const ANSWER_BACKLOG: usize = 1024;

/// Accepts connections until `shutdown`.
pub async fn serve(listener: LocalListener, shared: Shared, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    let next_conn = AtomicU64::new(1);
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            s = listener.accept() => match s {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(
                limit = MAX_CONNECTIONS,
                "connection closed: too many connections to the daemon"
            );
            drop(stream);
            continue;
        };
        let conn = next_conn.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = connection(stream, conn, &shared) => {}
            }
            drop(permit);
        });
    }
    tracker.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
}

async fn connection(stream: LocalStream, conn: u64, shared: &Shared) {
    let roles = [Role::Frontend, Role::Admin];
    let Some((conn_io, hello)) =
        handshake::accept(stream, shared.limits, Duration::from_secs(5), &roles).await
    else {
        return;
    };
    tracing::debug!(conn, pid = hello.pid, "front end connected");
    let (mut reader, mut writer) = conn_io.with_frame_deadline(FRAME_DEADLINE).into_split();
    let (events, queue) = event_queue(conn, shared.event_backlog);
    let EventQueue {
        rx: mut events_rx,
        stuck,
    } = queue;
    // The server's own answers (health, info, cancels, frame errors) go first, ahead of the
    // engine's queued events.
    // Bounded like the events: a client that asks and never reads counts as stuck.
    let (answers_tx, mut answers_rx) = mpsc::channel::<DaemonToFrontend>(ANSWER_BACKLOG);
    let answer = |m: DaemonToFrontend| {
        if let Err(mpsc::error::TrySendError::Full(_)) = answers_tx.try_send(m) {
            tracing::warn!(
                conn,
                "a client stopped reading its answers: closing its connection"
            );
            stuck.cancel();
        }
    };
    let ends = Arc::new(Mutex::new(Ends::default()));
    let writer_ends = ends.clone();
    let writer_task = tokio::spawn(async move {
        loop {
            let msg = tokio::select! {
                biased;
                Some(m) = answers_rx.recv() => m,
                m = events_rx.recv() => match m {
                    Some(m) if lock(&writer_ends).pass(&m) => m,
                    Some(_) => continue,
                    None => return,
                },
            };
            if writer.write_frame(&msg).await.is_err() {
                return;
            }
        }
    });
    loop {
        // Frame reads are cancel-safe: a stuck connection ends here without losing a frame.
        let frame = tokio::select! {
            biased;
            _ = stuck.cancelled() => break,
            frame = reader.read_frame::<FrontendToDaemon>() => frame,
        };
        let msg = match frame {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                let code = if matches!(e, FrameError::TooLarge { .. }) {
                    ErrorCode::FrameTooLarge
                } else {
                    ErrorCode::BadFrame
                };
                answer(DaemonToFrontend::Error(WireError::new(code, e.to_string())));
                if e.is_recoverable() {
                    continue;
                }
                break;
            }
        };
        match msg {
            FrontendToDaemon::Generate(req) => {
                let arrived = Instant::now();
                let hashes = prefix_hashes(shared, &req.prompt, req.cache_salt.as_deref());
                let request_id = req.request_id;
                lock(&ends).started(request_id);
                let cmd = Command::Submit {
                    conn,
                    req,
                    acquiring: !hashes.is_empty(),
                    events: events.clone(),
                };
                if shared.engine.send(cmd).is_err() {
                    break;
                }
                if !hashes.is_empty() {
                    let deadline = arrived + shared.acquire_timeout;
                    tokio::spawn(acquire(shared.clone(), conn, request_id, hashes, deadline));
                }
            }
            FrontendToDaemon::Cancel { request_id } => {
                if let Some(a) = lock(&ends).cancel(request_id) {
                    answer(a);
                }
                let _ = shared.engine.send(Command::Cancel { conn, request_id });
            }
            FrontendToDaemon::Info => {
                answer(DaemonToFrontend::Info(Box::new((*shared.info).clone())));
            }
            FrontendToDaemon::Health => {
                let v = read_vitals(&shared.vitals);
                let epoch = shared.cache.epoch();
                answer(DaemonToFrontend::Health(DaemonHealth {
                    cachemgr_connected: epoch.is_some(),
                    epoch,
                    running: v.running,
                    waiting: v.waiting,
                    preemptions: v.preemptions,
                    refused_block_ids: v.refused_block_ids,
                    pool: v.pool,
                    steps: v.steps,
                }));
            }
        }
    }
    drop(events);
    // The engine holds event senders until it has ended this connection's requests.
    let _ = shared.engine.send(Command::ConnectionClosed { conn });
    if stuck.is_cancelled() {
        // Its writes would never finish: drop them with the socket.
        writer_task.abort();
    }
    let _ = writer_task.await;
}

/// The connection's request ends (a std mutex: held for a set lookup, never across an await).
fn lock(ends: &Mutex<Ends>) -> std::sync::MutexGuard<'_, Ends> {
    ends.lock().unwrap_or_else(|p| p.into_inner())
}

/// The full-block hashes of a prompt to ask the cache for (none while no manager is registered).
fn prefix_hashes(shared: &Shared, prompt: &[u32], salt: Option<&str>) -> Vec<BlockHash> {
    let Some(registration) = shared.cache.registration() else {
        return Vec::new();
    };
    let seed = HashSeed::new(&registration.hash_key, &shared.info.model_id, salt);
    mlxcel_ipc::block_hash::block_hashes(&seed, prompt, shared.block_tokens)
}

/// Leases the cached prefix of a submitted request, giving up at `deadline` (a late reply is
/// unleased by the cache client), and hands it to the engine.
async fn acquire(
    shared: Shared,
    conn: u64,
    request_id: u64,
    hashes: Vec<BlockHash>,
    deadline: Instant,
) {
    let got = shared.cache.acquire_by(deadline, hashes.clone()).await;
    if got.is_none() && Instant::now() >= deadline {
        tracing::debug!(
            request = request_id,
            "the cache manager did not answer in time; no reuse"
        );
    }
    let prefix = match got {
        Some((lease, blocks)) => Prefix {
            lease,
            blocks,
            hashes,
        },
        None => Prefix::default(),
    };
    let _ = shared.engine.send(Command::Prefix {
        conn,
        request_id,
        prefix,
    });
}
