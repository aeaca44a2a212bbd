//! The supervisor's dealings with one child process: signals, how it ended, its output.

use std::process::ExitStatus;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

pub(super) fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

pub(super) fn describe(status: &std::io::Result<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => s.to_string(),
        },
        Err(e) => format!("wait failed: {e}"),
    }
}

/// Copies a child's output to our stderr, each line prefixed with its name.
pub(super) async fn forward(stream: impl AsyncRead + Unpin, name: &'static str) {
    use std::io::Write;
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    // Bytes, not `lines()`: a line that is not UTF-8 must not end the forwarding (the child
    // would then block on its unread pipe); it is shown with replacement characters.
    while reader
        .read_until(b'\n', &mut line)
        .await
        .is_ok_and(|n| n > 0)
    {
        let text = String::from_utf8_lossy(&line);
        // Never fails (eprintln! would panic on a full disk or a closed stderr).
        let _ = writeln!(
            std::io::stderr(),
            "[{name}] {}",
            text.trim_end_matches(['\n', '\r'])
        );
        line.clear();
    }
}
