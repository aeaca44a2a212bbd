//! `mlxcelctl status`: each process up, starting (the daemon, loading its model or warming up,
//! with its stage) or down (pid, uptime, socket or URL), the model, the pool and the cache, asked
//! of the processes themselves; `--json` for scripts. Exits 1 unless every process serves.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use mlxcel_ipc::client::{AdminClient, connect_with_pid};
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, CacheStats};
use mlxcel_ipc::proto::daemon::{DaemonHealth, DaemonToFrontend, FrontendToDaemon, ModelInfo};
use mlxcel_ipc::runtime_dir::{CACHEMGR_SOCKET, DAEMON_SOCKET, RuntimeDir};
use mlxcel_ipc::size::format_size;
use mlxcel_ipc::{Limits, Role};
use serde::Serialize;

use crate::settings;

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Print JSON (raw integers) instead of a table.
    #[arg(long)]
    pub json: bool,
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One process.
#[derive(Debug, Serialize)]
pub struct ProcessStatus {
    pub name: &'static str,
    pub up: bool,
    pub pid: Option<u32>,
    pub uptime_secs: Option<u64>,
    /// Its socket, or the front end's URL.
    pub address: String,
    pub error: Option<String>,
    /// What it does while it starts (the daemon), when it does not serve yet.
    pub starting: Option<String>,
}

/// What the daemon answered.
enum DaemonAnswer {
    Serving(u32, Box<(ModelInfo, DaemonHealth)>),
    Starting(u32, String),
}

#[derive(Debug, Serialize)]
pub struct ModelSummary {
    pub id: String,
    pub context_length: u32,
}

/// Everything `status` reports.
#[derive(Debug, Serialize)]
pub struct Status {
    pub socket_dir: PathBuf,
    pub processes: Vec<ProcessStatus>,
    pub model: Option<ModelSummary>,
    pub daemon: Option<DaemonHealth>,
    pub cache: Option<CacheStats>,
}

pub async fn run(args: StatusArgs, socket_dir: Option<&Path>) -> anyhow::Result<()> {
    let dir = RuntimeDir::new(socket_dir);
    let frontend = settings::frontend_addr()?;
    let status = gather(dir.path(), frontend).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", render(&status));
    }
    let down: Vec<&str> = status
        .processes
        .iter()
        .filter(|p| !p.up)
        .map(|p| p.name)
        .collect();
    if !down.is_empty() {
        bail!("down: {}", down.join(", "));
    }
    if let Some(p) = status.processes.iter().find(|p| p.starting.is_some()) {
        bail!("starting: {}", p.name);
    }
    Ok(())
}

async fn gather(dir: &Path, frontend: SocketAddr) -> Status {
    let cache_socket = dir.join(CACHEMGR_SOCKET);
    let daemon_socket = dir.join(DAEMON_SOCKET);
    let (cache, daemon, front) = tokio::join!(
        timed(ask_cache(&cache_socket)),
        timed(ask_daemon(&daemon_socket)),
        timed(ask_frontend(frontend)),
    );
    let mut processes = Vec::new();
    let mut entry = |name, address: String, result: &Result<u32, String>, starting| {
        let pid = result.as_ref().ok().copied();
        processes.push(ProcessStatus {
            name,
            up: result.is_ok(),
            pid,
            uptime_secs: pid.and_then(uptime_secs),
            address,
            error: result.as_ref().err().cloned(),
            starting,
        });
    };
    let cache_pid = cache.as_ref().map(|(pid, _)| *pid).map_err(Clone::clone);
    let (daemon_pid, stage) = match &daemon {
        Ok(DaemonAnswer::Serving(pid, _)) => (Ok(*pid), None),
        Ok(DaemonAnswer::Starting(pid, stage)) => (Ok(*pid), Some(stage.clone())),
        Err(e) => (Err(e.clone()), None),
    };
    entry(
        "cachemgr",
        cache_socket.display().to_string(),
        &cache_pid,
        None,
    );
    entry(
        "daemon",
        daemon_socket.display().to_string(),
        &daemon_pid,
        stage,
    );
    entry("frontend", format!("http://{frontend}"), &front, None);
    let (model, health) = match daemon {
        Ok(DaemonAnswer::Serving(_, answer)) => {
            let (info, health) = *answer;
            (
                Some(ModelSummary {
                    id: info.model_id,
                    context_length: info.context_length,
                }),
                Some(health),
            )
        }
        _ => (None, None),
    };
    Status {
        socket_dir: dir.to_path_buf(),
        processes,
        model,
        daemon: health,
        cache: cache.ok().map(|(_, s)| s),
    }
}

