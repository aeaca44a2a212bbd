//! The stop signals every mlxcel process honours (launchd and systemd send SIGTERM; Ctrl-C
//! sends SIGINT).

/// Returns when SIGTERM or SIGINT arrives (never, if the handlers cannot be installed).
pub async fn terminate_or_interrupt() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
