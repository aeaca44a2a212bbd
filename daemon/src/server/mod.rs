//! The daemon's socket: front ends (and operators) connect, send token-level requests and get
//! streamed tokens back. Socket I/O only: each connection has a reader loop and a writer task fed
//! by the engine's events, so the engine never waits on a socket, and the reader never waits on
//! anything but the socket. A request goes to the engine at once; its cached prefix is asked of
//! the cache manager by a task of its own, within a deadline from the request's arrival, so a
//! slow or hung manager costs each request at most that budget, concurrently ([`requests`]).
//! `Health` and `Info` are answered from what the engine published, and a `Cancel` at once
//! ([`ends`]), whatever the engine or the manager is doing. The socket listens from the
//! daemon's start: while it loads and warms up, `Health` and `Info` say so ([`Phase`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon, ModelInfo};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::socket::{LocalListener, LocalStream};
use mlxcel_ipc::{FRAME_DEADLINE, FrameError, Limits, Role, handshake};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cache_client::CacheClient;
use crate::engine::{Command, EventQueue, Vitals, event_queue};
use ends::Ends;

mod ends;
mod requests;

/// What the server serves requests with once the engine has started.
pub struct Ready {
    pub engine: Sender<Command>,
    pub info: Arc<ModelInfo>,
    pub cache: CacheClient,
    /// The engine's latest counts (health is answered from here, without waiting on it).
    pub vitals: Vitals,
}

/// Where the daemon is: starting (what it does now), or serving.
#[derive(Clone)]
pub enum Phase {
    Starting(String),
    Ready(Arc<Ready>),
}

/// Everything a connection needs.
#[derive(Clone)]
pub struct Shared {
    /// The daemon's phase, as the start-up reports it.
    pub phase: watch::Receiver<Phase>,
    pub limits: Limits,
    pub block_tokens: usize,
    /// How long a request's acquire may take, from its arrival, before it runs without reuse.
    pub acquire_timeout: Duration,
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
        let phase = shared.phase.borrow().clone();
        match phase {
            Phase::Ready(ready) => {
                let at = requests::At {
                    conn,
                    shared,
                    ready: &ready,
                    events: &events,
                    ends: &ends,
                };
                if !at.handle(msg, &answer) {
                    break;
                }
            }
            Phase::Starting(stage) => {
                if let Some(a) = requests::while_starting(msg, &stage) {
                    answer(a);
                }
            }
        }
    }
    drop(events);
    // The engine holds event senders until it has ended this connection's requests.
    if let Phase::Ready(ready) = &*shared.phase.borrow() {
        let _ = ready.engine.send(Command::ConnectionClosed { conn });
    }
    if stuck.is_cancelled() {
        // Its writes would never finish: drop them with the socket.
        writer_task.abort();
    }
    let _ = writer_task.await;
}

/// The connection's request ends (a std mutex: held for a set lookup, never across an await).
pub(super) fn lock(ends: &Mutex<Ends>) -> std::sync::MutexGuard<'_, Ends> {
    ends.lock().unwrap_or_else(|p| p.into_inner())
}
