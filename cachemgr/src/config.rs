//! Command-line flags; each can also come from an `MLXCEL_*` environment variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use mlxcel_ipc::Limits;
use mlxcel_ipc::size::parse_size;

use crate::Policy;
use crate::server::ServerConfig;

/// mlxcel-cachemgr: governs the KV prompt cache of an mlxcel daemon with a real-byte ledger.
///
/// It listens on `<socket-dir>/cachemgr.sock`. The daemon registers its model geometry; the
/// manager computes the real size of a block from it, decides which blocks the cache retains,
/// and keeps retained + releasing bytes within --capacity-bytes. Runs in the foreground, logs to
/// stderr, stops cleanly on SIGTERM or Ctrl-C.
#[derive(Debug, Parser)]
#[command(name = "mlxcel-cachemgr", version, about, long_about)]
pub struct Args {
    #[arg(long, env = "MLXCEL_SOCKET_DIR", value_name = "DIR")]
    pub socket_dir: Option<PathBuf>,

    #[arg(long, alias = "cache-capacity", env = "MLXCEL_CACHE_CAPACITY", default_value = "2GiB", value_parser = parse_size, value_name = "SIZE")]
    pub capacity_bytes: u64,

    #[arg(long, env = "MLXCEL_CACHE_MAX_BLOCKS", value_name = "N")]
    pub max_blocks: Option<u64>,

    #[arg(long, env = "MLXCEL_CACHE_IDLE_TTL", default_value = "off", value_parser = parse_optional_duration, value_name = "DURATION")]
    pub idle_ttl: Toggle,

    #[arg(long, env = "MLXCEL_CACHE_PIN_SHARE", default_value = "0.5", value_parser = parse_share, value_name = "SHARE")]
    pub pin_share: f64,

    #[arg(long, env = "MLXCEL_CACHE_LEASE_TIMEOUT", default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_timeout: Duration,

    #[arg(long, env = "MLXCEL_CACHE_RELEASE_TIMEOUT", default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub release_timeout: Duration,

    #[arg(long, env = "MLXCEL_CACHE_RECONCILE_INTERVAL", default_value = "30s", value_parser = parse_optional_duration, value_name = "DURATION")]
    pub reconcile_interval: Toggle,

    #[arg(long, env = "MLXCEL_MAX_FRAME_BYTES", default_value = "4MiB", value_parser = parse_size, value_name = "SIZE")]
    pub max_frame_bytes: u64,

    #[arg(long, env = "MLXCEL_HASH_KEY_FILE", value_name = "FILE")]
    pub hash_key_file: Option<PathBuf>,

    #[arg(long, env = "MLXCEL_CACHE_MAX_CONNECTIONS", default_value_t = 64)]
    pub max_connections: usize,

    #[arg(long, env = "MLXCEL_LOG", default_value = "info")]
    pub log_level: String,
}

impl Args {
    /// The retention policy these flags describe.
    pub fn policy(&self) -> Policy {
        Policy {
            capacity_bytes: self.capacity_bytes,
            max_blocks: self.max_blocks,
            idle_ttl: self.idle_ttl.0,
            pin_share: self.pin_share,
            lease_timeout: self.lease_timeout,
            release_timeout: self.release_timeout,
            reconcile_interval: self.reconcile_interval.0,
        }
    }

    /// The server settings these flags describe.
    pub fn server(&self) -> ServerConfig {
        ServerConfig {
            socket_dir: self.socket_dir.clone(),
            limits: Limits::new(usize::try_from(self.max_frame_bytes).unwrap_or(usize::MAX)),
            max_connections: self.max_connections.max(1),
            hash_key_file: self
                .hash_key_file
                .clone()
                .or_else(crate::hash_key::default_path),
            ..ServerConfig::default()
        }
    }
}

/// Parses `30s`, `10m`, `2h 30m` (humantime syntax).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration such as 30s, 10m or 2h: {e}"))
}

/// A share between 0 and 1.
pub fn parse_share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "`{text}` is not a share between 0 and 1, such as 0.5"
        )),
    }
}

/// A duration that can be switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Toggle(pub Option<Duration>);

/// Like [`parse_duration`], with `off`, `none` or `0` meaning no duration.
pub fn parse_optional_duration(text: &str) -> Result<Toggle, String> {
    match text.trim() {
        "off" | "none" | "0" => Ok(Toggle(None)),
        t => parse_duration(t).map(|d| Toggle(Some(d))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let a = Args::try_parse_from(["mlxcel-cachemgr"]).unwrap();
        assert_eq!(a.policy(), Policy::default());
    }

    #[test]
    fn sizes_and_durations_parse_and_bad_ones_name_the_flag() {
        let a =
            Args::try_parse_from(["x", "--capacity-bytes", "512MiB", "--idle-ttl", "30m"]).unwrap();
        assert_eq!(a.capacity_bytes, 512 << 20);
        assert_eq!(a.idle_ttl, Toggle(Some(Duration::from_secs(1800))));
        let err = Args::try_parse_from(["x", "--capacity-bytes", "lots"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--capacity-bytes") && err.contains("not a size"),
            "{err}"
        );
    }

    #[test]
    fn flags_match_the_configuration_table() {
        use clap::CommandFactory;
        let result = mlxcel_config::check::matches_command(
            &Args::command(),
            mlxcel_config::Section::Cachemgr,
        );
        assert_eq!(result, Ok(()));
    }
}
