//! The daemon conversation. The first message must be `Register`; after it, requests go to the
//! cache task and everything for the daemon comes back through one outbound channel, written by a
//! writer task, so replies, releases and inventory requests keep the cache's order.

use mlxcel_ipc::proto::cache::{CacheToDaemon, DaemonToCache, Epoch};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{Connection, FRAME_DEADLINE, FrameError};
use tokio::sync::{mpsc, oneshot};

use super::{CacheHandle, Command};

/// Serves one daemon connection until it closes; its epoch is dropped when it does.
pub async fn serve(conn: Connection<LocalStream>, pid: u32, handle: CacheHandle) {
    let (mut reader, mut writer) = conn.with_frame_deadline(FRAME_DEADLINE).into_split();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<CacheToDaemon>();
    let writer_task = tokio::spawn(async move {
        while let Some(msg) = out_rx.recv().await {
            if let Err(e) = writer.write_frame(&msg).await {
                tracing::warn!(error = %e, "cannot write to the daemon");
                return;
            }
        }
    });

    let mut epoch: Option<Epoch> = None;
    loop {
        let msg = match reader.read_frame::<DaemonToCache>().await {
            Ok(Some(msg)) => msg,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(error = %e, pid, "bad frame from the daemon");
                let code = if matches!(e, FrameError::TooLarge { .. }) {
                    ErrorCode::FrameTooLarge
                } else {
                    ErrorCode::BadFrame
                };
                let _ = out_tx.send(CacheToDaemon::Error {
                    call: None,
                    error: WireError::new(code, e.to_string()),
                });
                if e.is_recoverable() {
                    continue;
                }
                break;
            }
        };
        match (epoch, msg) {
            (None, DaemonToCache::Register { call, geometry }) => {
                let (reply, rx) = oneshot::channel();
                let cmd = Command::Register {
                    pid,
                    geometry,
                    call,
                    outbound: out_tx.clone(),
                    reply,
                };
                if !handle.send(cmd).await {
                    break;
                }
                epoch = rx.await.ok().flatten();
            }
            (None, other) => {
                let call = call_of(&other);
                let error = WireError::new(
                    ErrorCode::BadRequest,
                    "the first daemon message must be Register",
                );
                let _ = out_tx.send(CacheToDaemon::Error { call, error });
            }
            (Some(e), msg) => {
                if !handle.send(Command::Daemon { epoch: e, msg }).await {
                    break;
                }
            }
        }
    }
    if let Some(e) = epoch {
        handle.send(Command::DaemonGone { epoch: e }).await;
    }
    drop(out_tx);
    // Let queued messages (e.g. an error reply) reach the daemon before closing.
    let _ = writer_task.await;
}

fn call_of(msg: &DaemonToCache) -> Option<u64> {
    match msg {
        DaemonToCache::Register { call, .. }
        | DaemonToCache::Acquire { call, .. }
        | DaemonToCache::Donate { call, .. }
        | DaemonToCache::Reclaim { call, .. } => Some(*call),
        DaemonToCache::Unlease { .. }
        | DaemonToCache::ReleaseAck { .. }
        | DaemonToCache::Inventory { .. } => None,
    }
}
