//! `mlxcel-daemon`: the inference worker. See `--help`.

#[cfg(mlxcel_cuda_link)]
mod nvrtc_tap;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mlxcel_config::Section;
use mlxcel_daemon::cache_client::{CacheClient, CacheClientConfig};
use mlxcel_daemon::engine::{self, Command, EngineConfig, Progress};
use mlxcel_daemon::sampling_defaults::OperatorDefaults;
use mlxcel_daemon::server::{self, Phase, Ready, Shared};
use mlxcel_daemon::warm_workers::{self, Machine, Share, Workers};
use mlxcel_ipc::runtime_dir::{CACHEMGR_SOCKET, DAEMON_SOCKET, RuntimeDir};
use mlxcel_ipc::size::parse_size;
use mlxcel_ipc::{Limits, socket};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// mlxcel-daemon: runs a model on MLX (Metal on macOS, CPU on Linux) and serves token-level
/// generation requests on `<socket-dir>/daemon.sock`, keeping its KV cache in a paged pool whose
/// retained blocks are governed by mlxcel-cachemgr (`<socket-dir>/cachemgr.sock`). It serves
/// without prefix reuse while the cache manager is away and registers again when it returns.
#[derive(Debug, Parser)]
#[command(name = "mlxcel-daemon", version, about, long_about)]
struct Args {
    #[arg(long, env = "MLXCEL_MODEL", default_value = "default")]
    model: String,

    #[arg(long, env = "MLXCEL_SOCKET_DIR", value_name = "DIR")]
    socket_dir: Option<PathBuf>,

    #[arg(
        long,
        env = "MLXCEL_DEVICE",
        default_value = "auto",
        value_name = "auto|gpu|cpu"
    )]
    device: mlxcel_daemon::device::DeviceChoice,

    #[arg(long, env = "MLXCEL_KV_POOL_BYTES", default_value = "auto")]
    kv_pool_bytes: String,

    #[arg(long, env = "MLXCEL_CACHE_CAPACITY", default_value = "2GiB", value_parser = parse_size, value_name = "SIZE")]
    cache_capacity: u64,

    #[arg(long, env = "MLXCEL_BLOCK_TOKENS", default_value_t = 32)]
    block_tokens: usize,

    #[arg(long, env = "MLXCEL_PREFILL_CHUNK", default_value_t = 512)]
    prefill_chunk: usize,

    #[arg(long, env = "MLXCEL_MAX_BATCH_SIZE", default_value_t = 8)]
    max_batch_size: usize,

    #[arg(long, env = "MLXCEL_EVENT_BACKLOG", default_value_t = 16384)]
    event_backlog: usize,

    #[arg(long, env = "MLXCEL_DAEMON_MAX_FRAME_BYTES", default_value = "32MiB", value_parser = parse_size)]
    max_frame_bytes: u64,

    #[arg(long, env = "MLXCEL_ACQUIRE_TIMEOUT", default_value = "50ms", value_parser = parse_duration, value_name = "DURATION")]
    acquire_timeout: Duration,

    #[arg(long, env = "MLXCEL_DONATION_TIMEOUT", default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    donation_timeout: Duration,

    #[arg(long, env = "MLXCEL_DEFAULT_TEMPERATURE", value_name = "T")]
    default_temperature: Option<f64>,

    #[arg(long, env = "MLXCEL_DEFAULT_TOP_P", value_name = "P")]
    default_top_p: Option<f64>,

    #[arg(long, env = "MLXCEL_DEFAULT_TOP_K", value_name = "K")]
    default_top_k: Option<u32>,

    #[arg(long, env = "MLXCEL_DEFAULT_MIN_P", value_name = "P")]
    default_min_p: Option<f64>,

    #[arg(long, env = "MLXCEL_DEFAULT_REPETITION_PENALTY", value_name = "X")]
    default_repetition_penalty: Option<f64>,

    #[arg(long, env = "MLXCEL_LOG", default_value = "info")]
    log_level: String,

    #[arg(
        long,
        env = "MLXCEL_WARM_UP_WORKERS",
        default_value = "auto",
        value_name = "auto|N"
    )]
    warm_up_workers: Workers,

    /// Internal: run as a warm-up worker, the jobs of share I of N of the warm-up's PART
    /// (prefill or decode), then exit.
    #[arg(long, hide = true, value_name = "PART:I/N")]
    warm_up_share: Option<Share>,

    /// Internal, for tests of the starting state: hold the warm-up until FILE exists.
    #[arg(long, hide = true, value_name = "FILE")]
    hold_warm_up_until: Option<PathBuf>,

    /// Instead of serving: write the model (a .gguf file) as an MLX / Hugging Face directory
    /// (float32 safetensors, config.json, tokenizer.json with the chat template) into DIR, for
    /// serving the same weights and tokenizer with another MLX server, then exit.
    #[arg(long, value_name = "DIR")]
    export_mlx: Option<PathBuf>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration such as 50ms, 5s or 2m: {e}"))
}

