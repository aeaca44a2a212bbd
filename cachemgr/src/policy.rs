//! The retention policy: what the cache may hold and for how long.

use std::time::Duration;

/// Limits and timeouts the cache manager enforces.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Cap on real bytes held for the cache: retained blocks plus blocks whose release the
    /// daemon has not acknowledged yet.
    pub capacity_bytes: u64,
    /// Optional cap on retained blocks.
    pub max_blocks: Option<u64>,
    /// Evict blocks idle for longer than this (None = never).
    pub idle_ttl: Option<Duration>,
    /// The share of the capacity that pins (requests' `cache_control`) may hold, 0 to 1.
    pub pin_share: f64,
    /// A lease unpins after this long even if the daemon never says so.
    pub lease_timeout: Duration,
    /// A release not acknowledged after this long is sent again; a donation waiting for
    /// releases this long is refused.
    pub release_timeout: Duration,
    /// Ask the daemon for its inventory this often (None = only on demand).
    pub reconcile_interval: Option<Duration>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            capacity_bytes: 2 << 30,
            max_blocks: None,
            idle_ttl: None,
            pin_share: 0.5,
            lease_timeout: Duration::from_secs(30),
            release_timeout: Duration::from_secs(5),
            reconcile_interval: Some(Duration::from_secs(30)),
        }
    }
}
