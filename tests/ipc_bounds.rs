//! Red team, IPC bounds: a front end that stops reading its daemon connection is closed and its
//! requests cancelled once `--event-backlog` events have piled up (before, the daemon queued
//! every token of every request without bound), and a peer that sends half a frame and stalls
//! is cut off after the frame deadline, by the daemon and by the cache manager (before, it held
//! the connection for ever). A client that asks question after question and never reads the
//! answers is closed too (before, the answers queued without bound).

use std::time::{Duration, Instant};

use mlxcel_ipc::proto::daemon::DaemonToFrontend;
use mlxcel_ipc::{FRAME_DEADLINE, Limits, Role, client::connect};
use mlxcel_tests::daemon::{Daemon, frontend, greedy_generate, health};
use mlxcel_tests::manager::Manager;
use mlxcel_tests::{bin, default_model, fixtures, ids};

#[tokio::test]
async fn a_front_end_that_stops_reading_is_closed_and_its_requests_are_cancelled() {
    let dir = mlxcel_tests::temp_dir("mxb");
    let _d = Daemon::start(
        dir.path(),
        &default_model(),
        &["--kv-pool-bytes", "64MiB", "--event-backlog", "32"],
    );
    let chats = fixtures();
    let prompt = ids(&chats["chats"][0]["prompt_ids"]);
    let mut stuck = frontend(dir.path()).await;
    const REQUESTS: u64 = 8;
    const MAX_TOKENS: u32 = 1500;
    for id in 1..=REQUESTS {
        let req = greedy_generate(id, prompt.clone(), MAX_TOKENS);
        stuck.write_frame(&req).await.unwrap();
    }
    // The stuck front end reads nothing from here on.
    let mut admin = connect(
        &dir.path().join("daemon.sock"),
        Role::Admin,
        Limits::default(),
    )
    .await
    .unwrap();
    let limit = Duration::from_secs(600);
    let began = Instant::now();
    let mut seen_running = false;
    let cancelled_at = loop {
        let h = health(&mut admin).await;
        seen_running |= h.running > 0;
        if seen_running && h.running == 0 && h.waiting == 0 {
            assert_eq!(
                h.pool.free_blocks, h.pool.total_blocks,
                "every block given back"
            );
            break began.elapsed();
        }
        assert!(
            began.elapsed() < limit,
            "still running after {limit:?}: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // What reached the socket before the daemon gave up, then the end of the connection.
    let (mut tokens, mut done) = (0u64, 0u64);
    loop {
        match stuck.read_frame::<DaemonToFrontend>().await {
            Ok(Some(DaemonToFrontend::Token { .. })) => tokens += 1,
            Ok(Some(DaemonToFrontend::Done { .. } | DaemonToFrontend::Failed { .. })) => done += 1,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    eprintln!(
        "ipc_bounds: cancelled after {cancelled_at:?}; the stuck front end had {tokens} tokens \
         and {done} ends waiting on its socket"
    );
    assert!(done < REQUESTS, "the requests were cancelled, not finished");
    assert!(tokens < REQUESTS * u64::from(MAX_TOKENS));
    // The daemon still serves.
    let h = health(&mut admin).await;
    assert_eq!(h.running, 0);
}

/// Connects with `role`, sends half a length prefix, and says how long the peer took to close.
async fn half_a_frame(socket: &std::path::Path, role: Role) -> Duration {
    let mut c = connect(socket, role, Limits::default()).await.unwrap();
    c.writer().write_raw(&[16, 0]).await.unwrap();
    let began = Instant::now();
    let bound = FRAME_DEADLINE * 6;
    loop {
        let left = bound.saturating_sub(began.elapsed());
        match tokio::time::timeout(left, c.reader().read_payload()).await {
            // An error frame naming the stall may come first; the close follows.
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None) | Err(_)) => return began.elapsed(),
            Err(_) => panic!("the connection was still open after {bound:?}"),
        }
    }
}

#[tokio::test]
async fn half_a_frame_is_cut_off_after_the_frame_deadline() {
    let dir = mlxcel_tests::temp_dir("mxh");
    let _d = Daemon::start(dir.path(), &default_model(), &["--kv-pool-bytes", "64MiB"]);
    let took = half_a_frame(&dir.path().join("daemon.sock"), Role::Frontend).await;
    eprintln!("ipc_bounds: the daemon closed a stalled frame after {took:?}");
    assert!(
        took >= FRAME_DEADLINE / 2,
        "closed before the deadline: {took:?}"
    );

    let manager = Manager::start(&bin("mlxcel-cachemgr"), &[]);
    let took = half_a_frame(&manager.socket, Role::Admin).await;
    eprintln!("ipc_bounds: the cache manager closed a stalled frame after {took:?}");
    assert!(
        took >= FRAME_DEADLINE / 2,
        "closed before the deadline: {took:?}"
    );
}

#[tokio::test]
async fn a_client_that_asks_and_never_reads_its_answers_is_closed() {
    let dir = mlxcel_tests::temp_dir("mxa");
    let _d = Daemon::start(dir.path(), &default_model(), &["--kv-pool-bytes", "64MiB"]);
    let socket = dir.path().join("daemon.sock");
    let mut greedy = connect(&socket, Role::Admin, Limits::default())
        .await
        .unwrap();
    const ASKED: u32 = 20_000;
    let mut sent = 0;
    while sent < ASKED
        && greedy
            .write_frame(&mlxcel_ipc::proto::daemon::FrontendToDaemon::Health)
            .await
            .is_ok()
    {
        sent += 1;
    }
    let mut answered = 0u32;
    while let Ok(Some(_)) = greedy.read_frame::<DaemonToFrontend>().await {
        answered += 1;
    }
    eprintln!("ipc_bounds: {sent} health questions sent, {answered} answered, then closed");
    assert!(answered < ASKED, "the daemon queued every answer");
    // The daemon still serves others.
    let mut other = connect(&socket, Role::Admin, Limits::default())
        .await
        .unwrap();
    assert_eq!(health(&mut other).await.running, 0);
}
