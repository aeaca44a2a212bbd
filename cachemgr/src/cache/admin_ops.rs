//! What operators ask of the cache: stats, entries, evict, set capacity.

use std::time::Duration;

use mlxcel_ipc::proto::admin::{CacheStats, DaemonInfo, EntryInfo, EvictReport, EvictSelector};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use tokio::time::Instant;

use super::{Cache, EvictReason};
use crate::index::Slot;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Cache {
    /// The ledger's figures.
    pub fn stats(&self, now: Instant) -> CacheStats {
        let bb = self.block_bytes();
        let c = &self.counters;
        let r = &self.reconcile;
        CacheStats {
            capacity_bytes: self.policy.capacity_bytes,
            max_blocks: self.policy.max_blocks,
            idle_ttl_ms: self.policy.idle_ttl.map(ms),
            lease_timeout_ms: ms(self.policy.lease_timeout),
            used_bytes: self.index.len() * bb,
            pinned_bytes: self.index.pinned() * bb,
            releasing_bytes: self.releases.blocks() * bb,
            reserved_bytes: self.reserved * bb,
            blocks: self.index.len(),
            releasing_blocks: self.releases.blocks(),
            block_bytes: bb,
            block_tokens: self
                .daemon
                .as_ref()
                .map_or(0, |d| u64::from(d.geometry.block_tokens)),
            entries: self.index.leaves(),
            prefix_hits: c.prefix_hits,
            prefix_misses: c.prefix_misses,
            hit_tokens: c.hit_tokens,
            miss_tokens: c.miss_tokens,
            inserted_blocks: c.inserted,
            evicted_blocks: c.evicted,
            rejected_blocks: c.rejected,
            active_leases: self.leases.len(),
            expired_leases: c.expired_leases,
            daemon: self.daemon.as_ref().map(|d| DaemonInfo {
                epoch: d.epoch,
                pid: d.pid,
                geometry: d.geometry.clone(),
                registered_ms_ago: ms(now - d.registered_at),
            }),
            drift_bytes: r.drift_blocks * bb,
            rejected_inventories: r.rejected_reports,
            last_reconcile_ms_ago: r.last_at.map(|t| ms(now - t)),
            daemon_pool_bytes_measured: r.pool_bytes_measured,
            daemon_active_bytes: r.engine_active_bytes,
            pool_bytes_expected: self
                .daemon
                .as_ref()
                .map_or(0, |d| d.geometry.pool_bytes().unwrap_or(0)),
            daemon_free_blocks: r.free_blocks,
            release_retries: c.release_retries,
            pins: self.pins.len() as u64,
            pinned_by_requests_bytes: self.pins.blocks() * bb,
            pins_lapsed: c.pins_lapsed,
            pins_expired: c.pins_expired,
        }
    }

    /// Cached prefix chains (one per leaf), most recently used first, at most `limit`.
    pub fn entries(&self, limit: usize, now: Instant) -> Vec<EntryInfo> {
        let bb = self.block_bytes();
        let bt = self
            .daemon
            .as_ref()
            .map_or(0, |d| u64::from(d.geometry.block_tokens));
        let mut out: Vec<EntryInfo> = self
            .index
            .iter()
            .filter(|(_, n)| n.children == 0)
            .map(|(slot, n)| {
                let (exclusive, root) = self.exclusive_run(slot);
                let blocks = u64::from(n.depth);
                EntryInfo {
                    id: n.hash.short(),
                    tokens: blocks * bt,
                    blocks,
                    bytes: blocks * bb,
                    exclusive_blocks: exclusive,
                    hits: n.hits,
                    idle_ms: ms(now - n.last_used),
                    // Pins are prefix-closed: a pinned block anywhere pins the chain's root.
                    pinned: self.index.node(root).pins > 0,
                }
            })
            .collect();
        out.sort_by_key(|e| e.idle_ms);
        out.truncate(limit);
        out
    }

    /// From a leaf: how many blocks only its chain holds, and the chain's first block.
    fn exclusive_run(&self, leaf: Slot) -> (u64, Slot) {
        let mut exclusive = 1;
        let mut shared = false;
        let mut cur = leaf;
        while let Some(p) = self.index.node(cur).parent {
            if self.index.node(p).children > 1 {
                shared = true;
            }
            if !shared {
                exclusive += 1;
            }
            cur = p;
        }
        (exclusive, cur)
    }

    /// Evicts what `selector` names; pinned blocks stay. Returns what was done.
    pub fn evict(
        &mut self,
        selector: &EvictSelector,
        now: Instant,
    ) -> Result<EvictReport, WireError> {
        let before = self.index.len();
        let mut pinned_kept = 0;
        match selector {
            EvictSelector::All => {
                while self.evict_lru(EvictReason::Manual) {}
                pinned_kept = self.index.len();
            }
            EvictSelector::ToBytes(target) => {
                let bb = self.block_bytes().max(1);
                while self.index.len() * bb > *target && self.evict_lru(EvictReason::Manual) {}
                if self.index.len() * bb > *target {
                    pinned_kept = self.index.len();
                }
            }
            EvictSelector::OlderThanMs(age) => {
                let cutoff = now.checked_sub(Duration::from_millis(*age));
                while let Some(slot) = self.index.lru_leaf() {
                    if cutoff.is_none_or(|c| self.index.node(slot).last_used > c) {
                        break;
                    }
                    self.evict_slot(slot, EvictReason::Manual);
                }
                pinned_kept = cutoff.map_or(0, |c| {
                    self.index
                        .iter()
                        .filter(|(_, n)| n.pins > 0 && n.last_used <= c)
                        .count() as u64
                });
            }
            EvictSelector::Entry(id) => {
                let leaf = self
                    .index
                    .iter()
                    .find(|(_, n)| n.children == 0 && n.hash.short() == *id)
                    .map(|(s, _)| s)
                    .ok_or_else(|| {
                        WireError::new(
                            ErrorCode::NotFound,
                            format!("no cache entry with id `{id}`"),
                        )
                    })?;
                let mut cur = Some(leaf);
                while let Some(slot) = cur {
                    let n = self.index.node(slot);
                    if n.children > 0 {
                        break;
                    }
                    if n.pins > 0 {
                        pinned_kept = u64::from(n.depth);
                        break;
                    }
                    cur = n.parent;
                    self.evict_slot(slot, EvictReason::Manual);
                }
            }
        }
        self.flush_releases(now);
        let blocks = before - self.index.len();
        Ok(EvictReport {
            blocks,
            bytes: blocks * self.block_bytes(),
            pinned_kept,
        })
    }

    /// Sets the capacity and evicts down to it now (the held figure follows as the daemon
    /// acknowledges the releases).
    pub fn set_capacity(&mut self, capacity_bytes: u64, now: Instant) -> EvictReport {
        self.policy.capacity_bytes = capacity_bytes;
        let before = self.index.len();
        self.enforce_limits();
        self.flush_releases(now);
        let blocks = before - self.index.len();
        tracing::info!(capacity_bytes, evicted_blocks = blocks, "capacity set");
        EvictReport {
            blocks,
            bytes: blocks * self.block_bytes(),
            pinned_kept: 0,
        }
    }

    /// Evicts until retained (plus reserved) blocks are within both limits.
    pub(super) fn enforce_limits(&mut self) {
        loop {
            let wanted = self.index.len() + self.reserved;
            let over_cap = wanted > self.cap_blocks();
            let over_max = self.policy.max_blocks.is_some_and(|m| wanted > m);
            let reason = match (over_cap, over_max) {
                (false, false) => return,
                (true, _) => EvictReason::Capacity,
                (false, true) => EvictReason::MaxBlocks,
            };
            if !self.evict_lru(reason) {
                return;
            }
        }
    }
}
