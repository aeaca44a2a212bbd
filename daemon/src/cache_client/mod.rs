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
//!
//! The worker never waits on the manager: an acquire has a deadline (tens of milliseconds from
//! the request's arrival), after which the request runs without reuse and the late reply's lease
//! is ended as soon as it arrives. A manager that leaves a donation unanswered for
//! `donation_timeout` is treated as gone (a hung process): the session ends, finished requests'
//! blocks come back to the pool, and the client reconnects, so the pool never drains.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlxcel_ipc::proto::cache::{
    CacheToDaemon, CallId, DaemonToCache, DonateOutcome, DonatedBlock, Epoch, InventoryReport,
    LeaseId, PinRequest,
};
use mlxcel_ipc::{BlockHash, BlockId, Geometry, HashKey};
use tokio::sync::{mpsc, oneshot, watch};

/// Something the manager wants the engine to do.
#[derive(Debug)]
pub enum ManagerOrder {
    /// A registration succeeded: the cache holds nothing yet in this epoch.
    Registered(Registration),
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

/// What a registration gave: the epoch, and the key every block hash of it is computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub epoch: Epoch,
    pub hash_key: HashKey,
}

type Pending = Arc<Mutex<HashMap<CallId, oneshot::Sender<CacheToDaemon>>>>;
/// Donations whose outcome goes to the orders channel: call id -> the engine's tag and when the
/// donation was sent.
type Donations = Arc<Mutex<HashMap<CallId, (u64, Instant)>>>;

/// A handle to the connection task; cheap to clone.
#[derive(Clone)]
pub struct CacheClient {
    outgoing: mpsc::UnboundedSender<DaemonToCache>,
    pending: Pending,
    donations: Donations,
    next_call: Arc<Mutex<CallId>>,
    registration: watch::Receiver<Option<Registration>>,
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
    /// How long a donation may go unanswered before the manager is treated as gone.
    pub donation_timeout: Duration,
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
        let (epoch_tx, registration) = watch::channel(None);
        let client = CacheClient {
            outgoing,
            pending: pending.clone(),
            donations: donations.clone(),
            next_call: Arc::default(),
            registration,
            timeout: config.request_timeout,
        };
        tokio::spawn(session::connection_task(
            config,
            out_rx,
            session::Shared {
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
        self.registration().map(|r| r.epoch)
    }

    /// The current registration (None while not registered).
    pub fn registration(&self) -> Option<Registration> {
        *self.registration.borrow()
    }

    /// Waits until registered (or `limit` passes); true if registered.
    pub async fn wait_registered(&mut self, limit: Duration) -> bool {
        let wait = self.registration.wait_for(Option::is_some);
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
    pub fn donate_ordered(
        &self,
        tag: u64,
        blocks: Vec<DonatedBlock>,
        pins: Vec<PinRequest>,
    ) -> bool {
        if self.epoch().is_none() {
            return false;
        }
        let Some(call) = self.next_call() else {
            return false;
        };
        if let Ok(mut d) = self.donations.lock() {
            d.insert(call, (tag, Instant::now()));
        }
        self.outgoing
            .send(DaemonToCache::Donate { call, blocks, pins })
            .is_ok()
    }

    async fn call(&self, make: impl FnOnce(CallId) -> DaemonToCache) -> Option<CacheToDaemon> {
        self.call_by(Instant::now() + self.timeout, make).await
    }

    /// A request whose reply is awaited until `deadline`. A reply that comes later finds no
    /// waiter; the connection task then undoes what it granted (a lease is ended at once).
    async fn call_by(
        &self,
        deadline: Instant,
        make: impl FnOnce(CallId) -> DaemonToCache,
    ) -> Option<CacheToDaemon> {
        self.epoch()?;
        let call = self.next_call()?;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().ok()?.insert(call, tx);
        if self.outgoing.send(make(call)).is_err() {
            return None;
        }
        let reply = tokio::time::timeout_at(deadline.into(), rx).await;
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
        self.acquire_by(Instant::now() + self.timeout, hashes).await
    }

    /// Like [`CacheClient::acquire`], giving up at `deadline` (None: go on without reuse).
    pub async fn acquire_by(
        &self,
        deadline: Instant,
        hashes: Vec<BlockHash>,
    ) -> Option<(Option<LeaseId>, Vec<BlockId>)> {
        match self
            .call_by(deadline, |call| DaemonToCache::Acquire { call, hashes })
            .await?
        {
            CacheToDaemon::Acquired { lease, blocks, .. } => Some((lease, blocks)),
            _ => None,
        }
    }

    /// Offers a finished sequence's full blocks. None: no manager now (keep nothing for it).
    pub async fn donate(&self, blocks: Vec<DonatedBlock>) -> Option<DonateOutcome> {
        match self
            .call(|call| DaemonToCache::Donate {
                call,
                blocks,
                pins: Vec::new(),
            })
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

mod session;