fn resolve_model(arg: &str) -> Result<PathBuf, String> {
    if arg != "default" {
        return Ok(PathBuf::from(arg));
    }
    let name = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    let mut candidates = vec![PathBuf::from(name)];
    if let Ok(exe) = std::env::current_exe()
        && let Some(root) = exe
            .parent()
            .and_then(|d| d.parent())
            .and_then(|d| d.parent())
    {
        candidates.push(root.join(name));
    }
    candidates.into_iter().find(|p| p.exists()).ok_or_else(|| {
        format!(
            "the default model ({name}) is not installed: run `make setup` or pass --model PATH"
        )
    })
}

fn main() -> ExitCode {
    // The configuration file reaches the flags through their environment variables.
    let config_file = match mlxcel_config::apply_file_to_env(Section::Daemon).and_then(|path| {
        mlxcel_config::apply_shared_key_to_env(Section::Cachemgr, "capacity-bytes")?;
        Ok(path)
    }) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("mlxcel-daemon: {e}");
            return ExitCode::from(2);
        }
    };
    let args: Args = mlxcel_config::cli::parse(Section::Daemon);
    // SAFETY: no other thread runs yet (the engine and the I/O runtime start in `run`).
    let jit = unsafe { mlxcel_daemon::jit_cache::JitCache::install() };
    mlxcel_config::logging::init("mlxcel-daemon", &args.log_level);
    match &jit {
        Ok(seeded) => tracing::info!(seeded, "compiled kernels found in the cache"),
        Err(e) => {
            tracing::warn!(error = %e, "no private directory for compiled kernels; using TMPDIR")
        }
    }
    if let Some(path) = &config_file {
        tracing::info!(file = %path.display(), "configuration file read");
    }
    let result = run(args, jit.as_ref().ok().copied());
    mlxcel_daemon::jit_cache::close();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("mlxcel-daemon: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args, cached_kernels: Option<usize>) -> Result<(), String> {
    let model = resolve_model(&args.model)?;
    if let Some(dir) = &args.export_mlx {
        return export(&model, dir);
    }
    let kv_pool_bytes = match args.kv_pool_bytes.as_str() {
        "auto" => None,
        s => Some(parse_size(s).map_err(|e| format!("--kv-pool-bytes: {e}"))?),
    };
    let config = EngineConfig {
        model,
        block_tokens: args.block_tokens.max(1),
        kv_pool_bytes,
        cache_capacity: args.cache_capacity,
        prefill_chunk: args.prefill_chunk.max(1),
        max_running: args.max_batch_size.max(1),
        device: args.device,
        sampling: OperatorDefaults {
            temperature: args.default_temperature,
            top_p: args.default_top_p,
            top_k: args.default_top_k,
            min_p: args.default_min_p,
            repetition_penalty: args.default_repetition_penalty,
        },
        warm_up_share: args.warm_up_share.unwrap_or_default(),
        progress: Progress::default(),
    };
    if let Some(share) = args.warm_up_share {
        let _span = tracing::info_span!("warm_up_worker", %share).entered();
        return engine::warm_only(&config).map_err(|e| e.to_string());
    }
    let dir = RuntimeDir::new(args.socket_dir.as_deref());
    dir.ensure().map_err(|e| e.to_string())?;
    let daemon_socket = dir.socket(DAEMON_SOCKET).map_err(|e| e.to_string())?;
    let cachemgr_socket = dir.socket(CACHEMGR_SOCKET).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let sockets = (daemon_socket, cachemgr_socket);
    let result = runtime.block_on(serve(args, config, sockets, cached_kernels));
    // A stop while the engine still loads leaves its thread behind: the process ends anyway.
    runtime.shutdown_background();
    result
}

