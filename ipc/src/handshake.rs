//! The server side of the handshake, shared by every mlxcel server: peer uid check, then
//! `Hello` → `Welcome` or `Refused`.

use std::time::Duration;

use crate::hello::check_hello;
use crate::socket::{LocalStream, check_peer};
use crate::{Connection, FrameError, Hello, HelloReply, Limits, PROTOCOL_VERSION, Role};

/// Accepts a client: refuses other users, then reads its `Hello` within `timeout`.
/// Returns None (after telling the client why, where possible) when the client is refused.
pub async fn accept(
    stream: LocalStream,
    limits: Limits,
    timeout: Duration,
    roles: &[Role],
) -> Option<(Connection<LocalStream>, Hello)> {
    let peer = check_peer(&stream);
    let mut conn = Connection::new(stream, limits);
    if let Err(reason) = peer {
        tracing::warn!(%reason, "refusing connection from another user");
        let _ = conn.write_frame(&HelloReply::Refused { reason }).await;
        return None;
    }
    let refusal = match tokio::time::timeout(timeout, conn.reader().read_payload()).await {
        Err(_) => "no Hello within the handshake timeout".to_string(),
        Ok(Ok(None)) => return None,
        Ok(Err(e @ FrameError::TooLarge { .. })) => format!("handshake frame refused: {e}"),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "connection failed during handshake");
            return None;
        }
        Ok(Ok(Some(payload))) => match check_hello(payload, roles) {
            Ok(hello) => {
                let welcome = HelloReply::Welcome {
                    protocol_version: PROTOCOL_VERSION,
                    server_pid: std::process::id(),
                };
                if conn.write_frame(&welcome).await.is_err() {
                    return None;
                }
                tracing::debug!(pid = hello.pid, role = ?hello.role, "client connected");
                return Some((conn, hello));
            }
            Err(reason) => reason,
        },
    };
    tracing::warn!(reason = %refusal, "handshake refused");
    let _ = conn
        .write_frame(&HelloReply::Refused { reason: refusal })
        .await;
    None
}
