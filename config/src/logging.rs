//! Logging as every process sets it up: `tracing` to stderr, filtered by `log-level`, colours
//! only on a terminal, and never a panic when stderr cannot be written (a full disk, a closed
//! pipe): the process keeps serving and the lines are lost.
//!
//! A panic on any thread ends the process with exit status 101 after it is logged: a thread that
//! died (the engine, a tokio task, whose panics the runtime would otherwise swallow) must never
//! leave a live-looking process that does nothing. `mlxcelctl serve`, launchd and systemd
//! restart it.

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
    exit_on_panic(program);
}

/// Exit status of a process ended by a panic (Rust's own for a panicking main thread).
pub const PANIC_EXIT: i32 = 101;

/// Makes a panic on any thread log itself and end the process with [`PANIC_EXIT`].
fn exit_on_panic(program: &str) {
    let program = program.to_string();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        tracing::error!(thread = name, "{info}; exiting");
        let _ = writeln!(
            std::io::stderr(),
            "{program}: a panic on thread `{name}`; exiting"
        );
        std::process::exit(PANIC_EXIT);
    }));
}
