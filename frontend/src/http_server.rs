//! The HTTP/1.1 server loop (instead of `axum::serve`) so slow clients are bounded: a request's
//! headers must arrive within `header_timeout` (else the connection is closed), and its body
//! within `body_timeout` (else 408, see [`crate::body`]). Shutdown lets open responses finish
//! for a few seconds, then drops them.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long open responses (streams) may continue after shutdown starts.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
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
        let service = TowerToHyperService::new(app.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(true);
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("open responses did not finish within {DRAIN:?}; dropping them");
    }
}
