//! Logging as every process sets it up: `tracing` to stderr, filtered by `log-level`, colours
//! only on a terminal, and never a panic when stderr cannot be written (a full disk, a closed
//! pipe): the process keeps serving and the lines are lost.

use std::io::{IsTerminal, Write};

use tracing_subscriber::EnvFilter;

/// Installs the process's logger; `program` names it in the one warning about a bad filter.
pub fn init(program: &str, log_level: &str) {
    let filter = EnvFilter::try_new(log_level).unwrap_or_else(|e| {
        let _ = writeln!(
            std::io::stderr(),
            "{program}: bad log level `{log_level}` ({e}); using info"
        );
        EnvFilter::new("info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // Its fallback for a failed write is eprintln!, which panics when stderr is full.
        .log_internal_errors(false)
        .init();
}
