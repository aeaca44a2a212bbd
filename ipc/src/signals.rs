//! The stop signals every mlxcel process honours (launchd and systemd send SIGTERM; Ctrl-C
//! sends SIGINT), and the end of its supervisor's lifeline ([`crate::lifeline`]).

/// Returns when SIGTERM or SIGINT arrives, or the supervisor whose lifeline is `lifeline` (see
/// [`crate::lifeline::supervisor_gone`]) is gone (never, if the handlers cannot be installed and
/// there is no supervisor).
pub async fn terminate_or_interrupt(lifeline: Option<i32>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return crate::lifeline::supervisor_gone(lifeline).await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
        _ = crate::lifeline::supervisor_gone(lifeline) => {}
    }
}
