//! The task that owns the [`Cache`]: every connection talks to it through [`CacheHandle`], so the
//! cache needs no lock and every decision happens in one order. Messages for the daemon leave in
//! the order the cache produced them (the daemon's inventory answers rely on that order).

use std::collections::HashMap;
use std::time::Duration;

use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest};
use mlxcel_ipc::proto::cache::{CacheToDaemon, DaemonToCache, Epoch};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::{Geometry, HashKey};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::Cache;

/// A command for the cache task.
#[derive(Debug)]
pub enum Command {
    /// A daemon connection wants to register; `outbound` carries every message for it.
    Register {
        pid: u32,
        geometry: Geometry,
        call: u64,
        outbound: mpsc::UnboundedSender<CacheToDaemon>,
        reply: oneshot::Sender<Option<Epoch>>,
    },
    /// A message from the daemon of `epoch`.
    Daemon { epoch: Epoch, msg: DaemonToCache },
    /// The daemon connection of `epoch` closed.
    DaemonGone { epoch: Epoch },
    /// An admin request.
    Admin {
        request: AdminRequest,
        reply: oneshot::Sender<AdminReply>,
    },
}

/// A cheap, cloneable way to reach the cache task.
#[derive(Debug, Clone)]
pub struct CacheHandle {
    tx: mpsc::Sender<Command>,
}

impl CacheHandle {
    /// Wraps the command channel.
    pub fn new(tx: mpsc::Sender<Command>) -> Self {
        Self { tx }
    }

    /// Sends a command; false when the cache task has stopped.
    pub async fn send(&self, cmd: Command) -> bool {
        self.tx.send(cmd).await.is_ok()
    }

    /// Runs an admin request and waits for its reply.
    pub async fn admin(&self, request: AdminRequest) -> AdminReply {
        let (reply, rx) = oneshot::channel();
        if !self.send(Command::Admin { request, reply }).await {
            return shutting_down();
        }
        rx.await.unwrap_or_else(|_| shutting_down())
    }
}

fn shutting_down() -> AdminReply {
    AdminReply::Error(WireError::new(
        ErrorCode::ShuttingDown,
        "the cache manager is shutting down",
    ))
}

/// Owns `cache` until `shutdown` or until every handle is gone.
pub async fn cache_task(
    mut cache: Cache,
    mut rx: mpsc::Receiver<Command>,
    tick: Duration,
    shutdown: CancellationToken,
    hash_key: HashKey,
) {
    let mut task = Task {
        daemon: None,
        waiters: HashMap::new(),
        hash_key,
    };
    let mut timer = tokio::time::interval(tick);
    timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = timer.tick() => cache.tick(Instant::now()),
            cmd = rx.recv() => match cmd {
                Some(cmd) => task.handle(&mut cache, cmd),
                None => break,
            },
        }
        task.flush(&mut cache);
    }
    tracing::debug!("cache task stopped");
}

struct Task {
    /// The registered daemon's epoch and its outbound channel.
    daemon: Option<(Epoch, mpsc::UnboundedSender<CacheToDaemon>)>,
    /// Admin `Reconcile` requests waiting for inventory `id`.
    waiters: HashMap<u64, Vec<oneshot::Sender<AdminReply>>>,
    /// Handed to each daemon that registers: it keys the block hashes.
    hash_key: HashKey,
}

impl Task {
    fn to_daemon(&self, msg: CacheToDaemon) {
        if let Some((_, tx)) = &self.daemon {
            // A closed channel means the connection is going; DaemonGone follows.
            let _ = tx.send(msg);
        }
    }

    fn flush(&self, cache: &mut Cache) {
        for msg in cache.drain_outbox() {
            self.to_daemon(msg);
        }
    }