async fn timed<T>(f: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(PROBE_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")))
}

async fn ask_cache(socket: &Path) -> Result<(u32, CacheStats), String> {
    let mut client = AdminClient::connect(socket, Role::Admin)
        .await
        .map_err(|e| e.to_string())?;
    match client.request(&AdminRequest::Stats).await {
        Ok(AdminReply::Stats(s)) => Ok((client.server_pid, *s)),
        Ok(other) => Err(format!("unexpected reply {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

async fn ask_daemon(socket: &Path) -> Result<DaemonAnswer, String> {
    let (mut conn, pid) = connect_with_pid(socket, Role::Admin, Limits::new(64 << 20))
        .await
        .map_err(|e| e.to_string())?;
    let err = |e: mlxcel_ipc::FrameError| e.to_string();
    conn.write_frame(&FrontendToDaemon::Info)
        .await
        .map_err(err)?;
    conn.write_frame(&FrontendToDaemon::Health)
        .await
        .map_err(err)?;
    let (mut info, mut health) = (None, None);
    while info.is_none() || health.is_none() {
        match conn.read_frame::<DaemonToFrontend>().await.map_err(err)? {
            Some(DaemonToFrontend::Info(i)) => info = Some(*i),
            Some(DaemonToFrontend::Health(h)) => health = Some(h),
            Some(DaemonToFrontend::Starting { stage }) => {
                return Ok(DaemonAnswer::Starting(pid, stage));
            }
            Some(_) => {}
            None => return Err("the daemon closed the connection".into()),
        }
    }
    match (info, health) {
        (Some(i), Some(h)) => Ok(DaemonAnswer::Serving(pid, Box::new((i, h)))),
        _ => Err("no answer".into()),
    }
}

/// The front end's pid, from its `/health`.
pub(crate) async fn ask_frontend(addr: SocketAddr) -> Result<u32, String> {
    use http_body_util::{BodyExt, Empty};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let uri: hyper::Uri = format!("http://{addr}/health")
        .parse()
        .map_err(|e| format!("{addr}: {e}"))?;
    let response = client
        .get(uri)
        .await
        .map_err(|e| format!("nothing answers on {addr}: {e}"))?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{addr}: {e}"))?
        .to_bytes();
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|_| format!("{addr} did not answer as mlxcel"))?;
    v["processes"]["frontend"]["pid"]
        .as_u64()
        .map(|p| p as u32)
        .ok_or_else(|| format!("{addr} did not answer as mlxcel"))
}

/// Seconds since `pid` started, from `ps -o etime=` (`[[dd-]hh:]mm:ss`, on Linux and macOS).
fn uptime_secs(pid: u32) -> Option<u64> {
    let out = std::process::Command::new("ps")
        .args(["-o", "etime=", "-p", &pid.to_string()])
        .output()
        .ok()?;
    parse_etime(String::from_utf8_lossy(&out.stdout).trim())
}

fn parse_etime(text: &str) -> Option<u64> {
    let (days, rest) = match text.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, r),
        None => (0, text),
    };
    let mut secs = 0;
    for part in rest.split(':') {
        secs = secs * 60 + part.parse::<u64>().ok()?;
    }
    Some(days * 86_400 + secs)
}

fn render(s: &Status) -> String {
    let mut out = String::new();
    for p in &s.processes {
        let state = match (p.up, &p.starting) {
            (true, Some(_)) => "starting",
            (true, None) => "up",
            (false, _) => "down",
        };
        let pid = p.pid.map_or("-".to_string(), |p| p.to_string());
        let uptime = p.uptime_secs.map_or("-".to_string(), |u| {
            humantime::format_duration(Duration::from_secs(u)).to_string()
        });
        out.push_str(&format!(
            "{:<9} {:<5} pid {:<8} up {:<12} {}\n",
            p.name, state, pid, uptime, p.address
        ));
        if let Some(e) = &p.error {
            out.push_str(&format!("          {e}\n"));
        }
        if let Some(stage) = &p.starting {
            out.push_str(&format!("          {stage}\n"));
        }
    }
    if let Some(m) = &s.model {
        out.push_str(&format!(
            "model     {} (context {} tokens)\n",
            m.id, m.context_length
        ));
    }
    if let Some(h) = &s.daemon {
        let p = &h.pool;
        out.push_str(&format!(
            "pool      ceiling {} blocks of {} ({} resident): {} free, {} held for the cache; {} running, {} waiting\n",
            p.total_blocks,
            format_size(p.block_bytes),
            format_size(p.pool_bytes_measured),
            p.free_blocks,
            p.cache_blocks,
            h.running,
            h.waiting
        ));
        let [cache, running, free] = p.kv_resident_split();
        out.push_str(&format!(
            "memory    KV resident {} ({} cache, {} running, {} free not yet returned), measured {} (MLX active - weights); weights {}, MLX buffer cache {}, daemon RSS {}\n",
            format_size(cache + running + free),
            format_size(cache),
            format_size(running),
            format_size(free),
            format_size(p.kv_measured_bytes()),
            format_size(p.weights_bytes),
            format_size(p.mlx_cache_bytes),
            format_size(p.process_resident_bytes)
        ));
    }
    if let Some(c) = &s.cache {
        out.push_str(&format!(
            "cache     {} used of {} capacity ({} blocks, {} entries), {} hits / {} misses\n",
            format_size(c.used_bytes),
            format_size(c.capacity_bytes),
            c.blocks,
            c.entries,
            c.prefix_hits,
            c.prefix_misses
        ));
    }
    out.push_str(&format!("sockets   {}\n", s.socket_dir.display()));
    out
}

#[cfg(test)]
mod tests {
    use super::parse_etime;

    #[test]
    fn ps_elapsed_times_parse() {
        assert_eq!(parse_etime("00:07"), Some(7));
        assert_eq!(parse_etime("12:34"), Some(754));
        assert_eq!(parse_etime("01:02:03"), Some(3723));
        assert_eq!(parse_etime("2-01:02:03"), Some(2 * 86_400 + 3723));
        assert_eq!(parse_etime(""), None);
    }
}
