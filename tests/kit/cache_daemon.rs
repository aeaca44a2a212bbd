//! A test daemon: a real socket client that registers, donates, acquires, and obeys releases and
//! inventory requests the way the real daemon must (in order, at once).

use std::collections::{BTreeSet, VecDeque};
use std::path::Path;

use mlxcel_ipc::client::connect;
use mlxcel_ipc::proto::cache::{
    CacheToDaemon, CallId, DaemonToCache, DonateOutcome, DonatedBlock, Epoch, InventoryReport,
    LeaseId,
};
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{BlockHash, BlockId, Connection, Geometry, Limits, Role};

/// A registered test daemon.
pub struct TestDaemon {
    conn: Connection<LocalStream>,
    next_call: CallId,
    /// Epoch given at registration.
    pub epoch: Epoch,
    /// Block size the manager books.
    pub block_bytes: u64,
    /// Blocks this daemon holds a cache reference on.
    pub held: BTreeSet<BlockId>,
    /// Releases obeyed so far (blocks).
    pub released: u64,
    geometry: Geometry,
    unsolicited: VecDeque<CacheToDaemon>,
}

impl TestDaemon {
    /// Connects and registers with `geometry`.
    pub async fn register(socket: &Path, geometry: Geometry) -> TestDaemon {
        let conn = connect(socket, Role::Daemon, Limits::default())
            .await
            .expect("connect");
        let mut d = TestDaemon {
            conn,
            next_call: 0,
            epoch: Epoch(0),
            block_bytes: 0,
            held: BTreeSet::new(),
            released: 0,
            geometry: geometry.clone(),
            unsolicited: VecDeque::new(),
        };
        match d
            .call(|call| DaemonToCache::Register { call, geometry })
            .await
        {
            CacheToDaemon::Registered {
                epoch, block_bytes, ..
            } => {
                d.epoch = epoch;
                d.block_bytes = block_bytes;
            }
            other => panic!("registration failed: {other:?}"),
        }
        d
    }

    /// Sends a request and returns its reply, obeying releases and inventory requests that
    /// arrive meanwhile.
    pub async fn call(&mut self, make: impl FnOnce(CallId) -> DaemonToCache) -> CacheToDaemon {
        self.next_call += 1;
        let call = self.next_call;
        self.conn.write_frame(&make(call)).await.expect("send");
        loop {
            let msg = self.recv().await.expect("reply");
            let reply_call = match &msg {
                CacheToDaemon::Registered { call, .. }
                | CacheToDaemon::Acquired { call, .. }
                | CacheToDaemon::Donated { call, .. }
                | CacheToDaemon::Reclaimed { call, .. } => Some(*call),
                CacheToDaemon::Error { call, .. } => *call,
                _ => None,
            };
            if reply_call == Some(call) {
                return msg;
            }
            self.unsolicited.push_back(msg);
        }
    }

    /// Reads the next message, obeying `Release` and `InventoryRequest` on the way (they are
    /// still returned, for tests that want to see them). None when the manager closed.
    pub async fn recv(&mut self) -> Option<CacheToDaemon> {
        let msg = self
            .conn
            .read_frame::<CacheToDaemon>()
            .await
            .expect("frame")?;
        match &msg {
            CacheToDaemon::Release { release, blocks } => {
                for b in blocks {
                    assert!(
                        self.held.remove(b),
                        "release of block {b} we do not hold for the cache"
                    );
                }
                self.released += blocks.len() as u64;
                self.send(&DaemonToCache::ReleaseAck { release: *release })
                    .await;
            }
            CacheToDaemon::InventoryRequest { inventory } => {
                let report = InventoryReport {
                    epoch: self.epoch,
                    cache_blocks: self.held.iter().copied().collect(),
                    pool_blocks: self.geometry.pool_blocks,
                    free_blocks: self.geometry.pool_blocks - self.held.len() as u32,
                    pool_bytes_measured: self.geometry.pool_bytes().expect("geometry"),
                    engine_active_bytes: 0,
                };
                self.send(&DaemonToCache::Inventory {
                    inventory: *inventory,
                    report,
                })
                .await;
            }
            _ => {}
        }
        Some(msg)
    }

    /// Messages that arrived while waiting for replies.
    pub fn take_unsolicited(&mut self) -> Vec<CacheToDaemon> {
        self.unsolicited.drain(..).collect()
    }

    /// Sends a message that has no reply.
    pub async fn send(&mut self, msg: &DaemonToCache) {
        self.conn.write_frame(msg).await.expect("send");
    }

    /// Acquires the longest cached prefix of `hashes`.
    pub async fn acquire(&mut self, hashes: &[BlockHash]) -> (Option<LeaseId>, Vec<BlockId>) {
        let hashes = hashes.to_vec();
        match self
            .call(|call| DaemonToCache::Acquire { call, hashes })
            .await
        {
            CacheToDaemon::Acquired { lease, blocks, .. } => (lease, blocks),
            other => panic!("acquire failed: {other:?}"),
        }
    }

    /// Donates a chain (hash i held in block i) and applies the outcome.
    pub async fn donate(&mut self, hashes: &[BlockHash], blocks: &[BlockId]) -> DonateOutcome {
        let chain: Vec<DonatedBlock> = hashes
            .iter()
            .zip(blocks)
            .map(|(&hash, &block)| DonatedBlock { hash, block })
            .collect();
        match self
            .call(|call| DaemonToCache::Donate {
                call,
                blocks: chain,
                pins: Vec::new(),
            })
            .await
        {
            CacheToDaemon::Donated { outcome, .. } => {
                self.held.extend(outcome.retained.iter().copied());
                outcome
            }
            other => panic!("donate failed: {other:?}"),
        }
    }

    /// Ends a lease.
    pub async fn unlease(&mut self, lease: LeaseId) {
        self.send(&DaemonToCache::Unlease { lease }).await;
    }

    /// A round trip that evicts nothing: everything sent before it has been applied when it
    /// returns (messages on one connection are handled in order).
    pub async fn barrier(&mut self) {
        match self
            .call(|call| DaemonToCache::Reclaim { call, blocks: 0 })
            .await
        {
            CacheToDaemon::Reclaimed { blocks: 0, .. } => {}
            other => panic!("barrier failed: {other:?}"),
        }
    }

    /// The connection, for raw writes.
    pub fn conn(&mut self) -> &mut Connection<LocalStream> {
        &mut self.conn
    }
}
