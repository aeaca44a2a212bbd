//! Daemon ↔ cache manager.
//!
//! The daemon owns physical memory (pool, free list, refcounts); the cache manager owns the
//! decision of what the cache retains. Both sides send unsolicited messages, so requests carry a
//! [`CallId`] that the matching reply echoes:
//!
//! | daemon sends                 | manager answers          |
//! |------------------------------|--------------------------|
//! | `Register`                   | `Registered`             |
//! | `Acquire` (longest prefix)   | `Acquired` (+ a lease)   |
//! | `Unlease`                    | (nothing)                |
//! | `Donate` (finished sequence) | `Donated` (maybe later)  |
//! | `Reclaim` (pool pressure)    | `Reclaimed`              |
//!
//! | manager sends                | daemon answers           |
//! |------------------------------|--------------------------|
//! | `Release`                    | `ReleaseAck`             |
//! | `InventoryRequest`           | `Inventory`              |
//!
//! The daemon must process manager messages in the order they arrive; the inventory check
//! (drift) relies on it.

use serde::{Deserialize, Serialize};

use super::WireError;
use crate::{BlockHash, BlockId, Geometry};

/// Correlates a daemon request with its reply.
pub type CallId = u64;

/// Names a lease (a pin on a cached prefix held for one request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseId(pub u64);

/// Names one `Release` so its acknowledgement can be matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReleaseId(pub u64);

/// One registration of a daemon; its blocks live and die with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Epoch(pub u64);

/// One block offered to the cache: its hash and where the daemon holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DonatedBlock {
    /// The block's chained hash.
    pub hash: BlockHash,
    /// The daemon's pool slot holding it.
    pub block: BlockId,
}

/// Messages from the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DaemonToCache {
    /// Start an epoch with this geometry. The manager computes block sizes itself from it.
    Register { call: CallId, geometry: Geometry },
    /// Find the longest cached prefix of `hashes` (a request's full prompt blocks, in order)
    /// and pin it under a lease.
    Acquire {
        call: CallId,
        hashes: Vec<BlockHash>,
    },
    /// Drop a lease's pins (request finished or cancelled).
    Unlease { lease: LeaseId },
    /// Offer a finished sequence's full blocks, in chain order from the first block, and pin
    /// the first blocks of the chain for a while (Anthropic's `cache_control`).
    Donate {
        call: CallId,
        blocks: Vec<DonatedBlock>,
        pins: Vec<PinRequest>,
    },
    /// The pool is short of `blocks` free blocks: evict up to that many unpinned cached blocks.
    Reclaim { call: CallId, blocks: u32 },
    /// The blocks of `release` have been given up by the cache's reference.
    ReleaseAck { release: ReleaseId },
    /// Answer to an `InventoryRequest`.
    Inventory {
        inventory: u64,
        report: InventoryReport,
    },
}

/// What the daemon really holds, for reconciliation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryReport {
    /// The epoch the daemon believes it is in.
    pub epoch: Epoch,
    /// Every block the daemon holds a cache reference on.
    pub cache_blocks: Vec<BlockId>,
    /// Blocks in the pool.
    pub pool_blocks: u32,
    /// Blocks on the free list.
    pub free_blocks: u32,
    /// Bytes of the pool tensors as the engine measures them (an independent check of the
    /// manager's own block size × pool blocks).
    pub pool_bytes_measured: u64,
    /// The engine's active memory in bytes, as the engine reports it (0 if unknown).
    pub engine_active_bytes: u64,
}

/// Keep the first `blocks` blocks of a donated chain for `ttl_secs`, even under pressure
/// (pins hold at most the manager's pin share of the cap; the oldest lapses first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinRequest {
    pub blocks: u32,
    pub ttl_secs: u32,
}

/// The outcome of a donation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DonateOutcome {
    /// Blocks the cache now holds a reference on: the daemon must add the cache's reference.
    pub retained: Vec<BlockId>,
    /// Blocks whose content was cached already: under the very same block id (nothing to do)
    /// or under another one (a duplicate: the daemon must not keep it for the cache).
    pub already_cached: Vec<BlockId>,
    /// Blocks the cache refused (the daemon keeps no cache reference on them).
    pub refused: Vec<BlockId>,
    /// Why blocks were refused, if any were.
    pub refused_reason: Option<RefuseReason>,
    /// The first blocks of the chain pinned now (the longest pin asked for, as far as the
    /// chain is cached and the pin share allows).
    pub pinned: u32,
}

/// Why a donation was (partly) refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RefuseReason {
    /// Not enough room even after evicting everything evictable.
    Capacity,
    /// Over the configured maximum number of blocks even after evicting.
    MaxBlocks,
    /// Room was being made but the daemon did not acknowledge releases in time.
    ReleaseTimeout,
    /// The block id is outside the pool or appears twice in the donation.
    InvalidBlock,
}

impl RefuseReason {
    /// snake_case name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            RefuseReason::Capacity => "capacity",
            RefuseReason::MaxBlocks => "max_blocks",
            RefuseReason::ReleaseTimeout => "release_timeout",
            RefuseReason::InvalidBlock => "invalid_block",
        }
    }
}

/// Messages from the cache manager.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CacheToDaemon {
    /// Registration accepted: the daemon's new epoch and the block size the manager books.
    Registered {
        call: CallId,
        epoch: Epoch,
        block_bytes: u64,
        /// The installation's secret block-hash key (see [`crate::HashKey`]).
        hash_key: crate::HashKey,
    },
    /// The longest cached prefix: `blocks[i]` holds `hashes[i]`; a lease pins them unless empty.
    Acquired {
        call: CallId,
        lease: Option<LeaseId>,
        blocks: Vec<BlockId>,
    },
    /// The outcome of a donation.
    Donated {
        call: CallId,
        outcome: DonateOutcome,
    },
    /// How many blocks were evicted for a `Reclaim` (their `Release` was sent before this).
    Reclaimed { call: CallId, blocks: u32 },
    /// Drop the cache's reference on these blocks, then acknowledge.
    Release {
        release: ReleaseId,
        blocks: Vec<BlockId>,
    },
    /// Report what you hold.
    InventoryRequest { inventory: u64 },
    /// A request (`call`, if it could be read) failed.
    Error {
        call: Option<CallId>,
        error: WireError,
    },
}
