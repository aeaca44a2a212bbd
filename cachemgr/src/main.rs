//! `mlxcel-cachemgr`: see `mlxcel_cachemgr` for what it does and `--help` for its flags.

use std::process::ExitCode;

use mlxcel_cachemgr::config::Args;
use mlxcel_cachemgr::server;
use mlxcel_config::Section;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    // The configuration file reaches the flags through their environment variables.
    let config_file = match mlxcel_config::apply_file_to_env(Section::Cachemgr) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("mlxcel-cachemgr: {e}");
            return ExitCode::from(2);
        }
    };
    let args: Args = mlxcel_config::cli::parse(mlxcel_config::Section::Cachemgr);
    mlxcel_config::logging::init("mlxcel-cachemgr", &args.log_level);
    if let Some(path) = &config_file {
        tracing::info!(file = %path.display(), "configuration file read");
    }

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mlxcel-cachemgr: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        tokio::spawn(stop_on_signal(shutdown.clone()));
        server::run(args.server(), args.policy(), shutdown).await
    });
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("mlxcel-cachemgr: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Cancels `token` on SIGTERM or SIGINT.
async fn stop_on_signal(token: CancellationToken) {
    mlxcel_ipc::signals::terminate_or_interrupt(mlxcel_config::process_env::lifeline_fd()).await;
    token.cancel();
}
