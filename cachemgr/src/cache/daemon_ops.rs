//! What the daemon asks of the cache: register, acquire/unlease, donate, reclaim, acknowledge.

use std::collections::HashSet;

use mlxcel_ipc::proto::cache::{
    CacheToDaemon, CallId, DonateOutcome, DonatedBlock, Epoch, LeaseId, PinRequest, RefuseReason,
    ReleaseId,
};
use mlxcel_ipc::proto::{ErrorCode, WireError};
use mlxcel_ipc::{BlockHash, BlockId, Geometry};
use tokio::time::Instant;

use super::{Cache, Daemon, EvictReason, PendingDonation};
use crate::index::Slot;

impl Cache {
    /// Starts a new epoch for a daemon with `geometry`. The block size is computed here, from
    /// the geometry; no byte figure from the daemon is ever booked.
    pub fn register(
        &mut self,
        pid: u32,
        geometry: Geometry,
        now: Instant,
    ) -> Result<(Epoch, u64), WireError> {
        if let Some(d) = &self.daemon {
            return Err(WireError::new(
                ErrorCode::AlreadyRegistered,
                format!(
                    "daemon pid {} is already registered as epoch {}",
                    d.pid, d.epoch.0
                ),
            ));
        }
        let block_bytes = geometry
            .block_bytes()
            .map_err(|e| WireError::new(ErrorCode::BadGeometry, e.to_string()))?;
        geometry
            .pool_bytes()
            .map_err(|e| WireError::new(ErrorCode::BadGeometry, e.to_string()))?;
        self.next_epoch += 1;
        let epoch = Epoch(self.next_epoch);
        tracing::info!(
            epoch = epoch.0, pid, model = %geometry.model_id, block_bytes,
            pool_blocks = geometry.pool_blocks, "daemon registered"
        );
        self.daemon = Some(Daemon {
            epoch,
            pid,
            geometry,
            block_bytes,
            registered_at: now,
        });
        Ok((epoch, block_bytes))
    }

    /// The daemon of `epoch` is gone: its memory went with it, so every block it held for the
    /// cache leaves the ledger (`evicted_blocks{reason="daemon_lost"}`).
    pub fn daemon_lost(&mut self, epoch: Epoch) {
        if self.epoch() != Some(epoch) {
            return;
        }
        let lost = self.index.len();
        tracing::warn!(
            epoch = epoch.0,
            lost_blocks = lost,
            releasing = self.releases.blocks(),
            "daemon connection lost: dropping its epoch from the ledger"
        );
        self.counters.evicted.daemon_lost += lost;
        self.index.clear();
        self.leases.clear();
        self.pins.clear();
        self.releases.clear();
        self.pending.clear();
        self.reserved = 0;
        self.evicting.clear();
        self.reconcile.forget_outstanding();
        self.outbox.clear();
        self.daemon = None;
    }

    /// Finds the longest cached prefix of `hashes` and pins it under a lease.
    pub fn acquire(
        &mut self,
        hashes: &[BlockHash],
        now: Instant,
    ) -> (Option<LeaseId>, Vec<BlockId>) {
        let chain = self.cached_prefix(hashes.iter());
        let block_tokens = self
            .daemon
            .as_ref()
            .map_or(0, |d| u64::from(d.geometry.block_tokens));
        let hit = chain.len() as u64;
        self.counters.hit_tokens += hit * block_tokens;
        self.counters.miss_tokens += (hashes.len() as u64 - hit) * block_tokens;
        let Some(&last) = chain.last() else {
            self.counters.prefix_misses += 1;
            return (None, Vec::new());
        };
        self.counters.prefix_hits += 1;
        self.index.bump_hits(last);
        let blocks = chain.iter().map(|&s| self.index.node(s).block).collect();
        self.index.pin_chain(&chain, now);
        let lease = self.leases.open(chain, now, self.policy.lease_timeout);
        (Some(lease), blocks)
    }

    /// Ends a lease (unknown or expired leases are ignored).
    pub fn unlease(&mut self, lease: LeaseId, now: Instant) {
        match self.leases.close(lease) {
            Some(l) => self.index.unpin_chain(&l.chain, now),
            None => tracing::debug!(lease = lease.0, "unlease of a lease that already ended"),
        }
    }

