//! The daemon's cache-manager client against the real `mlxcel-cachemgr` process: registration,
//! acquire/donate, releases applied before they are acknowledged, inventories, and a manager
//! that dies and comes back. The engine side is a small holder task keeping the set of blocks
//! held for the cache, as the engine does.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlxcel_daemon::cache_client::{CacheClient, CacheClientConfig, ManagerOrder};
use mlxcel_ipc::block_hash::{HashSeed, block_hashes};
use mlxcel_ipc::client::AdminClient;
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, CacheStats};
use mlxcel_ipc::proto::cache::{DonatedBlock, InventoryReport};
use mlxcel_ipc::{BlockHash, Geometry, Role};
use mlxcel_tests::bin;
use mlxcel_tests::manager::Manager;
use tokio::sync::mpsc;

const BLOCK_BYTES: u64 = 737_280;

fn geometry() -> Geometry {
    mlxcel_tests::geometry::smollm2(64)
}

fn chain(seed: u32, blocks: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..blocks as u32 * 32)
        .map(|i| seed * 100_000 + i)
        .collect();
    block_hashes(
        &HashSeed::new(&mlxcel_ipc::HashKey([0; 32]), "SmolLM2-135M-Instruct", None),
        &tokens,
        32,
    )
}

/// Blocks the engine holds for the cache.
type Held = Arc<Mutex<HashSet<u32>>>;

/// The engine's side of the orders: the set of blocks held for the cache.
fn holder() -> (mpsc::UnboundedSender<ManagerOrder>, Held, Arc<Mutex<u32>>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let held: Held = Arc::default();
    let disconnects: Arc<Mutex<u32>> = Arc::default();
    let (h, d) = (held.clone(), disconnects.clone());
    tokio::spawn(async move {
        while let Some(order) = rx.recv().await {
            match order {
                ManagerOrder::Registered(_) => {}
                ManagerOrder::Release { blocks, done } => {
                    let mut held = h.lock().unwrap();
                    for b in blocks {
                        assert!(held.remove(&b), "release of block {b} not held");
                    }
                    let _ = done.send(());
                }
                ManagerOrder::Inventory { reply } => {
                    let held = h.lock().unwrap();
                    let _ = reply.send(InventoryReport {
                        epoch: mlxcel_ipc::proto::cache::Epoch(0),
                        cache_blocks: held.iter().copied().collect(),
                        pool_blocks: 64,
                        free_blocks: 64 - held.len() as u32,
                        pool_bytes_measured: 64 * BLOCK_BYTES,
                        engine_active_bytes: 0,
                    });
                }
                // This test's donations use the awaited `donate`, not `donate_ordered`.
                ManagerOrder::Donated { .. } | ManagerOrder::DonationLost { .. } => {}
                ManagerOrder::Disconnected => {
                    h.lock().unwrap().clear();
                    *d.lock().unwrap() += 1;
                }
            }
        }
    });
    (tx, held, disconnects)
}

async fn admin(socket: &std::path::Path, request: AdminRequest) -> AdminReply {
    AdminClient::connect(socket, Role::Admin)
        .await
        .unwrap()
        .request(&request)
        .await
        .unwrap()
}

async fn stats(socket: &std::path::Path) -> CacheStats {
    match admin(socket, AdminRequest::Stats).await {
        AdminReply::Stats(s) => *s,
        other => panic!("{other:?}"),
    }
}

fn client(socket: PathBuf, orders: mpsc::UnboundedSender<ManagerOrder>) -> CacheClient {
    let config = CacheClientConfig {
        socket,
        geometry: geometry(),
        max_backoff: Duration::from_millis(200),
        request_timeout: Duration::from_secs(10),
        donation_timeout: Duration::from_secs(60),
    };
    CacheClient::spawn(config, orders)
}

async fn donate(c: &CacheClient, held: &Held, hashes: &[BlockHash], blocks: &[u32]) -> Vec<u32> {
    let chain = hashes
        .iter()
        .zip(blocks)
        .map(|(&hash, &block)| DonatedBlock { hash, block })
        .collect();
    let outcome = c.donate(chain).await.expect("manager connected");
    held.lock()
        .unwrap()
        .extend(outcome.retained.iter().copied());
    outcome.retained
}

#[tokio::test]
async fn releases_are_applied_before_they_are_acknowledged_and_the_ledger_matches() {
    let cap = (4 * BLOCK_BYTES).to_string();
    let m = Manager::start(
        &bin("mlxcel-cachemgr"),
        &["--capacity-bytes", &cap, "--reconcile-interval", "off"],
    );
    let (orders, held, _) = holder();
    let mut c = client(m.socket.clone(), orders);
    assert!(c.wait_registered(Duration::from_secs(10)).await);

    let a = chain(1, 3);
    assert_eq!(c.acquire(a.clone()).await, Some((None, vec![])));
    assert_eq!(donate(&c, &held, &a, &[0, 1, 2]).await, vec![0, 1, 2]);
    let (lease, blocks) = c.acquire(a.clone()).await.unwrap();
    assert_eq!(blocks, vec![0, 1, 2]);
    c.unlease(lease.unwrap());
    // Room for 4 blocks: B's 3 make the manager release 2 of A's, which must be applied (and
    // acknowledged) before B is admitted.
    let b = chain(2, 3);
    assert_eq!(donate(&c, &held, &b, &[3, 4, 5]).await, vec![3, 4, 5]);
    let s = stats(&m.socket).await;
    assert_eq!(
        (s.blocks, s.releasing_blocks, s.used_bytes),
        (4, 0, 4 * BLOCK_BYTES)
    );
    assert_eq!(
        held.lock().unwrap().len(),
        4,
        "the engine holds exactly what the ledger books"
    );
    match admin(&m.socket, AdminRequest::Reconcile).await {
        AdminReply::Reconciled(r) => {
            assert_eq!((r.drift_bytes, r.inventory_bytes), (0, 4 * BLOCK_BYTES))
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_lost_manager_means_no_reuse_until_it_returns_and_then_a_new_registration() {
    let m = Manager::start(&bin("mlxcel-cachemgr"), &["--reconcile-interval", "off"]);
    let socket = m.socket.clone();
    let (orders, held, disconnects) = holder();
    let mut c = client(socket.clone(), orders);
    assert!(c.wait_registered(Duration::from_secs(10)).await);
    let a = chain(1, 2);
    donate(&c, &held, &a, &[7, 8]).await;

    let dir = m.kill9();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while *disconnects.lock().unwrap() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the client never noticed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        held.lock().unwrap().is_empty(),
        "blocks nobody governs are dropped"
    );
    assert_eq!(c.epoch(), None);
    assert_eq!(
        c.acquire(a.clone()).await,
        None,
        "no manager: no prefix reuse, at once"
    );

    let m = Manager::start_in(
        &bin("mlxcel-cachemgr"),
        dir,
        &["--reconcile-interval", "off"],
    );
    assert!(
        c.wait_registered(Duration::from_secs(10)).await,
        "reconnects and registers again"
    );
    let s = stats(&m.socket).await;
    assert!(s.daemon.is_some());
    assert_eq!(s.used_bytes, 0);
    assert_eq!(
        c.acquire(a).await,
        Some((None, vec![])),
        "a new manager remembers nothing"
    );
    match admin(&m.socket, AdminRequest::Reconcile).await {
        AdminReply::Reconciled(r) => assert_eq!(r.drift_bytes, 0),
        other => panic!("{other:?}"),
    }
}
