//! The settings `mlxcelctl` itself needs, resolved like the processes resolve theirs
//! (flag > environment > configuration file > default).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use mlxcel_config::{ConfigFile, Section, Setting};

/// The effective settings of `process` (no flags: those belong to the process).
pub fn effective(process: Section) -> anyhow::Result<Vec<Setting>> {
    let file = ConfigFile::load()?;
    let env = |v: &str| std::env::var(v).ok();
    Ok(mlxcel_config::effective(process, &[], &env, file.as_ref()))
}

fn value(settings: &[Setting], key: &str) -> Option<String> {
    settings
        .iter()
        .find(|s| s.key == key)
        .and_then(|s| s.value.clone())
}

/// The socket directory: `--socket-dir` / `MLXCEL_SOCKET_DIR` (`flag`), else the file's
/// `socket-dir`, else None (the platform default).
pub fn socket_dir(flag: Option<&Path>) -> anyhow::Result<Option<PathBuf>> {
    if let Some(dir) = flag {
        return Ok(Some(dir.to_path_buf()));
    }
    Ok(value(&effective(Section::Common)?, "socket-dir").map(PathBuf::from))
}

/// Where the front end listens (an unspecified host is reached on loopback).
pub fn frontend_addr() -> anyhow::Result<SocketAddr> {
    let settings = effective(Section::Frontend)?;
    let port: u16 = value(&settings, "port")
        .unwrap_or_default()
        .parse()
        .context("the front end's port")?;
    let host = value(&settings, "host").unwrap_or_default();
    let ip: IpAddr = match host.as_str() {
        "localhost" => IpAddr::from([127, 0, 0, 1]),
        h => h
            .parse()
            .map_err(|_| anyhow!("the front end's host `{h}` is not an IP address"))?,
    };
    let ip = if ip.is_unspecified() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        ip
    };
    Ok(SocketAddr::new(ip, port))
}
