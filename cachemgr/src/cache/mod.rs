//! [`Cache`]: the cache manager's whole state, owned by one task.
//!
//! Methods take the current time and never block or do I/O: messages for the daemon are queued
//! in an outbox that the server drains after each call. This keeps every decision testable on its
//! own (property tests drive it directly) and keeps timing on tokio's clock (paused in tests).
//!
//! The capped figure is `held = retained + releasing` blocks: a block evicted by the manager is
//! still real memory until the daemon acknowledges its release. A donation that needs room waits
//! (with its blocks reserved) until enough releases are acknowledged, so `held ≤ capacity`
//! holds after every call.
//!
//! - [`daemon_ops`]: register, acquire/unlease, donate, reclaim, release acks, daemon loss.
//! - [`admin_ops`]: stats, entries, evict, set capacity.
//! - [`reconcile`]: inventory requests and drift.
//! - [`pinning`]: prefixes pinned by requests for a while, within the pin share.
//! - [`tick`]: timers (TTL, lease expiry, release retries, donation timeouts, reconcile).

mod admin_ops;
mod daemon_ops;
mod pinning;
mod reconcile;
mod tick;

use std::collections::VecDeque;

use mlxcel_ipc::proto::admin::{EvictionCounts, RefusalCounts};
use mlxcel_ipc::proto::cache::{
    CacheToDaemon, CallId, DonateOutcome, DonatedBlock, Epoch, PinRequest,
};
use mlxcel_ipc::{BlockId, Geometry};
use tokio::time::Instant;

use crate::index::{BlockIndex, Slot};
use crate::leases::Leases;
use crate::pins::Pins;
use crate::policy::Policy;
use crate::releases::Releases;

pub use reconcile::Reconciled;

/// Why blocks left the cache (one counter each in stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    Capacity,
    Ttl,
    MaxBlocks,
    Manual,
    Pressure,
    Drift,
}

/// The registered daemon.
#[derive(Debug)]
struct Daemon {
    epoch: Epoch,
    pid: u32,
    geometry: Geometry,
    block_bytes: u64,
    registered_at: Instant,
}

/// A donation waiting for acknowledged releases to make room.
#[derive(Debug)]
struct PendingDonation {
    call: CallId,
    /// The cached prefix it extends, pinned while it waits.
    prefix: Vec<Slot>,
    /// The blocks to add once there is room.
    new: Vec<DonatedBlock>,
    /// Prefixes of the chain to pin once added.
    pins: Vec<PinRequest>,
    /// The outcome so far (already cached and refused blocks).
    outcome: DonateOutcome,
    deadline: Instant,
}

/// Counters that only grow (reset with a new manager process).
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    prefix_hits: u64,
    prefix_misses: u64,
    hit_tokens: u64,
    miss_tokens: u64,
    inserted: u64,
    evicted: EvictionCounts,
    rejected: RefusalCounts,
    expired_leases: u64,
    release_retries: u64,
    pins_lapsed: u64,
    pins_expired: u64,
}

/// The cache manager's state.
#[derive(Debug)]
pub struct Cache {
    policy: Policy,
    daemon: Option<Daemon>,
    index: BlockIndex,
    leases: Leases,
    pins: Pins,
    releases: Releases,
    pending: VecDeque<PendingDonation>,
    /// Blocks reserved by pending donations.
    reserved: u64,
    /// Blocks evicted during the current call, sent as one `Release` when it ends.
    evicting: Vec<BlockId>,
    counters: Counters,
    reconcile: reconcile::State,
    next_epoch: u64,
    outbox: Vec<CacheToDaemon>,
}