    /// The slots of the longest cached prefix of `hashes` (a proper chain from a first block).
    fn cached_prefix<'a>(&self, hashes: impl IntoIterator<Item = &'a BlockHash>) -> Vec<Slot> {
        let mut chain: Vec<Slot> = Vec::new();
        for h in hashes {
            match self.index.find(h) {
                Some(s) if self.index.node(s).parent == chain.last().copied() => chain.push(s),
                _ => break,
            }
        }
        chain
    }

    /// Offers a finished sequence's full blocks (chain order) and pins its first blocks as
    /// `pins` ask. The reply (`Donated`) goes to the outbox now, or once releases have made room.
    pub fn donate(
        &mut self,
        call: CallId,
        blocks: Vec<DonatedBlock>,
        pins: Vec<PinRequest>,
        now: Instant,
    ) -> Result<(), WireError> {
        let Some(daemon) = &self.daemon else {
            return Err(WireError::new(
                ErrorCode::BadRequest,
                "donate before register",
            ));
        };
        let pool_blocks = daemon.geometry.pool_blocks;
        let mut outcome = DonateOutcome::default();
        let mut seen = HashSet::with_capacity(blocks.len());
        let invalid = blocks.iter().find_map(|b| {
            if b.block >= pool_blocks {
                Some((b.block, "beyond the pool"))
            } else if !seen.insert(b.block) {
                Some((b.block, "named twice"))
            } else if self.releases.contains(b.block) {
                Some((b.block, "being released"))
            } else {
                None
            }
        });
        let prefix = if invalid.is_some() {
            Vec::new()
        } else {
            self.cached_prefix(blocks.iter().map(|b| &b.hash))
        };
        let rest = &blocks[prefix.len()..];
        let inconsistent = invalid.or_else(|| {
            rest.iter().find_map(|b| {
                if self.index.find(&b.hash).is_some() {
                    Some((b.block, "its hash is cached off the donated chain"))
                } else if self.index.holds_block(b.block) {
                    Some((b.block, "the cache holds it for another hash"))
                } else {
                    None
                }
            })
        });
        if let Some((block, why)) = inconsistent {
            if why == "being released" {
                // The daemon donated before it applied a release sent meanwhile (a finished
                // sequence still held the evicted block): a race of one engine step, not a lie.
                tracing::info!(
                    call,
                    blocks = blocks.len(),
                    block,
                    "donation refused: it names a block being released (the daemon had not \
                     applied the release yet)"
                );
            } else {
                tracing::warn!(
                    call,
                    blocks = blocks.len(),
                    cached_prefix = prefix.len(),
                    block,
                    why,
                    "donation refused: invalid or inconsistent block ids"
                );
            }
            self.refuse(
                &mut outcome,
                rest.iter().map(|b| b.block),
                RefuseReason::InvalidBlock,
            );
            outcome.already_cached = blocks[..prefix.len()].iter().map(|b| b.block).collect();
            self.outbox.push(CacheToDaemon::Donated { call, outcome });
            return Ok(());
        }
        outcome.already_cached = blocks[..prefix.len()].iter().map(|b| b.block).collect();
        self.index.touch_chain(&prefix, now);
        let mut new: Vec<DonatedBlock> = rest.to_vec();
        if new.is_empty() {
            outcome.pinned = self.pin_prefixes(&prefix, &pins, now);
            self.outbox.push(CacheToDaemon::Donated { call, outcome });
            return Ok(());
        }
        if self.pending.is_empty() && self.fits_now(new.len() as u64) {
            let chain = self.insert_chain(&prefix, &new, &mut outcome, now);
            outcome.pinned = self.pin_prefixes(&chain, &pins, now);
            self.outbox.push(CacheToDaemon::Donated { call, outcome });
            return Ok(());
        }
        // Make room: pin the prefix so eviction cannot take what the new blocks extend.
        self.index.pin_chain(&prefix, now);
        self.evict_for(new.len() as u64);
        let room = self.room_after_releases().min(new.len() as u64) as usize;
        if room < new.len() {
            let reason = if self.max_blocks_binds() {
                RefuseReason::MaxBlocks
            } else {
                RefuseReason::Capacity
            };
            let refused: Vec<BlockId> = new.drain(room..).map(|b| b.block).collect();
            self.refuse(&mut outcome, refused, reason);
        }
        self.flush_releases(now);
        if new.is_empty() {
            self.index.unpin_chain(&prefix, now);
            outcome.pinned = self.pin_prefixes(&prefix, &pins, now);
            self.outbox.push(CacheToDaemon::Donated { call, outcome });
            return Ok(());
        }
        self.reserved += new.len() as u64;
        let deadline = now + self.policy.release_timeout;
        self.pending.push_back(PendingDonation {
            call,
            prefix,
            new,
            pins,
            outcome,
            deadline,
        });
        self.admit_pending(now);
        Ok(())
    }

    fn refuse(
        &mut self,
        outcome: &mut DonateOutcome,
        blocks: impl IntoIterator<Item = BlockId>,
        reason: RefuseReason,
    ) {
        let before = outcome.refused.len();
        outcome.refused.extend(blocks);
        let n = (outcome.refused.len() - before) as u64;
        if n == 0 {
            return;
        }
        outcome.refused_reason = Some(reason);
        let r = &mut self.counters.rejected;
        *match reason {
            RefuseReason::Capacity => &mut r.capacity,
            RefuseReason::MaxBlocks => &mut r.max_blocks,
            RefuseReason::ReleaseTimeout => &mut r.release_timeout,
            RefuseReason::InvalidBlock => &mut r.invalid_block,
        } += n;
    }

    /// Adds `new` after `prefix`; a hash that another donation cached meanwhile counts as
    /// already cached. Leaves the whole chain most recently used, and returns it.
    fn insert_chain(
        &mut self,
        prefix: &[Slot],
        new: &[DonatedBlock],
        outcome: &mut DonateOutcome,
        now: Instant,
    ) -> Vec<Slot> {
        let mut chain = prefix.to_vec();
        for b in new {
            let parent = chain.last().copied();
            match self.index.find(&b.hash) {
                Some(s) if self.index.node(s).parent == parent => {
                    outcome.already_cached.push(b.block);
                    chain.push(s);
                }
                Some(_) => {
                    self.refuse(
                        outcome,
                        std::iter::once(b.block),
                        RefuseReason::InvalidBlock,
                    );
                    break;
                }
                None if self.index.holds_block(b.block) => {
                    self.refuse(
                        outcome,
                        std::iter::once(b.block),
                        RefuseReason::InvalidBlock,
                    );
                    break;
                }
                None => {
                    chain.push(self.index.insert(b.hash, b.block, parent, now));
                    outcome.retained.push(b.block);
                    self.counters.inserted += 1;
                }
            }
        }
        self.index.touch_chain(&chain, now);
        chain
    }

    /// Admits waiting donations, oldest first, as far as acknowledged releases allow.
    pub(super) fn admit_pending(&mut self, now: Instant) {
        while let Some(p) = self.pending.front() {
            if !self.fits_now(p.new.len() as u64) {
                break;
            }
            let Some(mut p) = self.pending.pop_front() else {
                break;
            };
            self.reserved -= p.new.len() as u64;
            let chain = self.insert_chain(&p.prefix, &p.new, &mut p.outcome, now);
            self.index.unpin_chain(&p.prefix, now);
            p.outcome.pinned = self.pin_prefixes(&chain, &p.pins, now);
            self.outbox.push(CacheToDaemon::Donated {
                call: p.call,
                outcome: p.outcome,
            });
        }
    }

    /// Refuses waiting donations whose deadline passed.
    pub(super) fn expire_pending(&mut self, now: Instant) {
        while self.pending.front().is_some_and(|p| p.deadline <= now) {
            let Some(mut p) = self.pending.pop_front() else {
                break;
            };
            self.reserved -= p.new.len() as u64;
            let blocks: Vec<BlockId> = p.new.iter().map(|b| b.block).collect();
            self.refuse(&mut p.outcome, blocks, RefuseReason::ReleaseTimeout);
            self.index.unpin_chain(&p.prefix, now);
            p.outcome.pinned = self.pin_prefixes(&p.prefix, &p.pins, now);
            tracing::warn!(
                call = p.call,
                "donation refused: the daemon did not acknowledge releases in time"
            );
            self.outbox.push(CacheToDaemon::Donated {
                call: p.call,
                outcome: p.outcome,
            });
        }
    }

    /// Evicts up to `blocks` unpinned blocks because the daemon's pool is short.
    pub fn reclaim(&mut self, blocks: u32, now: Instant) -> u32 {
        let mut done = 0;
        while done < blocks && self.evict_lru(EvictReason::Pressure) {
            done += 1;
        }
        self.flush_releases(now);
        done
    }

    /// The daemon released the blocks of `release`.
    pub fn release_ack(&mut self, release: ReleaseId, now: Instant) {
        if self.releases.ack(release).is_none() {
            tracing::debug!(
                release = release.0,
                "acknowledgement of an unknown or repeated release"
            );
        }
        self.admit_pending(now);
    }
}