    fn handle(&mut self, cache: &mut Cache, cmd: Command) {
        let now = Instant::now();
        match cmd {
            Command::Register {
                pid,
                geometry,
                call,
                outbound,
                reply,
            } => match cache.register(pid, geometry, now) {
                Ok((epoch, block_bytes)) => {
                    let _ = outbound.send(CacheToDaemon::Registered {
                        call,
                        epoch,
                        block_bytes,
                        hash_key: self.hash_key,
                    });
                    self.daemon = Some((epoch, outbound));
                    let _ = reply.send(Some(epoch));
                }
                Err(error) => {
                    let _ = outbound.send(CacheToDaemon::Error {
                        call: Some(call),
                        error,
                    });
                    let _ = reply.send(None);
                }
            },
            Command::Daemon { epoch, msg } => {
                if cache.epoch() != Some(epoch) {
                    tracing::debug!(epoch = epoch.0, "message from a stale daemon epoch ignored");
                    return;
                }
                self.daemon_msg(cache, msg, now);
            }
            Command::DaemonGone { epoch } => {
                cache.daemon_lost(epoch);
                if self.daemon.as_ref().is_some_and(|(e, _)| *e == epoch) {
                    self.daemon = None;
                }
                for (_, waiters) in self.waiters.drain() {
                    for w in waiters {
                        let _ = w.send(AdminReply::Error(WireError::new(
                            ErrorCode::NotFound,
                            "the daemon disconnected before answering the inventory request",
                        )));
                    }
                }
            }
            Command::Admin { request, reply } => self.admin(cache, request, reply, now),
        }
    }

    fn daemon_msg(&mut self, cache: &mut Cache, msg: DaemonToCache, now: Instant) {
        match msg {
            DaemonToCache::Register { call, .. } => self.to_daemon(CacheToDaemon::Error {
                call: Some(call),
                error: WireError::new(
                    ErrorCode::AlreadyRegistered,
                    "this connection is already registered",
                ),
            }),
            DaemonToCache::Acquire { call, hashes } => {
                let (lease, blocks) = cache.acquire(&hashes, now);
                self.to_daemon(CacheToDaemon::Acquired {
                    call,
                    lease,
                    blocks,
                });
            }
            DaemonToCache::Unlease { lease } => cache.unlease(lease, now),
            DaemonToCache::Donate { call, blocks, pins } => {
                if let Err(error) = cache.donate(call, blocks, pins, now) {
                    self.to_daemon(CacheToDaemon::Error {
                        call: Some(call),
                        error,
                    });
                }
            }
            DaemonToCache::Reclaim { call, blocks } => {
                let done = cache.reclaim(blocks, now);
                self.flush(cache);
                self.to_daemon(CacheToDaemon::Reclaimed { call, blocks: done });
            }
            DaemonToCache::ReleaseAck { release } => cache.release_ack(release, now),
            DaemonToCache::Inventory { inventory, report } => {
                if let Some(done) = cache.inventory(inventory, report, now) {
                    for w in self.waiters.remove(&done.inventory).unwrap_or_default() {
                        let _ = w.send(AdminReply::Reconciled(done.report));
                    }
                }
            }
        }
    }

    fn admin(
        &mut self,
        cache: &mut Cache,
        request: AdminRequest,
        reply: oneshot::Sender<AdminReply>,
        now: Instant,
    ) {
        let answer = match request {
            AdminRequest::Stats => AdminReply::Stats(Box::new(cache.stats(now))),
            AdminRequest::Entries { limit } => {
                AdminReply::Entries(cache.entries(limit as usize, now))
            }
            AdminRequest::Evict(selector) => match cache.evict(&selector, now) {
                Ok(report) => AdminReply::Evicted(report),
                Err(e) => AdminReply::Error(e),
            },
            AdminRequest::SetCapacity { capacity_bytes } => {
                let evicted = cache.set_capacity(capacity_bytes, now);
                AdminReply::CapacitySet {
                    capacity_bytes,
                    evicted,
                }
            }
            AdminRequest::Reconcile => match cache.request_inventory(now) {
                Some(id) => {
                    self.waiters.entry(id).or_default().push(reply);
                    return;
                }
                None => AdminReply::Error(WireError::new(
                    ErrorCode::NotFound,
                    "no daemon is registered",
                )),
            },
        };
        let _ = reply.send(answer);
    }
}
