//! Timer-driven behaviour on paused tokio time: idle TTL, lease expiry, release retries and
//! donations that wait too long for releases. The cache task runs as in the server; the daemon
//! side is a channel.

use std::time::Duration;

use mlxcel_cachemgr::server::cache_task::cache_task;
use mlxcel_cachemgr::server::{CacheHandle, Command};
use mlxcel_cachemgr::{Cache, Policy};
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, CacheStats, EvictSelector};
use mlxcel_ipc::proto::cache::{CacheToDaemon, DaemonToCache, DonatedBlock, Epoch, RefuseReason};
use mlxcel_ipc::{BlockHash, BlockId};
use mlxcel_tests::geometry::{prompt_hashes, smollm2};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

struct Harness {
    handle: CacheHandle,
    epoch: Epoch,
    from_cache: mpsc::UnboundedReceiver<CacheToDaemon>,
    _stop: tokio_util::sync::DropGuard,
}

impl Harness {
    async fn start(policy: Policy) -> Harness {
        let (tx, rx) = mpsc::channel(64);
        let stop = CancellationToken::new();
        tokio::spawn(cache_task(
            Cache::new(policy),
            rx,
            Duration::from_secs(1),
            stop.clone(),
            mlxcel_ipc::HashKey([0; 32]),
        ));
        let handle = CacheHandle::new(tx);
        let (outbound, mut from_cache) = mpsc::unbounded_channel();
        let (reply, epoch) = oneshot::channel();
        handle
            .send(Command::Register {
                pid: 1,
                geometry: smollm2(64),
                call: 0,
                outbound,
                reply,
            })
            .await;
        let epoch = epoch.await.unwrap().expect("registered");
        assert!(matches!(
            from_cache.recv().await,
            Some(CacheToDaemon::Registered { .. })
        ));
        Harness {
            handle,
            epoch,
            from_cache,
            _stop: stop.drop_guard(),
        }
    }

    async fn send(&self, msg: DaemonToCache) {
        assert!(
            self.handle
                .send(Command::Daemon {
                    epoch: self.epoch,
                    msg
                })
                .await
        );
    }

