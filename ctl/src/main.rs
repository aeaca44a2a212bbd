//! `mlxcelctl`: the operator's command line for mlxcel.
//!
//! - [`cache`]: `mlxcelctl cache stats | ls | evict | set-capacity | reconcile`, spoken to the
//!   cache manager over its admin socket; [`render`]: its human tables.
//! - [`supervise`]: `mlxcelctl serve`, the three processes in the foreground under a supervisor.
//! - [`service`]: the one typed description of the services, rendered as launchd agents and
//!   systemd user units; [`manage`]: `install | uninstall | start | stop | restart`.
//! - [`status`]: `mlxcelctl status`.
//! - [`config_cmd`]: `mlxcelctl config show`; [`settings`]: the settings mlxcelctl itself uses.

mod cache;
mod config_cmd;
mod manage;
mod render;
mod service;
mod settings;
mod status;
mod supervise;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use manage::{Action, ManageArgs};

/// mlxcelctl: run and operate a local mlxcel service (cache manager, inference daemon, HTTP
/// front end). Settings come from flags, then MLXCEL_* environment variables, then the
/// configuration file ($MLXCEL_CONFIG, else ~/.config/mlxcel/config.toml), then defaults.
#[derive(Debug, Parser)]
#[command(name = "mlxcelctl", version, about, long_about)]
struct Cli {
    /// Directory holding the mlxcel sockets (default: the file's socket-dir, else
    /// $XDG_RUNTIME_DIR/mlxcel, else /tmp/mlxcel-<uid>).
    #[arg(long, global = true, env = "MLXCEL_SOCKET_DIR", value_name = "DIR")]
    socket_dir: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the cache manager, daemon and front end in the foreground, restarting any that
    /// crashes; Ctrl-C or SIGTERM stops all three.
    Serve(supervise::ServeArgs),
    /// Each process up or down, the model, the pool and the cache.
    Status(status::StatusArgs),
    /// Inspect and manage the KV prompt cache (talks to mlxcel-cachemgr).
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// The effective configuration.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// Install the three services as launchd agents (macOS) or systemd user units (Linux) and
    /// start them.
    Install(ManageArgs),
    /// Stop the services and remove their files.
    Uninstall(ManageArgs),
    /// Start the installed services.
    Start(ManageArgs),
    /// Stop the installed services.
    Stop(ManageArgs),
    /// Restart the installed services.
    Restart(ManageArgs),
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let socket_flag = matches.value_source("socket_dir") == Some(ValueSource::CommandLine);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
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
        let flag = cli.socket_dir.as_deref().filter(|_| socket_flag);
        let socket_dir = settings::socket_dir(cli.socket_dir.as_deref())?;
        let dir = socket_dir.as_deref();
        match cli.command {
            Command::Serve(args) => supervise::run(args, dir).await,
            Command::Status(args) => status::run(args, dir).await,
            Command::Cache(cmd) => cache::run(cmd, dir).await,
            Command::Config(cmd) => config_cmd::run(cmd, flag),
            Command::Install(a) => manage::run(Action::Install, &a, dir),
            Command::Uninstall(a) => manage::run(Action::Uninstall, &a, dir),
            Command::Start(a) => manage::run(Action::Start, &a, dir),
            Command::Stop(a) => manage::run(Action::Stop, &a, dir),
            Command::Restart(a) => manage::run(Action::Restart, &a, dir),
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
