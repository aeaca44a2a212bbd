//! Reconciliation: compare the ledger with what the daemon really holds.
//!
//! When the manager sends `InventoryRequest`, it snapshots the block ids it retains. The daemon
//! handles manager messages in order, so its report reflects exactly the messages sent before the
//! request: every release sent before it has been applied, every later one has not. The snapshot
//! and the report must therefore be the same set. Drift is counted block for block (ids in one set
//! and not the other) and fixed: blocks the daemon does not hold leave the ledger, blocks it
//! holds that the ledger does not know are released (and counted as releasing until acknowledged).

use mlxcel_ipc::BlockId;
use mlxcel_ipc::proto::admin::ReconcileReport;
use mlxcel_ipc::proto::cache::{CacheToDaemon, InventoryReport};
use tokio::time::Instant;

use super::{Cache, EvictReason};

/// Reconciliation bookkeeping.
#[derive(Debug, Default)]
pub(super) struct State {
    next_id: u64,
    outstanding: Option<Outstanding>,
    pub(super) last_at: Option<Instant>,
    pub(super) drift_blocks: u64,
    pub(super) pool_bytes_measured: Option<u64>,
    pub(super) engine_active_bytes: Option<u64>,
    pub(super) free_blocks: Option<u64>,
    /// Inventory reports refused as impossible for the registered pool.
    pub(super) rejected_reports: u64,
}

#[derive(Debug)]
struct Outstanding {
    id: u64,
    expected: Vec<BlockId>,
    sent_at: Instant,
}

impl State {
    pub(super) fn forget_outstanding(&mut self) {
        self.outstanding = None;
    }

    pub(super) fn outstanding_since(&self) -> Option<Instant> {
        self.outstanding.as_ref().map(|o| o.sent_at)
    }
}

/// The result of one reconciliation, for whoever asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    pub inventory: u64,
    pub report: ReconcileReport,
}

impl Cache {
    /// Asks the daemon for its inventory (unless a request is already out). Returns the request
    /// id to wait for, or None with no daemon.
    pub fn request_inventory(&mut self, now: Instant) -> Option<u64> {
        self.daemon.as_ref()?;
        if let Some(o) = &self.reconcile.outstanding {
            return Some(o.id);
        }
        self.reconcile.next_id += 1;
        let id = self.reconcile.next_id;
        let mut expected: Vec<BlockId> = self.index.iter().map(|(_, n)| n.block).collect();
        expected.sort_unstable();
        self.reconcile.outstanding = Some(Outstanding {
            id,
            expected,
            sent_at: now,
        });
        self.outbox
            .push(CacheToDaemon::InventoryRequest { inventory: id });
        Some(id)
    }

    /// The daemon answered inventory request `id`.
    pub fn inventory(
        &mut self,
        id: u64,
        report: InventoryReport,
        now: Instant,
    ) -> Option<Reconciled> {
        let daemon = self.daemon.as_ref()?;
        let bb = daemon.block_bytes;
        if self.reconcile.outstanding.as_ref().map(|o| o.id) != Some(id) {
            tracing::debug!(id, "inventory for a request that is no longer outstanding");
            return None;
        }
        let expected = self
            .reconcile
            .outstanding
            .take()
            .map(|o| o.expected)
            .unwrap_or_default();
        if let Err(why) = plausible(&report, daemon.geometry.pool_blocks) {
            // A report no pool of this geometry could give: nothing in it is acted on.
            tracing::error!(%why, "the daemon's inventory report is impossible; refused");
            self.reconcile.rejected_reports += 1;
            return None;
        }
        if report.epoch != daemon.epoch {
            tracing::warn!(
                daemon = report.epoch.0,
                ours = daemon.epoch.0,
                "daemon reports another epoch"
            );
        }
        let mut held = report.cache_blocks;
        held.sort_unstable();
        held.dedup();
        let (missing, extra) = sorted_difference(&expected, &held);
        let drift_blocks = (missing.len() + extra.len()) as u64;
        self.reconcile.last_at = Some(now);
        self.reconcile.drift_blocks = drift_blocks;
        self.reconcile.pool_bytes_measured = Some(report.pool_bytes_measured);
        self.reconcile.engine_active_bytes = Some(report.engine_active_bytes);
        self.reconcile.free_blocks = Some(u64::from(report.free_blocks));
        let expected_pool = daemon.geometry.pool_bytes().unwrap_or(0);
        // The pool takes memory as blocks are used: what it measures is at most its ceiling
        // and at least the blocks it holds for the cache.
        let cached_bytes = held.len() as u64 * bb;
        if report.pool_bytes_measured > expected_pool || report.pool_bytes_measured < cached_bytes {
            tracing::warn!(
                measured = report.pool_bytes_measured,
                ceiling = expected_pool,
                cached = cached_bytes,
                "the daemon's measured pool bytes are outside [cached blocks, pool blocks] x block bytes"
            );
        }
        if drift_blocks > 0 {
            tracing::error!(
                missing = missing.len(),
                extra = extra.len(),
                drift_bytes = drift_blocks * bb,
                "ledger and daemon inventory disagree; resyncing"
            );
            self.drop_missing(&missing);
            if !extra.is_empty() {
                let release = self.releases.open(extra.clone(), now);
                self.outbox.push(CacheToDaemon::Release {
                    release,
                    blocks: extra,
                });
            }
            self.flush_releases(now);
        }
        let report = ReconcileReport {
            ledger_bytes: expected.len() as u64 * bb,
            inventory_bytes: held.len() as u64 * bb,
            drift_bytes: drift_blocks * bb,
        };
        Some(Reconciled {
            inventory: id,
            report,
        })
    }

