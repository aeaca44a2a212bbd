//! Timers: run once a second (and in tests on paused time) so limits hold even when nobody calls.

use tokio::time::Instant;

use super::{Cache, EvictReason};
use mlxcel_ipc::proto::cache::CacheToDaemon;

impl Cache {
    /// Expires idle blocks and leases, retries unacknowledged releases, refuses donations that
    /// waited too long, admits those that now fit, enforces the limits, and asks for an inventory
    /// when one is due.
    pub fn tick(&mut self, now: Instant) {
        if let Some(ttl) = self.policy.idle_ttl
            && let Some(cutoff) = now.checked_sub(ttl)
        {
            while let Some(slot) = self.index.lru_leaf() {
                if self.index.node(slot).last_used > cutoff {
                    break;
                }
                self.evict_slot(slot, EvictReason::Ttl);
            }
        }
        while let Some(lease) = self.leases.pop_expired(now) {
            self.counters.expired_leases += 1;
            tracing::warn!(blocks = lease.chain.len(), "lease expired; unpinning");
            self.index.unpin_chain(&lease.chain, now);
        }
        self.expire_pins(now);
        for (release, blocks) in self
            .releases
            .due_for_retry(now, self.policy.release_timeout)
        {
            self.counters.release_retries += 1;
            tracing::warn!(
                release = release.0,
                blocks = blocks.len(),
                "release not acknowledged; sending again"
            );
            self.outbox.push(CacheToDaemon::Release { release, blocks });
        }
        self.expire_pending(now);
        self.admit_pending(now);
        self.enforce_limits();
        self.flush_releases(now);
        if let Some(every) = self.policy.reconcile_interval {
            let due = match (self.reconcile.outstanding_since(), self.reconcile.last_at) {
                // An unanswered request is abandoned after a few intervals.
                (Some(sent), _) => now.duration_since(sent) >= every * 4,
                (None, Some(last)) => now.duration_since(last) >= every,
                (None, None) => self
                    .daemon
                    .as_ref()
                    .is_some_and(|d| now.duration_since(d.registered_at) >= every),
            };
            if due {
                self.reconcile.forget_outstanding();
                self.request_inventory(now);
            }
        }
    }
}
