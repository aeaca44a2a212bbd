//! Prefixes pinned by requests (`cache_control`): pinned when their donation is settled, kept
//! until their deadline, and never more than the pin share of the cap (the oldest lapse first).

use std::time::Duration;

use mlxcel_ipc::proto::cache::PinRequest;
use tokio::time::Instant;

use super::Cache;
use crate::index::Slot;

impl Cache {
    /// Pins the first blocks of `chain` (a donated chain, as far as it is cached) as `pins`
    /// ask; returns the longest prefix pinned, in blocks.
    pub(super) fn pin_prefixes(
        &mut self,
        chain: &[Slot],
        pins: &[PinRequest],
        now: Instant,
    ) -> u32 {
        let share = (self.cap_blocks() as f64 * self.policy.pin_share.clamp(0.0, 1.0)) as u64;
        let mut longest = 0;
        for pin in pins {
            let len = (pin.blocks as usize).min(chain.len()).min(share as usize);
            if len == 0 {
                continue;
            }
            let prefix = &chain[..len];
            let until = now + Duration::from_secs(u64::from(pin.ttl_secs));
            if !self.pins.renew(prefix, until) {
                while self.pins.blocks() + self.pins.unheld(prefix) > share {
                    let Some(old) = self.pins.pop_oldest() else {
                        break;
                    };
                    self.counters.pins_lapsed += 1;
                    tracing::info!(
                        blocks = old.chain.len(),
                        "a pinned prefix lapsed early: pins are over their share of the cap"
                    );
                    self.index.unpin_chain(&old.chain, now);
                }
                self.index.pin_chain(prefix, now);
                self.pins.add(prefix.to_vec(), until);
            }
            longest = longest.max(len as u32);
        }
        longest
    }

    /// Unpins prefixes whose deadline passed (their blocks stay cached, least recently used
    /// among their peers by their own last use).
    pub(super) fn expire_pins(&mut self, now: Instant) {
        for pin in self.pins.take_expired(now) {
            self.counters.pins_expired += 1;
            self.index.unpin_chain(&pin.chain, now);
        }
    }
}
