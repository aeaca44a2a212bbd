//! Leases: pins on cached prefixes held for running requests.
//!
//! Every lease has the same timeout, so leases expire in the order they were made and a FIFO
//! queue of deadlines is enough (no timer per lease, no scan).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use mlxcel_ipc::proto::cache::LeaseId;
use tokio::time::Instant;

use crate::index::Slot;

/// One lease: the pinned chain, first block to last.
#[derive(Debug)]
pub struct Lease {
    pub chain: Vec<Slot>,
}

/// All live leases.
#[derive(Debug, Default)]
pub struct Leases {
    live: HashMap<LeaseId, Lease>,
    deadlines: VecDeque<(Instant, LeaseId)>,
    next: u64,
}

impl Leases {
    /// Records a lease on `chain` that expires `timeout` from `now`.
    pub fn open(&mut self, chain: Vec<Slot>, now: Instant, timeout: Duration) -> LeaseId {
        self.next += 1;
        let id = LeaseId(self.next);
        self.live.insert(id, Lease { chain });
        self.deadlines.push_back((now + timeout, id));
        id
    }

    /// Ends a lease, returning its chain to unpin (None if it already ended).
    pub fn close(&mut self, id: LeaseId) -> Option<Lease> {
        self.live.remove(&id)
    }

    /// Pops the next lease whose deadline has passed.
    pub fn pop_expired(&mut self, now: Instant) -> Option<Lease> {
        while let Some(&(deadline, id)) = self.deadlines.front() {
            if deadline > now {
                return None;
            }
            self.deadlines.pop_front();
            if let Some(lease) = self.live.remove(&id) {
                return Some(lease);
            }
        }
        None
    }

    /// Live leases.
    pub fn len(&self) -> u64 {
        self.live.len() as u64
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Forgets every lease (the daemon is gone; its pins went with the index).
    pub fn clear(&mut self) {
        self.live.clear();
        self.deadlines.clear();
    }
}
