//! `mlxcelctl cache ...`: admin requests to the cache manager.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand};
use mlxcel_ipc::Role;
use mlxcel_ipc::client::{AdminClient, ClientError};
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, EvictSelector};
use mlxcel_ipc::runtime_dir::{CACHEMGR_SOCKET, RuntimeDir};
use mlxcel_ipc::size::parse_size;

use crate::render;

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// The ledger: capacity, used/pinned/releasing bytes, hits, evictions, drift.
    Stats {
        /// Print JSON with raw byte counts instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Cached prefix chains, most recently used first.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Show at most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Evict unpinned blocks (blocks leased by running requests are kept).
    Evict(EvictArgs),
    /// Change the capacity now, evicting down to it (e.g. 512MiB, 2GiB).
    SetCapacity {
        /// The new capacity.
        #[arg(value_parser = parse_size, value_name = "SIZE")]
        size: u64,
    },
    /// Compare the ledger with the daemon's inventory now and print the drift.
    Reconcile {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct EvictArgs {
    /// Evict one entry (its id as `mlxcelctl cache ls` shows it).
    #[arg(long, value_name = "ID")]
    entry: Option<String>,
    /// Evict blocks not used for longer than this (e.g. 30m, 2h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// Evict least recently used blocks until the cache holds at most this (e.g. 512MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    to_bytes: Option<u64>,
    /// Evict everything unpinned.
    #[arg(long)]
    all: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration such as 30s, 10m or 2h: {e}"))
}

impl EvictArgs {
    fn selector(&self) -> anyhow::Result<EvictSelector> {
        Ok(
            match (&self.entry, self.older_than, self.to_bytes, self.all) {
                (Some(id), ..) => EvictSelector::Entry(id.clone()),
                (_, Some(age), ..) => {
                    EvictSelector::OlderThanMs(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
                }
                (_, _, Some(bytes), _) => EvictSelector::ToBytes(bytes),
                (.., true) => EvictSelector::All,
                _ => bail!(
                    "say what to evict: --entry ID, --older-than DURATION, --to-bytes SIZE or --all"
                ),
            },
        )
    }
}

/// Runs one cache command against the manager in `socket_dir`.
pub async fn run(cmd: CacheCommand, socket_dir: Option<&Path>) -> anyhow::Result<()> {
    let dir = RuntimeDir::new(socket_dir);
    let path = dir.socket(CACHEMGR_SOCKET)?;
    let mut client = AdminClient::connect(&path, Role::Admin).await.map_err(|e| match e {
        ClientError::Socket(e @ mlxcel_ipc::socket::SocketError::Untrusted { .. }) => anyhow!(e),
        ClientError::Socket(_) => anyhow!(
            "the cache manager is not running (no server on {}); start it with `make serve` or `mlxcel-cachemgr`",
            path.display()
        ),
        other => anyhow!(other),
    })?;
    let request = match &cmd {
        CacheCommand::Stats { .. } => AdminRequest::Stats,
        CacheCommand::Ls { limit, .. } => AdminRequest::Entries { limit: *limit },
        CacheCommand::Evict(args) => AdminRequest::Evict(args.selector()?),
        CacheCommand::SetCapacity { size } => AdminRequest::SetCapacity {
            capacity_bytes: *size,
        },
        CacheCommand::Reconcile { .. } => AdminRequest::Reconcile,
    };
    let reply = client
        .request(&request)
        .await
        .context("the cache manager refused the request")?;
    let json = matches!(
        cmd,
        CacheCommand::Stats { json: true }
            | CacheCommand::Ls { json: true, .. }
            | CacheCommand::Reconcile { json: true }
    );
    let text = match reply {
        AdminReply::Stats(s) if json => serde_json::to_string_pretty(&s)?,
        AdminReply::Stats(s) => render::stats(&s),
        AdminReply::Entries(e) if json => serde_json::to_string_pretty(&e)?,
        AdminReply::Entries(e) => render::entries(&e),
        AdminReply::Evicted(r) => render::evicted(&r),
        AdminReply::CapacitySet {
            capacity_bytes,
            evicted,
        } => render::capacity_set(capacity_bytes, &evicted),
        AdminReply::Reconciled(r) if json => serde_json::to_string_pretty(&r)?,
        AdminReply::Reconciled(r) => render::reconciled(&r),
        AdminReply::Error(e) => bail!("{e}"),
    };
    println!("{text}");
    Ok(())
}
