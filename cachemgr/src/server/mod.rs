//! The cache manager's server: a listener, one handler task per connection, and the one task
//! that owns the [`Cache`](crate::Cache).
//!
//! - [`cache_task`]: owns the cache; commands in, replies and daemon messages out; the timer.
//! - [`daemon_conn`]: the daemon's conversation (register, acquire, donate, releases, inventory).
//! - [`admin_conn`]: operators' and the front end's request/reply conversation.

pub mod admin_conn;
pub mod cache_task;
pub mod daemon_conn;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mlxcel_ipc::runtime_dir::{CACHEMGR_SOCKET, RuntimeDir};
use mlxcel_ipc::{Limits, Role, handshake, socket};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Cache, Policy};

pub use cache_task::{CacheHandle, Command};

/// How the server runs (the policy aside).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The runtime directory (None = the platform default).
    pub socket_dir: Option<PathBuf>,
    /// Frame size limit for every connection.
    pub limits: Limits,
    /// Connections served at once; more wait in the accept queue.
    pub max_connections: usize,
    /// Timer period (TTL, lease expiry, release retries, reconcile).
    pub tick: Duration,
    /// How long a client may take to send its `Hello`.
    pub handshake_timeout: Duration,
    /// The block-hash key's file (None: a fresh key for this process only, as in tests).
    pub hash_key_file: Option<PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            socket_dir: None,
            limits: Limits::default(),
            max_connections: 64,
            tick: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(5),
            hash_key_file: None,
        }
    }
}

/// Binds the socket, serves until `shutdown` is cancelled, then drains and returns.
pub async fn run(
    config: ServerConfig,
    policy: Policy,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let hash_key = match &config.hash_key_file {
        Some(path) => crate::hash_key::load_or_create(path).map_err(anyhow::Error::msg)?,
        None => crate::hash_key::random()?,
    };
    let dir = RuntimeDir::new(config.socket_dir.as_deref());
    dir.ensure()?;
    let path = dir.socket(CACHEMGR_SOCKET)?;
    let listener = socket::bind(&path).await?;
    tracing::info!(
        socket = %path.display(), capacity_bytes = policy.capacity_bytes,
        max_blocks = ?policy.max_blocks, idle_ttl = ?policy.idle_ttl, "cache manager listening"
    );

    let (tx, rx) = mpsc::channel(1024);
    let handle = CacheHandle::new(tx);
    let tracker = TaskTracker::new();
    tracker.spawn(cache_task::cache_task(
        Cache::new(policy),
        rx,
        config.tick,
        shutdown.clone(),
        hash_key,
    ));

    let permits = Arc::new(Semaphore::new(config.max_connections));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => p?,
        };
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
        let handle = handle.clone();
        let shutdown = shutdown.clone();
        let config = config.clone();
        tracker.spawn(async move {
            let _permit = permit;
            serve_connection(stream, handle, &config, shutdown).await;
        });
    }
    tracing::info!("shutting down: closing connections");
    tracker.close();
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(10), tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("some connections did not close within 10 s");
    }
    Ok(())
}

async fn serve_connection(
    stream: socket::LocalStream,
    handle: CacheHandle,
    config: &ServerConfig,
    shutdown: CancellationToken,
) {
    let Some((conn, hello)) = handshake::accept(
        stream,
        config.limits,
        config.handshake_timeout,
        &[Role::Daemon, Role::Admin, Role::Frontend],
    )
    .await
    else {
        return;
    };
    let work = async {
        match hello.role {
            Role::Daemon => daemon_conn::serve(conn, hello.pid, handle).await,
            Role::Admin | Role::Frontend => admin_conn::serve(conn, handle).await,
        }
    };
    tokio::select! {
        _ = shutdown.cancelled() => tracing::debug!(pid = hello.pid, "connection closed by shutdown"),
        _ = work => {}
    }
}
