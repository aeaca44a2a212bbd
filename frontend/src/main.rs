//! `mlxcel-frontend`: see `--help`.

use mlxcel_frontend::gate::{self, Gate};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use mlxcel_config::Section;
use mlxcel_frontend::cache_admin::CacheAdmin;
use mlxcel_frontend::config::Args;
use mlxcel_frontend::daemon_link::{DaemonLink, LinkConfig};
use mlxcel_frontend::metrics::Metrics;
use mlxcel_frontend::queue::WaitQueue;
use mlxcel_frontend::state::AppState;
use mlxcel_frontend::{http_server, routes};
use mlxcel_ipc::Limits;
use mlxcel_ipc::runtime_dir::{CACHEMGR_SOCKET, DAEMON_SOCKET, RuntimeDir};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    // The configuration file reaches the flags through their environment variables.
    let config_file = match mlxcel_config::apply_file_to_env(Section::Frontend) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("mlxcel-frontend: {e}");
            return ExitCode::from(2);
        }
    };
    let args: Args = mlxcel_config::cli::parse(mlxcel_config::Section::Frontend);
    mlxcel_config::logging::init("mlxcel-frontend", &args.log_level);
    if let Some(path) = &config_file {
        tracing::info!(file = %path.display(), "configuration file read");
    }
    for flag in ["--api-key", "--admin-key"] {
        if std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}="))) {
            tracing::warn!(
                "{flag} on the command line is visible to every local user in `ps`; use its \
                 environment variable, the configuration file or --api-keys-file"
            );
        }
    }
    // Two workers: the front end is mostly waiting, and the daemon needs the cores.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(run(args)),
        Err(e) => Err(format!("cannot start the runtime: {e}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("mlxcel-frontend: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let addr = args.bind_addr()?;
    let dir = RuntimeDir::new(args.socket_dir.as_deref());
    // Ours alone (0700, owned by us) before anything connects through it: another user who
    // created it first would receive every prompt.
    dir.ensure().map_err(|e| e.to_string())?;
    let daemon_socket = dir.socket(DAEMON_SOCKET).map_err(|e| e.to_string())?;
    let cachemgr_socket = dir.socket(CACHEMGR_SOCKET).map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", addr.0, addr.1))?;
    let shutdown = CancellationToken::new();
    let daemon = DaemonLink::spawn(
        LinkConfig {
            socket: daemon_socket,
            limits: Limits::new(usize::try_from(args.max_frame_bytes).unwrap_or(usize::MAX)),
            max_backoff: Duration::from_secs(1),
        },
        shutdown.clone(),
    );
    let state = AppState {
        daemon,
        cache: CacheAdmin {
            socket: cachemgr_socket,
            timeout: Duration::from_secs(2),
        },
        queue: WaitQueue::new(args.max_queue as usize),
        metrics: Arc::new(Metrics::default()),
        keys: Arc::new(args.keys()?),
        gate: Arc::new(Gate::new(
            addr.0,
            gate::list(args.allowed_hosts.as_deref()),
            gate::list(args.allowed_origins.as_deref()),
        )),
        max_body_bytes: usize::try_from(args.max_body_bytes).unwrap_or(usize::MAX),
        body_timeout: args.body_timeout,
        text: mlxcel_frontend::state::TextOptions {
            reasoning_inline: args.reasoning_inline,
            strip_billing_header: args.strip_billing_header,
        },
        recall: Arc::default(),
    };
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(address = %local, auth = state.keys.required(), "front end listening");
    let app = routes::router(state);
    let stop = shutdown.clone();
    tokio::spawn(async move {
        mlxcel_ipc::signals::terminate_or_interrupt(mlxcel_config::process_env::lifeline_fd())
            .await;
        tracing::info!("stopping");
        stop.cancel();
    });
    let bounds = http_server::Bounds {
        max_connections: args.max_connections as usize,
        header_timeout: args.header_timeout,
        write_timeout: args.write_timeout,
    };
    http_server::serve(listener, app, bounds, shutdown).await;
    tracing::info!("stopped");
    Ok(())
}
