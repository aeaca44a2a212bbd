//! The daemon's side of the cache-manager conversation.
//!
//! A task keeps one connection to `mlxcel-cachemgr`: it connects (retrying with backoff while
//! the manager is down), registers the pool's geometry, and then multiplexes requests (acquire,
//! donate, unlease, reclaim) with the manager's orders (release, inventory). Orders go to the
//! engine as [`ManagerOrder`]s, in the order they arrived, and are acknowledged only once the
//! engine has applied them, so the manager's ledger never runs ahead of real memory.
//!
//! While the manager is away, requests answer `None` at once (the engine serves without prefix
//! reuse) and the engine is told to drop every block it held for the cache: nobody governs them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlxcel_ipc::client::connect;
use mlxcel_ipc::proto::cache::{
    CacheToDaemon, CallId, DaemonToCache, DonateOutcome, DonatedBlock, Epoch, InventoryReport,
    LeaseId, ReleaseId,
};
use mlxcel_ipc::{BlockHash, BlockId, FrameReader, FrameWriter, Geometry, Limits, Role};
use tokio::sync::{mpsc, oneshot, watch};

/// Something the manager wants the engine to do.
#[derive(Debug)]
pub enum ManagerOrder {
    /// A registration succeeded: the cache holds nothing yet in this epoch.
    Registered(Epoch),
    /// Drop the cache's reference on `blocks`, then signal `done`.
    Release {
        blocks: Vec<BlockId>,
        done: oneshot::Sender<()>,
    },
    /// Report what the engine holds for the cache.
    Inventory {
        reply: oneshot::Sender<InventoryReport>,
    },
    /// The outcome of [`CacheClient::donate_ordered`] `tag`, in order with releases (a release
    /// of a donated block always comes after this).
    Donated { tag: u64, outcome: DonateOutcome },
    /// Donation `tag` got no answer (the connection ended first): the cache keeps none of it.
    DonationLost { tag: u64 },
    /// The connection is gone: drop every cache reference (nobody governs them now).
    Disconnected,
}

type Pending = Arc<Mutex<HashMap<CallId, oneshot::Sender<CacheToDaemon>>>>;
/// Donations whose outcome goes to the orders channel: call id -> the engine's tag.
type Donations = Arc<Mutex<HashMap<CallId, u64>>>;

/// A handle to the connection task; cheap to clone.
#[derive(Clone)]
pub struct CacheClient {
    outgoing: mpsc::UnboundedSender<DaemonToCache>,
    pending: Pending,
    donations: Donations,
    next_call: Arc<Mutex<CallId>>,
    epoch: watch::Receiver<Option<Epoch>>,
    timeout: Duration,
}

/// How the client connects.
#[derive(Debug, Clone)]
pub struct CacheClientConfig {
    pub socket: PathBuf,
    pub geometry: Geometry,
    /// Longest wait between reconnection attempts.
    pub max_backoff: Duration,
    /// How long a request waits for its reply before giving up (the engine goes on without).
    pub request_timeout: Duration,
}

impl CacheClient {
    /// Starts the connection task; orders for the engine arrive on `orders`.
    pub fn spawn(
        config: CacheClientConfig,
        orders: mpsc::UnboundedSender<ManagerOrder>,
    ) -> CacheClient {
        let (outgoing, out_rx) = mpsc::unbounded_channel();
        let pending: Pending = Arc::default();
        let donations: Donations = Arc::default();
        let (epoch_tx, epoch) = watch::channel(None);
        let client = CacheClient {
            outgoing,
            pending: pending.clone(),
            donations: donations.clone(),
            next_call: Arc::default(),
            epoch,
            timeout: config.request_timeout,
        };
        tokio::spawn(connection_task(
            config,
            out_rx,
            Shared {
                pending,
                donations,
                epoch: epoch_tx,
                orders,
            },
        ));
        client
    }

    /// The current epoch (None while not registered).
    pub fn epoch(&self) -> Option<Epoch> {
        *self.epoch.borrow()
    }

    /// Waits until registered (or `limit` passes); true if registered.
    pub async fn wait_registered(&mut self, limit: Duration) -> bool {
        let wait = self.epoch.wait_for(Option::is_some);
        matches!(tokio::time::timeout(limit, wait).await, Ok(Ok(_)))
    }

    fn next_call(&self) -> Option<CallId> {
        let mut next = self.next_call.lock().ok()?;
        *next += 1;
        Some(*next)
    }

