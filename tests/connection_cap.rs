//! The daemon serves at most `MAX_CONNECTIONS` (64) connections at once; one more is closed
//! before its handshake, and a slot comes free when a connection ends. Before, any local
//! process of ours could open connections without bound.

use mlxcel_ipc::client::{ClientError, connect};
use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FrontendToDaemon};
use mlxcel_ipc::{Limits, Role};
use mlxcel_tests::daemon::Daemon;
use mlxcel_tests::root;

#[tokio::test]
async fn one_connection_over_the_cap_is_closed_and_a_freed_slot_is_reused() {
    let dir = mlxcel_tests::temp_dir("mxn");
    let model = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let _d = Daemon::start(dir.path(), &model, &["--kv-pool-bytes", "64MiB"]);
    let socket = dir.path().join("daemon.sock");
    // Daemon::start's readiness probe connected once; wait until that slot is free again.
    let mut open = Vec::new();
    while open.len() < 64 {
        match connect(&socket, Role::Admin, Limits::default()).await {
            Ok(c) => open.push(c),
            Err(ClientError::Closed | ClientError::Frame(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    let over = connect(&socket, Role::Admin, Limits::default()).await;
    assert!(
        matches!(over, Err(ClientError::Closed | ClientError::Frame(_))),
        "{:?}",
        over.err()
    );
    let mut first = open.remove(0);
    first.write_frame(&FrontendToDaemon::Health).await.unwrap();
    assert!(matches!(
        first.read_frame::<DaemonToFrontend>().await.unwrap(),
        Some(DaemonToFrontend::Health(_))
    ));
    drop(first);
    // The freed slot serves a new connection (the close is noticed asynchronously).
    loop {
        match connect(&socket, Role::Admin, Limits::default()).await {
            Ok(_) => break,
            Err(ClientError::Closed | ClientError::Frame(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
}
