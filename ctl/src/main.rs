//! `mlxcelctl`: the operator's command line for mlxcel.
//!
//! - [`cache`]: `mlxcelctl cache stats | ls | evict | set-capacity | reconcile`, spoken to the
//!   cache manager over its admin socket.
//! - [`render`]: human tables (sizes with units) for those commands; `--json` prints raw bytes.

mod cache;
mod render;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mlxcelctl: operate a local mlxcel service.
#[derive(Debug, Parser)]
#[command(name = "mlxcelctl", version, about, long_about = None)]
struct Cli {
    /// Directory holding the mlxcel sockets (default: $XDG_RUNTIME_DIR/mlxcel, else /tmp/mlxcel-<uid>).
    #[arg(long, global = true, env = "MLXCEL_SOCKET_DIR", value_name = "DIR")]
    socket_dir: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect and manage the KV prompt cache (talks to mlxcel-cachemgr).
    #[command(subcommand)]
    Cache(cache::CacheCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mlxcelctl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Cache(cmd) => cache::run(cmd, cli.socket_dir.as_deref()).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mlxcelctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