    /// Offers a finished sequence's blocks; the outcome arrives on the orders channel as
    /// [`ManagerOrder::Donated`] (or [`ManagerOrder::DonationLost`]) with `tag`. False when no
    /// manager is registered (nothing was sent).
    pub fn donate_ordered(&self, tag: u64, blocks: Vec<DonatedBlock>) -> bool {
        if self.epoch().is_none() {
            return false;
        }
        let Some(call) = self.next_call() else {
            return false;
        };
        if let Ok(mut d) = self.donations.lock() {
            d.insert(call, tag);
        }
        self.outgoing
            .send(DaemonToCache::Donate { call, blocks })
            .is_ok()
    }

    async fn call(&self, make: impl FnOnce(CallId) -> DaemonToCache) -> Option<CacheToDaemon> {
        self.epoch()?;
        let call = self.next_call()?;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().ok()?.insert(call, tx);
        if self.outgoing.send(make(call)).is_err() {
            return None;
        }
        let reply = tokio::time::timeout(self.timeout, rx).await;
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&call);
        }
        match reply {
            Ok(Ok(CacheToDaemon::Error { error, .. })) => {
                tracing::warn!(%error, "cache manager refused a request");
                None
            }
            Ok(Ok(msg)) => Some(msg),
            _ => None,
        }
    }

    /// The longest cached prefix of `hashes`, pinned under a lease. None: no manager now.
    pub async fn acquire(&self, hashes: Vec<BlockHash>) -> Option<(Option<LeaseId>, Vec<BlockId>)> {
        match self
            .call(|call| DaemonToCache::Acquire { call, hashes })
            .await?
        {
            CacheToDaemon::Acquired { lease, blocks, .. } => Some((lease, blocks)),
            _ => None,
        }
    }

    /// Offers a finished sequence's full blocks. None: no manager now (keep nothing for it).
    pub async fn donate(&self, blocks: Vec<DonatedBlock>) -> Option<DonateOutcome> {
        match self
            .call(|call| DaemonToCache::Donate { call, blocks })
            .await?
        {
            CacheToDaemon::Donated { outcome, .. } => Some(outcome),
            _ => None,
        }
    }

    /// Asks the manager to evict up to `blocks` blocks because the pool is short.
    pub async fn reclaim(&self, blocks: u32) -> Option<u32> {
        match self
            .call(|call| DaemonToCache::Reclaim { call, blocks })
            .await?
        {
            CacheToDaemon::Reclaimed { blocks, .. } => Some(blocks),
            _ => None,
        }
    }

    /// Ends a lease.
    pub fn unlease(&self, lease: LeaseId) {
        let _ = self.outgoing.send(DaemonToCache::Unlease { lease });
    }
}

/// State shared between the handle and the connection task.
struct Shared {
    pending: Pending,
    donations: Donations,
    epoch: watch::Sender<Option<Epoch>>,
    orders: mpsc::UnboundedSender<ManagerOrder>,
}

async fn connection_task(
    config: CacheClientConfig,
    mut out_rx: mpsc::UnboundedReceiver<DaemonToCache>,
    shared: Shared,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match connect(&config.socket, Role::Daemon, Limits::default()).await {
            Ok(conn) => {
                backoff = Duration::from_millis(50);
                let (reader, writer) = conn.into_split();
                session(&config, reader, writer, &mut out_rx, &shared).await;
                let _ = shared.epoch.send(None);
                if let Ok(mut p) = shared.pending.lock() {
                    p.clear();
                }
                let lost: Vec<u64> = shared
                    .donations
                    .lock()
                    .map(|mut d| d.drain().map(|(_, t)| t).collect())
                    .unwrap_or_default();
                for tag in lost {
                    let _ = shared.orders.send(ManagerOrder::DonationLost { tag });
                }
                if shared.orders.send(ManagerOrder::Disconnected).is_err() {
                    return;
                }
                tracing::warn!(
                    "cache manager connection lost; serving without prefix reuse, reconnecting"
                );
            }
            Err(e) => tracing::debug!(error = %e, "cache manager not reachable"),
        }
        // Requests sent while disconnected are dropped: their callers already got None.
        while out_rx.try_recv().is_ok() {}
        if shared.orders.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(config.max_backoff);
    }
}