    /// Removes blocks the daemon does not hold, with every unpinned descendant (a chain cannot
    /// be used past a hole). Pinned ones stay until their leases end.
    fn drop_missing(&mut self, missing: &[BlockId]) {
        let mut doomed: Vec<(u32, crate::index::Slot)> = Vec::new();
        let mut is_doomed = std::collections::HashSet::new();
        let mut nodes: Vec<_> = self
            .index
            .iter()
            .map(|(s, n)| (n.depth, s, n.parent, n.block))
            .collect();
        nodes.sort_unstable_by_key(|n| n.0);
        for (depth, slot, parent, block) in nodes {
            if missing.binary_search(&block).is_ok()
                || parent.is_some_and(|p| is_doomed.contains(&p))
            {
                is_doomed.insert(slot);
                doomed.push((depth, slot));
            }
        }
        doomed.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
        for (_, slot) in doomed {
            let n = self.index.node(slot);
            if n.pins > 0 || n.children > 0 {
                continue;
            }
            if missing.binary_search(&n.block).is_ok() {
                // Gone already: nothing to release.
                let node = self.index.remove_leaf(slot);
                self.count_eviction(EvictReason::Drift);
                tracing::warn!(
                    block = node.block,
                    "dropped from the ledger: the daemon does not hold it"
                );
            } else {
                // Held, but unreachable past the hole: release it like any eviction.
                self.evict_slot(slot, EvictReason::Drift);
            }
        }
    }
}

/// Elements of `a` not in `b`, and of `b` not in `a` (both sorted, deduplicated).
fn sorted_difference(a: &[BlockId], b: &[BlockId]) -> (Vec<BlockId>, Vec<BlockId>) {
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                only_a.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                only_b.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
        }
    }
    only_a.extend_from_slice(&a[i..]);
    only_b.extend_from_slice(&b[j..]);
    (only_a, only_b)
}

/// Whether an inventory report fits the registered pool of `pool_blocks` blocks: the same pool
/// size, at most that many free blocks, and cache blocks that are distinct ids inside the pool.
fn plausible(report: &InventoryReport, pool_blocks: u32) -> Result<(), String> {
    if report.pool_blocks != pool_blocks {
        return Err(format!(
            "a pool of {} blocks, registered with {pool_blocks}",
            report.pool_blocks
        ));
    }
    if report.free_blocks > pool_blocks {
        return Err(format!(
            "{} free blocks of {pool_blocks}",
            report.free_blocks
        ));
    }
    if let Some(b) = report.cache_blocks.iter().find(|&&b| b >= pool_blocks) {
        return Err(format!("cache block {b} outside a pool of {pool_blocks}"));
    }
    let mut ids = report.cache_blocks.clone();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err("a cache block listed twice".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{InventoryReport, plausible, sorted_difference};
    use mlxcel_ipc::proto::cache::Epoch;

    #[test]
    fn difference_of_sorted_sets() {
        assert_eq!(
            sorted_difference(&[1, 2, 4, 7], &[2, 3, 7, 9]),
            (vec![1, 4], vec![3, 9])
        );
        assert_eq!(sorted_difference(&[], &[5]), (vec![], vec![5]));
    }

    #[test]
    fn an_inventory_no_pool_of_the_geometry_could_give_is_refused() {
        let report = |pool_blocks, free_blocks, cache_blocks: &[u32]| InventoryReport {
            epoch: Epoch(1),
            cache_blocks: cache_blocks.to_vec(),
            pool_blocks,
            free_blocks,
            pool_bytes_measured: 0,
            engine_active_bytes: 0,
        };
        assert_eq!(plausible(&report(64, 60, &[0, 3, 63]), 64), Ok(()));
        let e = |r: InventoryReport| plausible(&r, 64).unwrap_err();
        assert!(e(report(65, 0, &[])).contains("registered with 64"));
        assert!(e(report(64, 65, &[])).contains("65 free blocks"));
        assert!(e(report(64, 0, &[64])).contains("cache block 64 outside"));
        assert!(e(report(64, 0, &[5, 1, 5])).contains("twice"));
    }
}
