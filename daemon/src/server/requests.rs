//! What each front-end message does: once the engine serves, a request goes to the engine at
//! once and its cached prefix is asked of the cache manager by a task of its own, within a
//! deadline; health and info are answered from what the engine published. While the daemon
//! starts, info and health are answered with what it is doing and requests are refused.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use mlxcel_ipc::proto::daemon::{DaemonHealth, DaemonToFrontend, FrontendToDaemon};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::{BlockHash, HashSeed};

use super::ends::Ends;
use super::{Ready, Shared, lock};
use crate::engine::{Command, EventSink, Prefix, read_vitals};

/// The answer to `msg` while the daemon starts at `stage`, if any.
pub(super) fn while_starting(msg: FrontendToDaemon, stage: &str) -> Option<DaemonToFrontend> {
    let stage = stage.to_string();
    match msg {
        FrontendToDaemon::Info | FrontendToDaemon::Health => {
            Some(DaemonToFrontend::Starting { stage })
        }
        FrontendToDaemon::Generate(req) => Some(DaemonToFrontend::Failed {
            request_id: req.request_id,
            error: WireError::new(
                ErrorCode::Starting,
                format!("the daemon is starting ({stage}); it serves once its warm-up ends"),
            ),
        }),
        FrontendToDaemon::Cancel { .. } => None,
    }
}

/// One connection's message, once the engine serves.
pub(super) struct At<'a> {
    pub conn: u64,
    pub shared: &'a Shared,
    pub ready: &'a Arc<Ready>,
    pub events: &'a EventSink,
    pub ends: &'a Arc<Mutex<Ends>>,
}

impl At<'_> {
    /// Handles `msg` (`answer` takes the server's own replies); false once the engine is gone.
    pub(super) fn handle(&self, msg: FrontendToDaemon, answer: &impl Fn(DaemonToFrontend)) -> bool {
        let (conn, ready) = (self.conn, self.ready);
        match msg {
            FrontendToDaemon::Generate(req) => {
                let arrived = Instant::now();
                let hashes = prefix_hashes(
                    ready,
                    self.shared.block_tokens,
                    &req.prompt,
                    req.cache_salt.as_deref(),
                );
                let request_id = req.request_id;
                lock(self.ends).started(request_id);
                let cmd = Command::Submit {
                    conn,
                    req,
                    acquiring: !hashes.is_empty(),
                    events: self.events.clone(),
                };
                if ready.engine.send(cmd).is_err() {
                    return false;
                }
                if !hashes.is_empty() {
                    let deadline = arrived + self.shared.acquire_timeout;
                    tokio::spawn(acquire(ready.clone(), conn, request_id, hashes, deadline));
                }
            }
            FrontendToDaemon::Cancel { request_id } => {
                if let Some(a) = lock(self.ends).cancel(request_id) {
                    answer(a);
                }
                let _ = ready.engine.send(Command::Cancel { conn, request_id });
            }
            FrontendToDaemon::Info => {
                answer(DaemonToFrontend::Info(Box::new((*ready.info).clone())));
            }
            FrontendToDaemon::Health => {
                let v = read_vitals(&ready.vitals);
                let epoch = ready.cache.epoch();
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
        true
    }
}

/// The full-block hashes of a prompt to ask the cache for (none while no manager is registered).
fn prefix_hashes(
    ready: &Ready,
    block_tokens: usize,
    prompt: &[u32],
    salt: Option<&str>,
) -> Vec<BlockHash> {
    let Some(registration) = ready.cache.registration() else {
        return Vec::new();
    };
    let seed = HashSeed::new(&registration.hash_key, &ready.info.model_id, salt);
    mlxcel_ipc::block_hash::block_hashes(&seed, prompt, block_tokens)
}

/// Leases the cached prefix of a submitted request, giving up at `deadline` (a late reply is
/// unleased by the cache client), and hands it to the engine.
async fn acquire(
    ready: Arc<Ready>,
    conn: u64,
    request_id: u64,
    hashes: Vec<BlockHash>,
    deadline: Instant,
) {
    let got = ready.cache.acquire_by(deadline, hashes.clone()).await;
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
    let _ = ready.engine.send(Command::Prefix {
        conn,
        request_id,
        prefix,
    });
}