type Reader = FrameReader<tokio::io::ReadHalf<mlxcel_ipc::socket::LocalStream>>;
type Writer = FrameWriter<tokio::io::WriteHalf<mlxcel_ipc::socket::LocalStream>>;

/// One registered connection, until it fails. The socket's two halves get their own tasks
/// (frame reads are not cancel-safe); this loop only moves whole messages between channels.
async fn session(
    config: &CacheClientConfig,
    mut reader: Reader,
    mut writer: Writer,
    out_rx: &mut mpsc::UnboundedReceiver<DaemonToCache>,
    shared: &Shared,
) {
    // One writer: requests from the engine and acknowledgements of orders share it.
    let (to_manager, mut to_write) = mpsc::unbounded_channel::<DaemonToCache>();
    let writer_task = tokio::spawn(async move {
        while let Some(m) = to_write.recv().await {
            if writer.write_frame(&m).await.is_err() {
                return;
            }
        }
    });
    let (from_manager, mut incoming) = mpsc::unbounded_channel::<CacheToDaemon>();
    let reader_task = tokio::spawn(async move {
        loop {
            match reader.read_frame::<CacheToDaemon>().await {
                Ok(Some(msg)) => {
                    if from_manager.send(msg).is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) if e.is_recoverable() => {
                    tracing::warn!(error = %e, "bad frame from the cache manager")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cache manager connection failed");
                    return;
                }
            }
        }
    });
    let register = DaemonToCache::Register {
        call: 0,
        geometry: config.geometry.clone(),
    };
    if to_manager.send(register).is_ok() {
        loop {
            tokio::select! {
                msg = out_rx.recv() => match msg {
                    Some(m) => if to_manager.send(m).is_err() { break },
                    None => break,
                },
                msg = incoming.recv() => match msg {
                    Some(m) => if !handle(m, shared, &to_manager).await { break },
                    None => break,
                },
            }
        }
    }
    reader_task.abort();
    writer_task.abort();
}

/// Handles one message from the manager; false ends the session.
async fn handle(
    msg: CacheToDaemon,
    shared: &Shared,
    ack: &mpsc::UnboundedSender<DaemonToCache>,
) -> bool {
    let Shared {
        pending,
        donations,
        epoch,
        orders,
    } = shared;
    match msg {
        CacheToDaemon::Registered {
            epoch: e,
            block_bytes,
            ..
        } => {
            tracing::info!(
                epoch = e.0,
                block_bytes,
                "registered with the cache manager"
            );
            let _ = orders.send(ManagerOrder::Registered(e));
            let _ = epoch.send(Some(e));
        }
        CacheToDaemon::Error {
            call: Some(0),
            error,
        } => {
            tracing::error!(%error, "the cache manager refused our registration");
            return false;
        }
        CacheToDaemon::Release { release, blocks } => {
            let (done, applied) = oneshot::channel();
            if orders.send(ManagerOrder::Release { blocks, done }).is_err() {
                return false;
            }
            // In order: the next message is read only once this release is applied.
            if applied.await.is_err() {
                return false;
            }
            return ack
                .send(DaemonToCache::ReleaseAck {
                    release: ReleaseId(release.0),
                })
                .is_ok();
        }
        CacheToDaemon::InventoryRequest { inventory } => {
            let (reply, report) = oneshot::channel();
            if orders.send(ManagerOrder::Inventory { reply }).is_err() {
                return false;
            }
            let Ok(report) = report.await else {
                return false;
            };
            return ack
                .send(DaemonToCache::Inventory { inventory, report })
                .is_ok();
        }
        CacheToDaemon::Donated { call, outcome }
            if donations.lock().is_ok_and(|d| d.contains_key(&call)) =>
        {
            let tag = donations.lock().ok().and_then(|mut d| d.remove(&call));
            if let Some(tag) = tag {
                return orders.send(ManagerOrder::Donated { tag, outcome }).is_ok();
            }
        }
        reply => {
            let call = match &reply {
                CacheToDaemon::Acquired { call, .. }
                | CacheToDaemon::Donated { call, .. }
                | CacheToDaemon::Reclaimed { call, .. } => Some(*call),
                CacheToDaemon::Error { call, .. } => *call,
                _ => None,
            };
            let waiter = call.and_then(|c| pending.lock().ok().and_then(|mut p| p.remove(&c)));
            if let Some(w) = waiter {
                let _ = w.send(reply);
            }
        }
    }
    true
}
