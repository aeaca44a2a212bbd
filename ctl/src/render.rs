//! Human-readable output: sizes with units, aligned columns.

use std::fmt::Write as _;

use mlxcel_ipc::proto::admin::{CacheStats, EntryInfo, EvictReport, ReconcileReport};
use mlxcel_ipc::size::format_size;

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

fn ms(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(ms / 1000)).to_string()
}

/// `mlxcelctl cache stats`.
pub fn stats(s: &CacheStats) -> String {
    let mut out = String::new();
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<18} {v}");
    };
    row(
        "capacity",
        format!("{} ({} B)", format_size(s.capacity_bytes), s.capacity_bytes),
    );
    row(
        "used",
        format!(
            "{} in {} blocks ({} of capacity)",
            format_size(s.used_bytes),
            s.blocks,
            percent(s.used_bytes, s.capacity_bytes)
        ),
    );
    row("pinned", format_size(s.pinned_bytes));
    row(
        "releasing",
        format!(
            "{} in {} blocks",
            format_size(s.releasing_bytes),
            s.releasing_blocks
        ),
    );
    row("reserved", format_size(s.reserved_bytes));
    row(
        "block",
        format!(
            "{} per {} tokens",
            format_size(s.block_bytes),
            s.block_tokens
        ),
    );
    row("entries", s.entries.to_string());
    row(
        "prefix hits",
        format!(
            "{} hits, {} misses ({} hit rate)",
            s.prefix_hits,
            s.prefix_misses,
            percent(s.prefix_hits, s.prefix_hits + s.prefix_misses)
        ),
    );
    row(
        "tokens",
        format!("{} from cache, {} not found", s.hit_tokens, s.miss_tokens),
    );
    row("inserted blocks", s.inserted_blocks.to_string());
    let e = &s.evicted_blocks;
    row(
        "evicted blocks",
        format!(
            "capacity={} ttl={} max_blocks={} manual={} pressure={} daemon_lost={} drift={}",
            e.capacity, e.ttl, e.max_blocks, e.manual, e.pressure, e.daemon_lost, e.drift
        ),
    );
    let r = &s.rejected_blocks;
    row(
        "rejected blocks",
        format!(
            "capacity={} max_blocks={} release_timeout={} invalid_block={}",
            r.capacity, r.max_blocks, r.release_timeout, r.invalid_block
        ),
    );
    row(
        "leases",
        format!("{} active, {} expired", s.active_leases, s.expired_leases),
    );
    row(
        "limits",
        format!(
            "max_blocks={} idle_ttl={} lease_timeout={}",
            s.max_blocks.map_or("none".into(), |m| m.to_string()),
            s.idle_ttl_ms.map_or("off".into(), ms),
            ms(s.lease_timeout_ms)
        ),
    );
    match &s.daemon {
        Some(d) => {
            let g = &d.geometry;
            row(
                "daemon",
                format!(
                    "epoch {} pid {} up {}",
                    d.epoch.0,
                    d.pid,
                    ms(d.registered_ms_ago)
                ),
            );
            row(
                "model",
                format!(
                    "{}: {} layers x {} kv heads x {} dims, {}, {} blocks ({})",
                    g.model_id,
                    g.layers,
                    g.kv_heads,
                    g.head_dim,
                    g.dtype.name(),
                    g.pool_blocks,
                    format_size(s.pool_bytes_expected)
                ),
            );
        }
        None => row("daemon", "none registered".into()),
    }
    if let Some(resident) = s.daemon_pool_bytes_measured {
        let used = s.used_bytes;
        row(
            "kv memory",
            format!(
                "{} resident in the daemon's pool for {} cached (ceiling {}); MLX active {}",
                format_size(resident),
                format_size(used),
                format_size(s.pool_bytes_expected),
                s.daemon_active_bytes.map_or("unknown".into(), format_size)
            ),
        );
    }
    row(
        "drift",
        match s.last_reconcile_ms_ago {
            Some(ago) => format!(
                "{} (last reconcile {} ago)",
                format_size(s.drift_bytes),
                ms(ago)
            ),
            None => "never reconciled".into(),
        },
    );
    out.trim_end().to_string()
}

/// `mlxcelctl cache ls`.
pub fn entries(entries: &[EntryInfo]) -> String {
    if entries.is_empty() {
        return "no cached entries".into();
    }
    let mut out = format!(
        "{:<16}  {:>8}  {:>6}  {:>11}  {:>9}  {:>6}  {:>10}  {}\n",
        "ID", "TOKENS", "BLOCKS", "SIZE", "EXCLUSIVE", "HITS", "IDLE", "PINNED"
    );
    for e in entries {
        let _ = writeln!(
            out,
            "{:<16}  {:>8}  {:>6}  {:>11}  {:>9}  {:>6}  {:>10}  {}",
            e.id,
            e.tokens,
            e.blocks,
            format_size(e.bytes),
            e.exclusive_blocks,
            e.hits,
            ms(e.idle_ms),
            if e.pinned { "yes" } else { "no" }
        );
    }
    out.trim_end().to_string()
}

/// `mlxcelctl cache evict`.
pub fn evicted(r: &EvictReport) -> String {
    let mut s = format!("evicted {} blocks ({})", r.blocks, format_size(r.bytes));
    if r.pinned_kept > 0 {
        let _ = write!(
            s,
            "; kept {} pinned blocks in use by running requests",
            r.pinned_kept
        );
    }
    s
}

/// `mlxcelctl cache set-capacity`.
pub fn capacity_set(capacity: u64, r: &EvictReport) -> String {
    format!(
        "capacity set to {} ({} B); {}",
        format_size(capacity),
        capacity,
        evicted(r)
    )
}

/// `mlxcelctl cache reconcile`.
pub fn reconciled(r: &ReconcileReport) -> String {
    format!(
        "ledger {} / daemon inventory {} / drift {}",
        format_size(r.ledger_bytes),
        format_size(r.inventory_bytes),
        format_size(r.drift_bytes)
    )
}
