//! The cache manager over its real socket, as a real process: hostile frames, the handshake,
//! a test daemon's whole conversation, the seed's regression, epochs, signals and stale sockets.

use std::time::Duration;

use mlxcel_ipc::client::{AdminClient, ClientError, connect};
use mlxcel_ipc::proto::ErrorCode;
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, CacheStats, EvictSelector};
use mlxcel_ipc::proto::cache::{CacheToDaemon, DaemonToCache};
use mlxcel_ipc::{Connection, Hello, HelloReply, Limits, PROTOCOL_VERSION, Role, codec, socket};
use mlxcel_tests::cache_daemon::TestDaemon;
use mlxcel_tests::geometry::{prompt_hashes, smollm2};
use mlxcel_tests::manager::Manager;
use nix::sys::signal::Signal;

fn manager_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_mlxcel-cachemgr"))
}

async fn stats(socket: &std::path::Path) -> CacheStats {
    let mut admin = AdminClient::connect(socket, Role::Admin)
        .await
        .expect("admin connect");
    match admin.request(&AdminRequest::Stats).await.expect("stats") {
        AdminReply::Stats(s) => *s,
        other => panic!("unexpected {other:?}"),
    }
}

async fn raw_admin(socket: &std::path::Path) -> Connection<socket::LocalStream> {
    connect(socket, Role::Admin, Limits::default())
        .await
        .expect("connect")
}

#[tokio::test]
async fn garbage_and_unknown_messages_get_an_error_reply_and_the_connection_goes_on() {
    let m = Manager::start(&manager_bin(), &[]);
    let mut c = raw_admin(&m.socket).await;
    c.writer()
        .write_payload(&[0xde, 0xad, 0xbe, 0xef, 0x01])
        .await
        .unwrap();
    match c.read_frame::<AdminReply>().await.unwrap() {
        Some(AdminReply::Error(e)) => assert_eq!(e.code, ErrorCode::BadFrame),
        other => panic!("expected a bad_frame error, got {other:?}"),
    }
    // A well-formed frame naming a variant that does not exist.
    c.writer()
        .write_payload(&codec::encode(&(200u32, 1u8)).unwrap())
        .await
        .unwrap();
    match c.read_frame::<AdminReply>().await.unwrap() {
        Some(AdminReply::Error(e)) => assert_eq!(e.code, ErrorCode::BadFrame),
        other => panic!("expected a bad_frame error, got {other:?}"),
    }
    c.write_frame(&AdminRequest::Stats).await.unwrap();
    assert!(matches!(
        c.read_frame::<AdminReply>().await.unwrap(),
        Some(AdminReply::Stats(_))
    ));
}

#[tokio::test]
async fn an_oversized_length_prefix_is_refused_without_taking_the_server_down() {
    let m = Manager::start(&manager_bin(), &["--max-frame-bytes", "64KiB"]);
    let mut c = raw_admin(&m.socket).await;
    // Claim a 4 GiB frame; the server must answer without allocating it, then hang up.
    c.writer().write_raw(&u32::MAX.to_le_bytes()).await.unwrap();
    match c.read_frame::<AdminReply>().await.unwrap() {
        Some(AdminReply::Error(e)) => {
            assert_eq!(e.code, ErrorCode::FrameTooLarge);
            assert!(e.message.contains("65536"), "{}", e.message);
        }
        other => panic!("expected frame_too_large, got {other:?}"),
    }
    assert!(
        c.read_frame::<AdminReply>().await.unwrap().is_none(),
        "connection closed after it"
    );
    // Others are still served.
    assert_eq!(stats(&m.socket).await.capacity_bytes, 2 << 30);
}