/// Listens at once (answering "starting" while the engine loads and warms up), starts the
/// engine, then serves until a stop signal.
async fn serve(
    args: Args,
    mut config: EngineConfig,
    (daemon_socket, cachemgr_socket): (PathBuf, PathBuf),
    cached_kernels: Option<usize>,
) -> Result<(), String> {
    let listener = socket::bind(&daemon_socket)
        .await
        .map_err(|e| e.to_string())?;
    let (phase, phase_rx) = watch::channel(Phase::Starting("loading the model".into()));
    let phase = Arc::new(phase);
    let reporter = phase.clone();
    config.progress = Progress::new(move |stage| {
        reporter.send_replace(Phase::Starting(stage.to_string()));
    })
    .holding_until(args.hold_warm_up_until.clone());
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let limits = Limits::new(usize::try_from(args.max_frame_bytes).unwrap_or(usize::MAX));
    let shared = Shared {
        phase: phase_rx,
        limits,
        block_tokens: config.block_tokens,
        acquire_timeout: args.acquire_timeout,
        event_backlog: args.event_backlog,
    };
    let server = tokio::spawn(server::serve(listener, shared, shutdown.clone()));
    tracing::info!(socket = %daemon_socket.display(), "daemon listening; starting");
    let workers = args.warm_up_workers;
    let start = tokio::task::spawn_blocking(move || {
        if let Some(cached_kernels) = cached_kernels {
            config.progress.report("warm-up workers building kernels");
            start_warm_up_workers(workers, &config, cached_kernels);
        }
        tracing::info!(model = %config.model.display(), "loading the model");
        engine::spawn(config)
    });
    let (engine_tx, started, engine_thread) = tokio::select! {
        _ = shutdown.cancelled() => {
            tracing::info!("stopped while starting");
            return Ok(());
        }
        started = start => started
            .map_err(|e| format!("the engine's start failed: {e}"))?
            .map_err(|e| e.to_string())?,
    };
    let cache = attach_cache(&engine_tx, &started, cachemgr_socket, args.donation_timeout);
    let model_id = started.info.model_id.clone();
    phase.send_replace(Phase::Ready(Arc::new(Ready {
        engine: engine_tx.clone(),
        info: Arc::new(started.info),
        cache,
        vitals: started.vitals,
    })));
    tracing::info!(socket = %daemon_socket.display(), model = %model_id, "daemon serving");
    let _ = server.await;
    let _ = engine_tx.send(Command::Shutdown);
    let joined = tokio::task::spawn_blocking(move || engine_thread.join());
    if tokio::time::timeout(Duration::from_secs(15), joined)
        .await
        .is_err()
    {
        tracing::warn!("the engine did not stop within 15 s");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Starts the cache manager's client for the started engine and hands it over, with its orders.
fn attach_cache(
    engine: &std::sync::mpsc::Sender<Command>,
    started: &engine::Started,
    socket: PathBuf,
    donation_timeout: Duration,
) -> CacheClient {
    let (orders_tx, mut orders_rx) = tokio::sync::mpsc::unbounded_channel();
    let cache = CacheClient::spawn(
        CacheClientConfig {
            socket,
            geometry: started.geometry.clone(),
            max_backoff: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            donation_timeout,
        },
        orders_tx,
    );
    let handle = tokio::runtime::Handle::current();
    let _ = engine.send(Command::AttachCache(cache.clone(), handle));
    let forward = engine.clone();
    tokio::spawn(async move {
        while let Some(order) = orders_rx.recv().await {
            if forward.send(Command::Order(order)).is_err() {
                return;
            }
        }
    });
    cache
}

/// Runs the warm-up workers `setting` asks for on this machine ([`warm_workers`]) and takes the
/// kernels they built from the cache.
fn start_warm_up_workers(setting: Workers, config: &EngineConfig, cached_kernels: usize) {
    if setting == Workers::Exactly(0) {
        return;
    }
    let Ok(placement) = mlxcel_daemon::device::Placement::choose(config.device) else {
        return; // the engine reports it
    };
    let machine = Machine {
        device: placement.kind,
        cached_kernels,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        weights_bytes: warm_workers::weights_bytes(&config.model),
        free_bytes: mlxcel_daemon::device_memory::PoolMemory::of(&placement).usable,
    };
    let n = setting.count(machine);
    if n == 0 {
        return;
    }
    let done = warm_workers::run(n);
    let kernels = mlxcel_daemon::jit_cache::reseed();
    tracing::info!(
        workers = n,
        done,
        kernels,
        "warm-up workers done: compiled kernels taken from the cache"
    );
}

/// `--export-mlx`: the GGUF model as a float32 MLX directory.
fn export(model: &std::path::Path, dir: &std::path::Path) -> Result<(), String> {
    let g = mlxcel_daemon::model::gguf::load(model).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let options = mlxcel_daemon::export::ExportOptions::default();
    mlxcel_daemon::export::write_mlx_dir(&g, dir, &options).map_err(|e| e.to_string())?;
    tracing::info!(dir = %dir.display(), "model written as an MLX directory");
    Ok(())
}

/// Cancels `token` on SIGTERM or SIGINT.
async fn stop_on_signal(token: CancellationToken) {
    mlxcel_ipc::signals::terminate_or_interrupt(mlxcel_config::process_env::lifeline_fd()).await;
    token.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_match_the_configuration_table() {
        use clap::CommandFactory;
        let result =
            mlxcel_config::check::matches_command(&Args::command(), mlxcel_config::Section::Daemon);
        assert_eq!(result, Ok(()));
    }
}