impl Cache {
    /// An empty cache governed by `policy`.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            daemon: None,
            index: BlockIndex::default(),
            leases: Leases::default(),
            pins: Pins::default(),
            releases: Releases::default(),
            pending: VecDeque::new(),
            reserved: 0,
            evicting: Vec::new(),
            counters: Counters::default(),
            reconcile: reconcile::State::default(),
            next_epoch: 0,
            outbox: Vec::new(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Messages for the daemon produced since the last call, in order.
    pub fn drain_outbox(&mut self) -> Vec<CacheToDaemon> {
        std::mem::take(&mut self.outbox)
    }

    /// The registered daemon's epoch.
    pub fn epoch(&self) -> Option<Epoch> {
        self.daemon.as_ref().map(|d| d.epoch)
    }

    /// Real bytes of one block (0 with no daemon).
    pub fn block_bytes(&self) -> u64 {
        self.daemon.as_ref().map_or(0, |d| d.block_bytes)
    }

    /// Blocks retained by the cache.
    pub fn retained_blocks(&self) -> u64 {
        self.index.len()
    }

    /// Blocks evicted whose release is not acknowledged yet.
    pub fn releasing_blocks(&self) -> u64 {
        self.releases.blocks()
    }

    /// Retained plus releasing: the real memory held for the cache, in blocks.
    pub fn held_blocks(&self) -> u64 {
        self.index.len() + self.releases.blocks()
    }

    /// The capacity in whole blocks.
    fn cap_blocks(&self) -> u64 {
        match self.block_bytes() {
            0 => 0,
            bb => self.policy.capacity_bytes / bb,
        }
    }

    /// Whether `n` more blocks can be retained right now.
    fn fits_now(&self, n: u64) -> bool {
        self.held_blocks() + n <= self.cap_blocks()
            && self
                .policy
                .max_blocks
                .is_none_or(|m| self.index.len() + n <= m)
    }

    /// Blocks that could still be admitted once every outstanding release is acknowledged.
    fn room_after_releases(&self) -> u64 {
        let by_cap = self
            .cap_blocks()
            .saturating_sub(self.index.len() + self.reserved);
        match self.policy.max_blocks {
            Some(m) => by_cap.min(m.saturating_sub(self.index.len() + self.reserved)),
            None => by_cap,
        }
    }

    /// Whether `max_blocks`, rather than the byte capacity, is the tighter limit now.
    fn max_blocks_binds(&self) -> bool {
        self.policy
            .max_blocks
            .is_some_and(|m| m < self.cap_blocks())
    }

    /// Evicts least recently used unpinned blocks until `need` more would fit once releases are
    /// acknowledged (or nothing is left to evict).
    fn evict_for(&mut self, need: u64) {
        while self.room_after_releases() < need {
            let reason = if self.max_blocks_binds() {
                EvictReason::MaxBlocks
            } else {
                EvictReason::Capacity
            };
            if !self.evict_lru(reason) {
                break;
            }
        }
    }

    /// Evicts the least recently used unpinned block. False when there is none.
    fn evict_lru(&mut self, reason: EvictReason) -> bool {
        match self.index.lru_leaf() {
            Some(slot) => {
                self.evict_slot(slot, reason);
                true
            }
            None => false,
        }
    }

    /// Removes an unpinned leaf and queues its release.
    fn evict_slot(&mut self, slot: Slot, reason: EvictReason) {
        let node = self.index.remove_leaf(slot);
        self.evicting.push(node.block);
        self.count_eviction(reason);
    }

    fn count_eviction(&mut self, reason: EvictReason) {
        let c = &mut self.counters.evicted;
        *match reason {
            EvictReason::Capacity => &mut c.capacity,
            EvictReason::Ttl => &mut c.ttl,
            EvictReason::MaxBlocks => &mut c.max_blocks,
            EvictReason::Manual => &mut c.manual,
            EvictReason::Pressure => &mut c.pressure,
            EvictReason::Drift => &mut c.drift,
        } += 1;
    }

    /// Sends the blocks evicted during this call as one `Release`.
    fn flush_releases(&mut self, now: Instant) {
        if self.evicting.is_empty() {
            return;
        }
        let blocks = std::mem::take(&mut self.evicting);
        let release = self.releases.open(blocks.clone(), now);
        self.outbox.push(CacheToDaemon::Release { release, blocks });
    }

    /// The invariants every call must leave true (checked by the property tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.held_blocks() > self.cap_blocks() {
            return Err(format!(
                "held {} > cap {}",
                self.held_blocks(),
                self.cap_blocks()
            ));
        }
        if let Some(m) = self.policy.max_blocks
            && self.index.len() > m
        {
            return Err(format!("retained {} > max_blocks {m}", self.index.len()));
        }
        let share = (self.cap_blocks() as f64 * self.policy.pin_share.clamp(0.0, 1.0)) as u64;
        if self.pins.blocks() > share {
            return Err(format!(
                "pins hold {} blocks, over their share of {share}",
                self.pins.blocks()
            ));
        }
        let reserved: u64 = self.pending.iter().map(|p| p.new.len() as u64).sum();
        if reserved != self.reserved {
            return Err(format!(
                "reserved {} != pending {}",
                self.reserved, reserved
            ));
        }
        Ok(())
    }
}
