//! The admin conversation: one request, one reply, until the client hangs up.

use std::time::Duration;

use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::socket::LocalStream;
use mlxcel_ipc::{Connection, FRAME_DEADLINE, FrameError};

use super::CacheHandle;

/// How long an admin request (a reconcile waits for the daemon) may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// Serves admin requests until the client disconnects or sends an oversized frame.
pub async fn serve(conn: Connection<LocalStream>, handle: CacheHandle) {
    let mut conn = conn.with_frame_deadline(FRAME_DEADLINE);
    loop {
        let reply = match conn.read_frame::<AdminRequest>().await {
            Ok(None) => return,
            Ok(Some(request)) => {
                match tokio::time::timeout(REPLY_TIMEOUT, handle.admin(request)).await {
                    Ok(reply) => reply,
                    Err(_) => AdminReply::Error(WireError::new(
                        ErrorCode::NotFound,
                        "no answer from the daemon in time",
                    )),
                }
            }
            Err(e) => {
                let fatal = !e.is_recoverable();
                let code = if matches!(e, FrameError::TooLarge { .. }) {
                    ErrorCode::FrameTooLarge
                } else {
                    ErrorCode::BadFrame
                };
                tracing::warn!(error = %e, "bad admin frame");
                let _ = conn
                    .write_frame(&AdminReply::Error(WireError::new(code, e.to_string())))
                    .await;
                if fatal {
                    return;
                }
                continue;
            }
        };
        if conn.write_frame(&reply).await.is_err() {
            return;
        }
    }
}
