//! Command-line flags (each also settable by an `MLXCEL_*` environment variable).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use mlxcel_ipc::size::parse_size;

use crate::tenants::Keys;

/// mlxcel-frontend: the OpenAI-compatible HTTP API (`/v1/chat/completions`, `/v1/completions`,
/// `/v1/models`) plus `/health`, `/metrics` and `/v1/cache/*`, served over the mlxcel daemon
/// (`<socket-dir>/daemon.sock`) and cache manager (`<socket-dir>/cachemgr.sock`). It starts
/// without them and answers 503 until the daemon is reachable.
#[derive(Debug, Clone, Parser)]
#[command(name = "mlxcel-frontend", version, about, long_about)]
pub struct Args {
    #[arg(long, env = "MLXCEL_HOST", default_value = "127.0.0.1")]
    pub host: String,

    #[arg(long, env = "MLXCEL_PORT", default_value_t = 8080)]
    pub port: u16,

    #[arg(long, env = "MLXCEL_SOCKET_DIR", value_name = "DIR")]
    pub socket_dir: Option<PathBuf>,

    #[arg(long, env = "MLXCEL_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    #[arg(long, env = "MLXCEL_API_KEYS_FILE", value_name = "FILE")]
    pub api_keys_file: Option<PathBuf>,

    #[arg(long, env = "MLXCEL_ADMIN_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,

    #[arg(long, env = "MLXCEL_ALLOWED_HOSTS", value_name = "HOSTS")]
    pub allowed_hosts: Option<String>,

    #[arg(long, env = "MLXCEL_ALLOWED_ORIGINS", value_name = "ORIGINS")]
    pub allowed_origins: Option<String>,

    #[arg(long, env = "MLXCEL_REASONING_INLINE", default_value = "off", value_parser = mlxcel_config::parse_switch, value_name = "on|off")]
    pub reasoning_inline: bool,

    #[arg(long, env = "MLXCEL_STRIP_BILLING_HEADER", default_value = "on", value_parser = mlxcel_config::parse_switch, value_name = "on|off")]
    pub strip_billing_header: bool,

    #[arg(long, env = "MLXCEL_MAX_QUEUE", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_queue: u32,

    #[arg(long, env = "MLXCEL_MAX_BODY_BYTES", default_value = "8MiB", value_parser = parse_size)]
    pub max_body_bytes: u64,

    #[arg(long, env = "MLXCEL_MAX_CONNECTIONS", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    #[arg(long, env = "MLXCEL_WRITE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub write_timeout: Duration,

    #[arg(long, env = "MLXCEL_HEADER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub header_timeout: Duration,

    #[arg(long, env = "MLXCEL_BODY_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pub body_timeout: Duration,

    #[arg(long, env = "MLXCEL_DAEMON_MAX_FRAME_BYTES", default_value = "32MiB", value_parser = parse_size)]
    pub max_frame_bytes: u64,

    #[arg(long, env = "MLXCEL_LOG", default_value = "info")]
    pub log_level: String,
}

impl Args {
    /// The configured keys (the keys file read and checked here).
    pub fn keys(&self) -> Result<Keys, String> {
        let text = match &self.api_keys_file {
            Some(path) => Some(read_secret_file(path)?),
            None => None,
        };
        let file = self.api_keys_file.as_deref().zip(text.as_deref());
        Keys::new(self.api_key.as_deref(), file, self.admin_key.as_deref())
    }

    /// The address to bind, refusing a non-loopback one without an API key.
    pub fn bind_addr(&self) -> Result<(IpAddr, u16), String> {
        let ip: IpAddr = if self.host == "localhost" {
            IpAddr::from([127, 0, 0, 1])
        } else {
            self.host
                .parse()
                .map_err(|_| format!("--host `{}` is not an IP address", self.host))?
        };
        let keyed =
            self.api_key.as_deref().is_some_and(|k| !k.is_empty()) || self.api_keys_file.is_some();
        if !ip.is_loopback() && !keyed {
            return Err(format!(
                "--host {ip} is reachable from other machines: set MLXCEL_API_KEY (or --api-key, \
                 --api-keys-file) to require a bearer token, or bind to 127.0.0.1"
            ));
        }
        Ok((ip, self.port))
    }
}

/// Reads a file of secrets, warning when other users may read it too.
fn read_secret_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --api-keys-file {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                file = %path.display(),
                "the API keys file is readable by other users: chmod 600 it"
            );
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["mlxcel-frontend"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    #[test]
    fn a_public_bind_needs_an_api_key() {
        assert!(args(&[]).bind_addr().is_ok());
        let err = args(&["--host", "0.0.0.0"]).bind_addr().unwrap_err();
        assert!(err.contains("--api-key"), "{err}");
        assert!(
            args(&["--host", "0.0.0.0", "--api-key", "k"])
                .bind_addr()
                .is_ok()
        );
        assert!(args(&["--host", "::1"]).bind_addr().is_ok());
        assert!(args(&["--host", "nope"]).bind_addr().is_err());
    }

    #[test]
    fn flags_match_the_configuration_table() {
        use clap::CommandFactory;
        let result = mlxcel_config::check::matches_command(
            &Args::command(),
            mlxcel_config::Section::Frontend,
        );
        assert_eq!(result, Ok(()));
    }
}