#[tokio::test]
async fn a_wrong_protocol_version_is_refused_with_a_clear_message() {
    let m = Manager::start(&manager_bin(), &[]);
    let stream = socket::connect(&m.socket).await.unwrap();
    let mut c = Connection::new(stream, Limits::default());
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION + 41,
        role: Role::Admin,
        pid: 1,
    };
    c.write_frame(&hello).await.unwrap();
    match c.read_frame::<HelloReply>().await.unwrap() {
        Some(HelloReply::Refused { reason }) => {
            assert!(reason.contains("protocol version mismatch"), "{reason}");
            assert!(
                reason.contains(&format!("client speaks {}", PROTOCOL_VERSION + 41)),
                "{reason}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(c.read_frame::<HelloReply>().await.unwrap().is_none());
    // A frame that is not a Hello at all is refused too.
    let mut c = Connection::new(socket::connect(&m.socket).await.unwrap(), Limits::default());
    c.writer().write_payload(b"GET / HTTP/1.1").await.unwrap();
    assert!(matches!(
        c.read_frame::<HelloReply>().await.unwrap(),
        Some(HelloReply::Refused { .. })
    ));
    assert_eq!(stats(&m.socket).await.blocks, 0);
}

#[tokio::test]
async fn a_daemon_must_register_first_and_only_one_at_a_time() {
    let m = Manager::start(&manager_bin(), &[]);
    let mut c = connect(&m.socket, Role::Daemon, Limits::default())
        .await
        .unwrap();
    c.write_frame(&DaemonToCache::Acquire {
        call: 7,
        hashes: vec![],
    })
    .await
    .unwrap();
    match c.read_frame::<CacheToDaemon>().await.unwrap() {
        Some(CacheToDaemon::Error { call, error }) => {
            assert_eq!(call, Some(7));
            assert_eq!(error.code, ErrorCode::BadRequest);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    let first = TestDaemon::register(&m.socket, smollm2(64)).await;
    assert_eq!(
        first.block_bytes, 737_280,
        "the manager computes SmolLM2's real block size itself"
    );
    c.write_frame(&DaemonToCache::Register {
        call: 8,
        geometry: smollm2(64),
    })
    .await
    .unwrap();
    match c.read_frame::<CacheToDaemon>().await.unwrap() {
        Some(CacheToDaemon::Error { error, .. }) => {
            assert_eq!(error.code, ErrorCode::AlreadyRegistered)
        }
        other => panic!("expected already_registered, got {other:?}"),
    }
    // A geometry with a zero field is refused with a reason.
    drop(first);
    let mut c = connect(&m.socket, Role::Daemon, Limits::default())
        .await
        .unwrap();
    let mut bad = smollm2(64);
    bad.kv_heads = 0;
    // The first daemon's disconnect may still be in flight: retry until it is processed.
    for _ in 0..100 {
        c.write_frame(&DaemonToCache::Register {
            call: 9,
            geometry: bad.clone(),
        })
        .await
        .unwrap();
        match c.read_frame::<CacheToDaemon>().await.unwrap() {
            Some(CacheToDaemon::Error { error, .. })
                if error.code == ErrorCode::AlreadyRegistered =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Some(CacheToDaemon::Error { error, .. }) => {
                assert_eq!(error.code, ErrorCode::BadGeometry);
                assert!(error.message.contains("kv_heads"), "{}", error.message);
                return;
            }
            other => panic!("expected bad_geometry, got {other:?}"),
        }
    }
    panic!("the first daemon's epoch was never dropped");
}

#[tokio::test]
async fn seed_regression_small_capacity_evicts_and_stats_are_real_bytes() {
    // The seed: a ledger booked 32 B per ~128 KiB block, so a cap never fired. Here each
    // SmolLM2 block is 737,280 real bytes; a 4 MiB cap holds 5 of them.
    let m = Manager::start(&manager_bin(), &["--capacity-bytes", "4MiB"]);
    let mut d = TestDaemon::register(&m.socket, smollm2(256)).await;
    let mut next_block = 0u32;
    for prompt in 0..6u32 {
        let hashes = prompt_hashes(prompt, 0, prompt, 3);
        let blocks: Vec<u32> = (next_block..next_block + 3).collect();
        next_block += 3;
        let (lease, hit) = d.acquire(&hashes).await;
        assert!(lease.is_none() && hit.is_empty());
        let outcome = d.donate(&hashes, &blocks).await;
        assert!(outcome.refused.is_empty(), "{outcome:?}");
    }
    d.barrier().await;
    let s = stats(&m.socket).await;
    assert_eq!(s.block_bytes, 737_280);
    assert!(
        s.evicted_blocks.capacity >= 13,
        "eviction must actually happen: {:?}",
        s.evicted_blocks
    );
    assert_eq!(
        s.used_bytes,
        d.held.len() as u64 * 737_280,
        "stats bytes are the daemon's real bytes"
    );
    assert_eq!(s.used_bytes, s.blocks * 737_280);
    assert!(s.used_bytes + s.releasing_bytes <= 4 << 20);
    assert_eq!(s.blocks, 5, "4 MiB / 737,280 B = 5 whole blocks");
    // And the ledger agrees with the daemon's inventory block for block.
    let mut admin = AdminClient::connect(&m.socket, Role::Admin).await.unwrap();
    let reconcile = tokio::spawn(async move { admin.request(&AdminRequest::Reconcile).await });
    // The test daemon answers the inventory request as it reads it.
    while !matches!(d.recv().await, Some(CacheToDaemon::InventoryRequest { .. })) {}
    match reconcile.await.unwrap().unwrap() {
        AdminReply::Reconciled(r) => {
            assert_eq!(r.drift_bytes, 0);
            assert_eq!(r.ledger_bytes, 5 * 737_280);
            assert_eq!(r.inventory_bytes, r.ledger_bytes);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn shared_prefix_is_stored_once_and_leases_pin_it() {
    let m = Manager::start(&manager_bin(), &[]);
    let mut d = TestDaemon::register(&m.socket, smollm2(256)).await;
    // The first request donates a 4-block shared prefix plus its own block.
    let first = prompt_hashes(1, 4, 0, 1);
    d.donate(&first, &[0, 1, 2, 3, 4]).await;
    let mut next = 5u32;
    for seed in 1..8u32 {
        let hashes = prompt_hashes(1, 4, seed, 1);
        let (lease, blocks) = d.acquire(&hashes).await;
        assert_eq!(blocks, vec![0, 1, 2, 3], "the shared prefix is found");
        let mut chain = blocks.clone();
        chain.push(next);
        next += 1;
        let outcome = d.donate(&hashes, &chain).await;
        assert_eq!(outcome.already_cached, vec![0, 1, 2, 3]);
        assert_eq!(outcome.retained, vec![next - 1]);
        d.unlease(lease.unwrap()).await;
    }
    d.barrier().await;
    let s = stats(&m.socket).await;
    assert_eq!(s.blocks, 4 + 8, "shared prefix counted once");
    assert_eq!(s.used_bytes, 12 * 737_280);
    assert_eq!(s.entries, 8);
    assert_eq!(s.prefix_hits, 7);
    assert_eq!(s.hit_tokens, 7 * 4 * 32);

    // A leased prefix survives `evict --all`; its unshared tails do not.
    let (lease, _) = d.acquire(&prompt_hashes(1, 4, 0, 1)).await;
    let mut admin = AdminClient::connect(&m.socket, Role::Admin).await.unwrap();
    match admin
        .request(&AdminRequest::Evict(EvictSelector::All))
        .await
        .unwrap()
    {
        AdminReply::Evicted(r) => {
            assert_eq!(r.blocks, 7, "the 7 tails not pinned by the lease");
            assert_eq!(r.pinned_kept, 5);
        }
        other => panic!("unexpected {other:?}"),
    }
    d.barrier().await;
    assert_eq!(d.released, 7);
    assert_eq!(stats(&m.socket).await.pinned_bytes, 5 * 737_280);
    d.unlease(lease.unwrap()).await;
    d.barrier().await;
    match admin
        .request(&AdminRequest::Evict(EvictSelector::All))
        .await
        .unwrap()
    {
        AdminReply::Evicted(r) => assert_eq!(r.blocks, 5),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn a_lost_daemon_connection_drops_its_epoch() {
    let m = Manager::start(&manager_bin(), &[]);
    let mut d = TestDaemon::register(&m.socket, smollm2(64)).await;
    let epoch = d.epoch;
    d.donate(&prompt_hashes(0, 0, 0, 6), &[10, 11, 12, 13, 14, 15])
        .await;
    let (lease, _) = d.acquire(&prompt_hashes(0, 0, 0, 6)).await;
    assert!(lease.is_some());
    assert_eq!(stats(&m.socket).await.blocks, 6);
    drop(d); // the connection dies with its pins
    let mut s = stats(&m.socket).await;
    for _ in 0..200 {
        if s.daemon.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        s = stats(&m.socket).await;
    }
    assert!(s.daemon.is_none());
    assert_eq!(s.blocks, 0);
    assert_eq!(s.used_bytes, 0);
    assert_eq!(s.active_leases, 0);
    assert_eq!(s.evicted_blocks.daemon_lost, 6);
    let again = TestDaemon::register(&m.socket, smollm2(64)).await;
    assert!(again.epoch > epoch, "a new registration is a new epoch");
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_removes_the_socket() {
    let mut m = Manager::start(&manager_bin(), &[]);
    let _d = TestDaemon::register(&m.socket, smollm2(64)).await;
    let _admin = AdminClient::connect(&m.socket, Role::Admin).await.unwrap();
    let status = m
        .signal_and_wait(Signal::SIGTERM, Duration::from_secs(20))
        .expect("exits within 20 s");
    assert!(status.success(), "{status}");
    assert!(!m.socket.exists());
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_live_one_is_not() {
    let m = Manager::start(&manager_bin(), &[]);
    let socket = m.socket.clone();
    // A second manager on the same directory must refuse to start.
    let out = std::process::Command::new(manager_bin())
        .arg("--socket-dir")
        .arg(m.dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already listening"), "{err}");
    // kill -9 leaves the socket file behind; the next start removes it.
    let dir = m.kill9();
    assert!(socket.exists());
    let m = Manager::start_in(&manager_bin(), dir, &[]);
    assert_eq!(stats(&m.socket).await.blocks, 0);
}

#[tokio::test]
async fn a_missing_manager_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = AdminClient::connect(&dir.path().join("cachemgr.sock"), Role::Admin)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Socket(_)));
    assert!(err.to_string().contains("nothing is listening"), "{err}");
}

#[tokio::test]
async fn a_donation_larger_than_the_cache_is_partly_refused_with_a_reason() {
    let m = Manager::start(&manager_bin(), &["--capacity-bytes", "1500KiB"]);
    let mut d = TestDaemon::register(&m.socket, smollm2(64)).await;
    let outcome = d.donate(&prompt_hashes(0, 0, 0, 3), &[0, 1, 2]).await;
    assert_eq!(
        outcome.retained,
        vec![0, 1],
        "two 720 KiB blocks fit in 1500 KiB"
    );
    assert_eq!(outcome.refused, vec![2]);
    assert_eq!(
        outcome.refused_reason,
        Some(mlxcel_ipc::proto::cache::RefuseReason::Capacity)
    );
    let s = stats(&m.socket).await;
    assert_eq!(s.rejected_blocks.capacity, 1);
    assert_eq!(s.used_bytes, 2 * 737_280);
}

#[tokio::test]
async fn drift_is_reported_then_fixed_by_resync() {
    let m = Manager::start(&manager_bin(), &[]);
    let mut d = TestDaemon::register(&m.socket, smollm2(64)).await;
    d.donate(&prompt_hashes(0, 0, 0, 4), &[0, 1, 2, 3]).await;
    // Simulate a daemon bug: it lost block 2 (and so the chain past it) and holds 9 unbooked.
    d.held.remove(&2);
    d.held.insert(9);
    let reconcile = |socket: std::path::PathBuf| async move {
        let mut admin = AdminClient::connect(&socket, Role::Admin).await.unwrap();
        admin.request(&AdminRequest::Reconcile).await
    };
    let first = tokio::spawn(reconcile(m.socket.clone()));
    while !matches!(d.recv().await, Some(CacheToDaemon::InventoryRequest { .. })) {}
    match first.await.unwrap().unwrap() {
        AdminReply::Reconciled(r) => {
            assert_eq!(r.ledger_bytes, 4 * 737_280);
            assert_eq!(r.inventory_bytes, 4 * 737_280, "same totals...");
            assert_eq!(r.drift_bytes, 2 * 737_280, "...but two blocks differ");
        }
        other => panic!("unexpected {other:?}"),
    }
    // Resync: the unbooked block is released, the missing one and its child leave the ledger.
    d.barrier().await;
    assert!(
        !d.held.contains(&9),
        "the daemon was told to release the block nobody booked"
    );
    let s = stats(&m.socket).await;
    assert_eq!(s.drift_bytes, 2 * 737_280);
    assert_eq!(s.evicted_blocks.drift, 2);
    assert_eq!(s.blocks, 2);
    let second = tokio::spawn(reconcile(m.socket.clone()));
    while !matches!(d.recv().await, Some(CacheToDaemon::InventoryRequest { .. })) {}
    match second.await.unwrap().unwrap() {
        AdminReply::Reconciled(r) => assert_eq!((r.drift_bytes, r.ledger_bytes), (0, 2 * 737_280)),
        other => panic!("unexpected {other:?}"),
    }
}