    async fn stats(&self) -> CacheStats {
        match self.handle.admin(AdminRequest::Stats).await {
            AdminReply::Stats(s) => *s,
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn donate(&mut self, call: u64, hashes: &[BlockHash], blocks: &[BlockId]) {
        let blocks = hashes
            .iter()
            .zip(blocks)
            .map(|(&hash, &block)| DonatedBlock { hash, block })
            .collect();
        self.send(DaemonToCache::Donate {
            call,
            blocks,
            pins: Vec::new(),
        })
        .await;
    }

    /// Everything the cache has sent so far.
    fn received(&mut self) -> Vec<CacheToDaemon> {
        std::iter::from_fn(|| self.from_cache.try_recv().ok()).collect()
    }
}

#[tokio::test(start_paused = true)]
async fn idle_blocks_expire_on_the_timer_without_any_lookup() {
    let policy = Policy {
        idle_ttl: Some(Duration::from_secs(60)),
        reconcile_interval: None,
        ..Policy::default()
    };
    let mut h = Harness::start(policy).await;
    h.donate(1, &prompt_hashes(0, 0, 0, 3), &[0, 1, 2]).await;
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(h.stats().await.blocks, 3);
    h.received();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = h.stats().await;
    assert_eq!(s.blocks, 0);
    assert_eq!(s.evicted_blocks.ttl, 3);
    assert_eq!(
        s.releasing_blocks, 3,
        "still real memory until the daemon acknowledges"
    );
    let releases: Vec<_> = h
        .received()
        .into_iter()
        .filter(|m| matches!(m, CacheToDaemon::Release { .. }))
        .collect();
    assert_eq!(releases.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_use_restarts_the_idle_clock() {
    let policy = Policy {
        idle_ttl: Some(Duration::from_secs(60)),
        reconcile_interval: None,
        ..Policy::default()
    };
    let h = Harness::start(policy).await;
    let hashes = prompt_hashes(0, 0, 0, 2);
    let mut h = h;
    h.donate(1, &hashes, &[0, 1]).await;
    tokio::time::sleep(Duration::from_secs(50)).await;
    h.send(DaemonToCache::Acquire {
        call: 2,
        hashes: hashes.clone(),
    })
    .await;
    let lease = loop {
        if let Some(CacheToDaemon::Acquired { lease, .. }) = h.from_cache.recv().await {
            break lease.unwrap();
        }
    };
    h.send(DaemonToCache::Unlease { lease }).await;
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert_eq!(
        h.stats().await.blocks,
        2,
        "used 50 s ago: not idle for 60 s"
    );
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(h.stats().await.evicted_blocks.ttl, 2);
}

#[tokio::test(start_paused = true)]
async fn leases_expire_after_the_lease_timeout() {
    let policy = Policy {
        lease_timeout: Duration::from_secs(600),
        reconcile_interval: None,
        ..Policy::default()
    };
    let mut h = Harness::start(policy).await;
    let hashes = prompt_hashes(0, 0, 0, 2);
    h.donate(1, &hashes, &[0, 1]).await;
    h.send(DaemonToCache::Acquire { call: 2, hashes }).await;
    tokio::time::sleep(Duration::from_secs(599)).await;
    let s = h.stats().await;
    assert_eq!((s.active_leases, s.pinned_bytes), (1, 2 * 737_280));
    match h
        .handle
        .admin(AdminRequest::Evict(EvictSelector::All))
        .await
    {
        AdminReply::Evicted(r) => assert_eq!((r.blocks, r.pinned_kept), (0, 2)),
        other => panic!("unexpected {other:?}"),
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = h.stats().await;
    assert_eq!(
        (s.active_leases, s.expired_leases, s.pinned_bytes),
        (0, 1, 0)
    );
    match h
        .handle
        .admin(AdminRequest::Evict(EvictSelector::All))
        .await
    {
        AdminReply::Evicted(r) => assert_eq!(r.blocks, 2),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn unacknowledged_releases_are_retried_and_a_waiting_donation_times_out() {
    // Room for 2 blocks; the daemon never acknowledges anything.
    let policy = Policy {
        capacity_bytes: 2 * 737_280,
        release_timeout: Duration::from_secs(5),
        reconcile_interval: None,
        ..Policy::default()
    };
    let mut h = Harness::start(policy).await;
    h.donate(1, &prompt_hashes(0, 0, 0, 2), &[0, 1]).await;
    h.donate(2, &prompt_hashes(1, 0, 1, 2), &[2, 3]).await;
    tokio::task::yield_now().await;
    let s = h.stats().await;
    assert_eq!(
        (s.blocks, s.releasing_blocks, s.reserved_bytes),
        (0, 2, 2 * 737_280)
    );
    assert!(s.used_bytes + s.releasing_bytes <= s.capacity_bytes);
    h.received();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let msgs = h.received();
    assert!(
        msgs.iter()
            .any(|m| matches!(m, CacheToDaemon::Release { .. })),
        "release sent again: {msgs:?}"
    );
    let refused = msgs.iter().find_map(|m| match m {
        CacheToDaemon::Donated { call: 2, outcome } => Some(outcome.clone()),
        _ => None,
    });
    let outcome = refused.expect("the waiting donation was answered");
    assert_eq!(outcome.refused, vec![2, 3]);
    assert_eq!(outcome.refused_reason, Some(RefuseReason::ReleaseTimeout));
    let s = h.stats().await;
    assert!(s.release_retries >= 1);
    assert_eq!(s.rejected_blocks.release_timeout, 2);
    assert_eq!(s.reserved_bytes, 0);
    assert_eq!(
        s.releasing_blocks, 2,
        "unacknowledged memory is still counted"
    );
}
