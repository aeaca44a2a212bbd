//! Operators (`mlxcelctl`) and the front end ↔ cache manager: strict request → reply.
//!
//! Field names follow Redis's INFO vocabulary: raw integers in base units (`_bytes`, `_ms`),
//! snake_case, counters that only grow.

use serde::{Deserialize, Serialize};

use super::WireError;
use super::cache::Epoch;
use crate::Geometry;

/// A request from an operator or the front end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminRequest {
    /// The ledger's figures.
    Stats,
    /// Cached prefix chains, most recently used first (at most `limit`).
    Entries { limit: u32 },
    /// Evict unpinned blocks.
    Evict(EvictSelector),
    /// Change the capacity now (evicting down to it).
    SetCapacity { capacity_bytes: u64 },
    /// Ask the daemon for its inventory now; the reply comes when it has answered.
    Reconcile,
}

/// What to evict. Pinned (leased) blocks are never evicted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EvictSelector {
    /// The blocks of one entry that no other entry shares (the id as `entries` lists it).
    Entry(String),
    /// Blocks not used for longer than this many milliseconds.
    OlderThanMs(u64),
    /// Least recently used blocks until used bytes ≤ this figure.
    ToBytes(u64),
    /// Everything unpinned.
    All,
}

/// A reply to an [`AdminRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminReply {
    Stats(Box<CacheStats>),
    Entries(Vec<EntryInfo>),
    Evicted(EvictReport),
    CapacitySet {
        capacity_bytes: u64,
        evicted: EvictReport,
    },
    Reconciled(ReconcileReport),
    Error(WireError),
}

/// What an eviction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EvictReport {
    /// Blocks evicted (their release is now pending with the daemon).
    pub blocks: u64,
    /// Real bytes of those blocks.
    pub bytes: u64,
    /// Blocks the selector matched but that are pinned by a lease and were kept.
    pub pinned_kept: u64,
}

/// The result of an on-demand reconciliation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// Bytes the ledger expected the daemon to hold for the cache.
    pub ledger_bytes: u64,
    /// Bytes the daemon reported holding (its block count × the manager's block size).
    pub inventory_bytes: u64,
    /// Bytes in one set and not the other (0 when ledger and daemon agree block for block).
    pub drift_bytes: u64,
}

/// Evicted blocks by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EvictionCounts {
    /// To stay under `capacity-bytes`.
    pub capacity: u64,
    /// Idle longer than `idle-ttl`.
    pub ttl: u64,
    /// To stay under `max-blocks`.
    pub max_blocks: u64,
    /// By an operator (`mlxcelctl cache evict`, `/v1/cache/evict`).
    pub manual: u64,
    /// The daemon asked for room (`Reclaim`).
    pub pressure: u64,
    /// The daemon's epoch ended (its memory is gone).
    pub daemon_lost: u64,
    /// Dropped by reconciliation because the daemon did not hold them.
    pub drift: u64,
}

/// Refused donated blocks by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RefusalCounts {
    pub capacity: u64,
    pub max_blocks: u64,
    pub release_timeout: u64,
    pub invalid_block: u64,
}

/// The registered daemon, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonInfo {
    /// Its epoch.
    pub epoch: Epoch,
    /// Its process id (from the handshake).
    pub pid: u32,
    /// The geometry it registered.
    pub geometry: Geometry,
    /// Milliseconds since it registered.
    pub registered_ms_ago: u64,
}

/// The ledger's figures. Bytes are real bytes: blocks × `block_bytes`, computed by the manager.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    /// The cap on `used_bytes + releasing_bytes`.
    pub capacity_bytes: u64,
    /// Optional cap on cached blocks.
    pub max_blocks: Option<u64>,
    /// Idle time after which a block is evicted (None = never).
    pub idle_ttl_ms: Option<u64>,
    /// How long a lease may pin blocks.
    pub lease_timeout_ms: u64,
    /// Bytes of blocks the cache retains.
    pub used_bytes: u64,
    /// Bytes of retained blocks pinned by at least one lease.
    pub pinned_bytes: u64,
    /// Bytes evicted but not yet acknowledged as released by the daemon (still real memory).
    pub releasing_bytes: u64,
    /// Bytes reserved for donations waiting for releases to finish.
    pub reserved_bytes: u64,
    /// Retained blocks.
    pub blocks: u64,
    /// Blocks being released.
    pub releasing_blocks: u64,
    /// Real size of one block (0 with no daemon).
    pub block_bytes: u64,
    /// Tokens per block (0 with no daemon).
    pub block_tokens: u64,
    /// Cached prefix chains (leaves of the block tree).
    pub entries: u64,
    /// Acquires that matched at least one block.
    pub prefix_hits: u64,
    /// Acquires that matched nothing.
    pub prefix_misses: u64,
    /// Tokens served from the cache by acquires.
    pub hit_tokens: u64,
    /// Tokens of full prompt blocks acquires asked for and did not find.
    pub miss_tokens: u64,
    /// Blocks that entered the cache.
    pub inserted_blocks: u64,
    /// Evicted blocks by reason.
    pub evicted_blocks: EvictionCounts,
    /// Refused donated blocks by reason.
    pub rejected_blocks: RefusalCounts,
    /// Leases currently held.
    pub active_leases: u64,
    /// Leases dropped by timeout.
    pub expired_leases: u64,
    /// The registered daemon.
    pub daemon: Option<DaemonInfo>,
    /// |ledger − inventory| at the last reconciliation, in bytes (block-for-block).
    pub drift_bytes: u64,
    /// Milliseconds since the last reconciliation (None = never).
    pub last_reconcile_ms_ago: Option<u64>,
    /// Resident pool bytes the daemon measured at the last reconciliation (the pool takes
    /// memory as blocks are used, up to `pool_bytes_expected`).
    pub daemon_pool_bytes_measured: Option<u64>,
    /// The daemon's MLX active memory (weights + KV + requests) at the last reconciliation.
    pub daemon_active_bytes: Option<u64>,
    /// The pool's ceiling by the manager's own formula (pool blocks × block bytes).
    pub pool_bytes_expected: u64,
    /// Blocks on the daemon's free list at the last reconciliation.
    pub daemon_free_blocks: Option<u64>,
    /// Releases sent again because the daemon had not acknowledged them in time.
    pub release_retries: u64,
    /// Prefixes pinned by requests (`cache_control`) now, and the bytes of their blocks.
    pub pins: u64,
    pub pinned_by_requests_bytes: u64,
    /// Pins that lapsed early to keep pins within their share of the capacity, and pins that
    /// reached their deadline.
    pub pins_lapsed: u64,
    pub pins_expired: u64,
    /// Inventory reports refused because no pool of the registered geometry could give them.
    pub rejected_inventories: u64,
}

/// One cached prefix chain (a leaf of the block tree and its ancestors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryInfo {
    /// The leaf block's short hash: pass it to `evict --entry`.
    pub id: String,
    /// Tokens in the chain (blocks × block_tokens).
    pub tokens: u64,
    /// Blocks in the chain, shared ancestors included.
    pub blocks: u64,
    /// Real bytes of the chain, shared ancestors included.
    pub bytes: u64,
    /// Blocks only this chain holds (what `evict --entry` would free).
    pub exclusive_blocks: u64,
    /// Acquires that matched this chain's last block.
    pub hits: u64,
    /// Milliseconds since the chain's last block was used.
    pub idle_ms: u64,
    /// Whether any block of the chain is pinned by a lease.
    pub pinned: bool,
}
