//! The HTTP/1.1 server loop (instead of `axum::serve`) so clients are bounded: at most
//! `max_connections` at once (one more gets a 503 and is closed), a request's headers must
//! arrive within `header_timeout` (else the connection is closed), its body within
//! `body_timeout` (else 408, see [`crate::body`]), and a client that stops reading its response
//! for `write_timeout` is disconnected, which cancels its generation ([`crate::stall_guard`]).
//! Shutdown lets open responses finish for a few seconds, then drops them.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use nix::sys::socket::sockopt;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::stall_guard::StallGuard;

/// How long open responses (streams) may continue after shutdown starts.
const DRAIN: Duration = Duration::from_secs(5);

/// How connections are bounded.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub write_timeout: Duration,
}

/// The most a connection buffers in each direction (request headers must fit).
const MAX_BUFFER: usize = 32 * 1024;

/// What a connection over the cap gets before it is closed.
const BUSY: &str = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
Retry-After: 1\r\nConnection: close\r\nContent-Length: 147\r\n\r\n\
{\"error\":{\"message\":\"too many open connections (--max-connections); retry later\",\
\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}";

/// Serves `app` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    bounds: Bounds,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(bounds.max_connections.max(1)));
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit = bounds.max_connections, "connection refused: too many open");
            tokio::spawn(refuse(stream));
            continue;
        };
        // The kernel's share of a client that does not read: without a cap Linux grows the
        // send buffer to megabytes (tcp_wmem), hundreds of seconds of tokens.
        if let Err(e) = nix::sys::socket::setsockopt(&stream, sockopt::SndBuf, &MAX_BUFFER) {
            tracing::debug!(%peer, error = %e, "cannot cap the send buffer");
        }
        let service = TowerToHyperService::new(app.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(bounds.header_timeout)
            // What one connection may buffer, reading headers or writing a response that its
            // client does not read (hyper's default is ~400 KiB).
            .max_buf_size(MAX_BUFFER)
            .keep_alive(true);
        let io = TokioIo::new(StallGuard::new(stream, bounds.write_timeout));
        let conn = builder.serve_connection(io, service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    drop(permits);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("open responses did not finish within {DRAIN:?}; dropping them");
    }
}

/// Answers a connection over the cap with [`BUSY`] (within a second) and closes it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(BUSY.as_bytes())).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_busy_answer_is_well_formed() {
        let (head, body) = super::BUSY.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "too_many_connections");
    }
}
