//! The cache side of requests, in request terms: mapping a leased prefix into a sequence,
//! ending the lease once mapped, offering a finished sequence's full blocks, and applying the
//! manager's orders (releases, inventories, donation outcomes, a lost connection) to the pool.
//!
//! It is also the trust boundary. The daemon holds a cache reference only on blocks it donated
//! itself, and remembers the hash each was donated under; an id from the manager is used only if
//! it names such a block at the position whose hash it claims. Anything else (another prefix's
//! block, an id out of range, a block never donated, a release of a block not held) is refused,
//! logged and counted, never mapped: the K/V of two requests cannot mix.

use std::collections::HashMap;

use mlxcel_ipc::proto::cache::{DonatedBlock, Epoch, InventoryReport, LeaseId, PinRequest};
use mlxcel_ipc::proto::daemon::{DaemonToFrontend, FinishReason, PoolStats, RequestId, Usage};
use mlxcel_ipc::{BlockHash, BlockId, HashSeed};

use super::events::EventSink;
use crate::cache_client::{CacheClient, ManagerOrder, Registration};
use crate::pool::BlockPool;

/// The pool operations the link needs (the pool itself, or a counting fake in tests).
pub trait Refcounts {
    /// Adds a reference to a block that is in use.
    fn retain(&mut self, block: BlockId);
    /// Drops a reference.
    fn release(&mut self, block: BlockId);
}

impl Refcounts for BlockPool {
    fn retain(&mut self, block: BlockId) {
        BlockPool::retain(self, block);
    }
    fn release(&mut self, block: BlockId) {
        BlockPool::release(self, block);
    }
}

/// A finished sequence whose donation outcome has not arrived yet.
struct Finishing {
    /// Every block of the sequence (its references are dropped once the outcome is known).
    table: Vec<BlockId>,
    /// The full blocks offered, with their hashes.
    offered: Vec<DonatedBlock>,
    /// The end to report once the outcome says what was pinned.
    then: Option<PinnedEnd>,
}

/// A request's `Done`, held until its donation's pins are settled (its usage reports the
/// prompt tokens the cache really pinned).
pub struct PinnedEnd {
    pub events: EventSink,
    pub request_id: RequestId,
    pub finish: FinishReason,
    pub usage: Usage,
    pub block_tokens: usize,
}

impl PinnedEnd {
    /// Sends the `Done`, with `blocks` leading blocks pinned.
    pub fn send(mut self, blocks: u32) {
        let pinned = (blocks as usize * self.block_tokens).min(self.usage.prompt_tokens as usize);
        self.usage.pinned_tokens = pinned as u32;
        self.events.send(DaemonToFrontend::Done {
            request_id: self.request_id,
            finish: self.finish,
            usage: self.usage,
        });
    }
}

/// The engine's link to the cache manager.
#[derive(Default)]
pub struct CacheLink {
    client: Option<CacheClient>,
    runtime: Option<tokio::runtime::Handle>,
    /// The current registration: its epoch and block-hash key (None while unregistered).
    registration: Option<Registration>,
    /// Blocks the cache holds a reference on, with the hash each was donated under.
    held: HashMap<BlockId, BlockHash>,
    /// Donations awaiting their outcome, by tag.
    finishing: HashMap<u64, Finishing>,
    next_tag: u64,
    /// Block ids from the manager that were refused.
    refused: u64,
}

impl CacheLink {
    /// Connects the link to the manager's client, and the runtime its requests run on.
    pub fn attach(&mut self, client: CacheClient, runtime: tokio::runtime::Handle) {
        self.client = Some(client);
        self.runtime = Some(runtime);
    }

    /// The seed block hashes of `model_id` and `salt` are computed with in this registration
    /// (None while unregistered: nothing can be offered then).
    pub fn hash_seed(&self, model_id: &str, salt: Option<&str>) -> Option<HashSeed> {
        self.registration
            .map(|r| HashSeed::new(&r.hash_key, model_id, salt))
    }

    /// Blocks held for the cache.
    pub fn held_blocks(&self) -> u32 {
        self.held.len() as u32
    }

    /// Whether blocks may come back without any request finishing (cache-held or awaiting a
    /// donation outcome).
    pub fn may_free_blocks(&self) -> bool {
        !self.held.is_empty() || !self.finishing.is_empty()
    }

    /// Block ids from the manager refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Maps the leased prefix `blocks` of a prompt whose block hashes are `hashes`, at most
    /// `usable` blocks: each must be a block the cache holds under that position's hash. Takes a
    /// sequence reference on each mapped block, then ends the lease (the references hold them).
    pub fn map_prefix(
        &mut self,
        pool: &mut impl Refcounts,
        hashes: &[BlockHash],
        blocks: &[BlockId],
        usable: usize,
        lease: Option<LeaseId>,
    ) -> Vec<BlockId> {
        let mut mapped = Vec::new();
        for (i, &b) in blocks.iter().enumerate().take(usable) {
            if hashes.get(i).is_some_and(|h| self.held.get(&b) == Some(h)) {
                pool.retain(b);
                mapped.push(b);
            } else {
                self.refused += (blocks.len().min(usable) - i) as u64;
                tracing::warn!(
                    block = b,
                    position = i,
                    "the cache manager leased a block the cache does not hold for this prefix; refused"
                );
                break;
            }
        }
        self.unlease(lease);
        mapped
    }

