//! Releases the daemon has been told about and not yet acknowledged.
//!
//! Their blocks are still real memory, so the ledger keeps counting them (`releasing_bytes`)
//! until the acknowledgement arrives. A release not acknowledged in time is sent again under the
//! same id (the daemon treats a repeated id as done).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use mlxcel_ipc::BlockId;
use mlxcel_ipc::proto::cache::ReleaseId;
use tokio::time::Instant;

/// One batch of blocks sent in one `Release`.
#[derive(Debug)]
pub struct ReleaseBatch {
    pub blocks: Vec<BlockId>,
    pub sent_at: Instant,
}

/// Outstanding releases.
#[derive(Debug, Default)]
pub struct Releases {
    batches: BTreeMap<ReleaseId, ReleaseBatch>,
    blocks: HashSet<BlockId>,
    next: u64,
}

impl Releases {
    /// Records a new release of `blocks` sent `now`.
    pub fn open(&mut self, blocks: Vec<BlockId>, now: Instant) -> ReleaseId {
        self.next += 1;
        let id = ReleaseId(self.next);
        self.blocks.extend(blocks.iter().copied());
        self.batches.insert(
            id,
            ReleaseBatch {
                blocks,
                sent_at: now,
            },
        );
        id
    }

    /// The daemon acknowledged `id`; returns how many blocks it freed from the cache's count.
    pub fn ack(&mut self, id: ReleaseId) -> Option<u64> {
        let batch = self.batches.remove(&id)?;
        for b in &batch.blocks {
            self.blocks.remove(b);
        }
        Some(batch.blocks.len() as u64)
    }

    /// Blocks awaiting acknowledgement.
    pub fn blocks(&self) -> u64 {
        self.blocks.len() as u64
    }

    /// Whether `block` is awaiting acknowledgement.
    pub fn contains(&self, block: BlockId) -> bool {
        self.blocks.contains(&block)
    }

    /// Batches sent more than `timeout` ago: marks them sent again `now` and returns them.
    pub fn due_for_retry(
        &mut self,
        now: Instant,
        timeout: Duration,
    ) -> Vec<(ReleaseId, Vec<BlockId>)> {
        let mut out = Vec::new();
        for (id, batch) in self.batches.iter_mut() {
            if batch.sent_at + timeout <= now {
                batch.sent_at = now;
                out.push((*id, batch.blocks.clone()));
            }
        }
        out
    }

    /// Forgets everything (the daemon is gone).
    pub fn clear(&mut self) {
        self.batches.clear();
        self.blocks.clear();
    }
}