    /// Ends a lease.
    pub fn unlease(&self, lease: Option<LeaseId>) {
        if let (Some(lease), Some(client)) = (lease, &self.client) {
            client.unlease(lease);
        }
    }

    /// Offers a finished sequence's full blocks (`offered`, a prefix of `table`) to the cache,
    /// or frees `table` when there is no manager. The offer is queued before the caller reports
    /// the end, so a request sent after it finds the prefix. With `pins`, the end (`then`) is
    /// reported once the outcome says what was pinned; it comes back when nothing was sent.
    pub fn donate(
        &mut self,
        pool: &mut impl Refcounts,
        table: Vec<BlockId>,
        offered: Vec<DonatedBlock>,
        pins: Vec<PinRequest>,
        then: Option<PinnedEnd>,
    ) -> Option<PinnedEnd> {
        self.next_tag += 1;
        let tag = self.next_tag;
        let sent = !offered.is_empty()
            && self
                .client
                .as_ref()
                .is_some_and(|c| c.donate_ordered(tag, offered.clone(), pins));
        if sent {
            self.finishing.insert(
                tag,
                Finishing {
                    table,
                    offered,
                    then,
                },
            );
            None
        } else {
            table.into_iter().for_each(|b| pool.release(b));
            then
        }
    }

    /// Asks the manager to evict cached blocks the pool needs (fire and forget; the releases
    /// arrive as orders).
    pub fn reclaim(&self, blocks: u32) {
        if let (Some(client), Some(rt)) = (self.client.clone(), &self.runtime)
            && !self.held.is_empty()
        {
            rt.spawn(async move {
                client.reclaim(blocks).await;
            });
        }
    }

    /// Applies one order of the manager; `stats` gives the pool's totals for an inventory.
    pub fn apply(
        &mut self,
        pool: &mut impl Refcounts,
        order: ManagerOrder,
        stats: impl FnOnce() -> PoolStats,
    ) {
        match order {
            ManagerOrder::Registered(r) => self.registration = Some(r),
            ManagerOrder::Release { blocks, done } => {
                for b in blocks {
                    if self.held.remove(&b).is_some() {
                        pool.release(b);
                    } else {
                        self.refused += 1;
                        tracing::warn!(block = b, "release of a block not held for the cache");
                    }
                }
                let _ = done.send(());
            }
            ManagerOrder::Inventory { reply } => {
                let _ = reply.send(self.inventory(stats()));
            }
            ManagerOrder::Donated { tag, outcome } => {
                let Some(f) = self.finishing.remove(&tag) else {
                    return;
                };
                for b in outcome.retained {
                    match f.offered.iter().find(|d| d.block == b) {
                        Some(d) if !self.held.contains_key(&b) => {
                            self.held.insert(b, d.hash);
                            pool.retain(b);
                        }
                        Some(_) => {}
                        None => {
                            self.refused += 1;
                            tracing::warn!(
                                block = b,
                                "the cache manager retained a block that was not offered; refused"
                            );
                        }
                    }
                }
                f.table.into_iter().for_each(|b| pool.release(b));
                if let Some(end) = f.then {
                    end.send(outcome.pinned.min(f.offered.len() as u32));
                }
            }
            ManagerOrder::DonationLost { tag } => {
                if let Some(f) = self.finishing.remove(&tag) {
                    f.table.into_iter().for_each(|b| pool.release(b));
                    if let Some(end) = f.then {
                        end.send(0);
                    }
                }
            }
            ManagerOrder::Disconnected => {
                self.registration = None;
                self.drop_held(pool);
            }
        }
    }

    /// What the daemon holds for the cache, for the manager's reconciliation.
    fn inventory(&self, stats: PoolStats) -> InventoryReport {
        let mut cache_blocks: Vec<BlockId> = self.held.keys().copied().collect();
        cache_blocks.sort_unstable();
        InventoryReport {
            epoch: self.registration.map_or(Epoch(0), |r| r.epoch),
            cache_blocks,
            pool_blocks: stats.total_blocks,
            free_blocks: stats.free_blocks,
            pool_bytes_measured: stats.pool_bytes_measured,
            engine_active_bytes: mlx_rs::memory::active_memory().unwrap_or(0) as u64,
        }
    }

    fn drop_held(&mut self, pool: &mut impl Refcounts) {
        for (b, _) in self.held.drain() {
            pool.release(b);
        }
    }

    /// Gives back everything: donations in flight and the cache's references.
    pub fn shutdown(&mut self, pool: &mut impl Refcounts) {
        for (_, f) in self.finishing.drain() {
            f.table.into_iter().for_each(|b| pool.release(b));
            if let Some(end) = f.then {
                end.send(0);
            }
        }
        self.drop_held(pool);
    }
}

#[cfg(test)]
mod tests;
