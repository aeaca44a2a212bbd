//! Pins: prefixes requests asked the cache to keep for a while (Anthropic's `cache_control`),
//! each until its deadline. Unlike a lease, a pin outlives its request; unlike the LRU, it
//! survives churn. Together they hold at most the policy's pin share of the cap: a new pin that
//! would pass it makes the oldest pins lapse first (their blocks stay cached, unpinned).

use std::collections::{HashMap, VecDeque};

use tokio::time::Instant;

use crate::index::Slot;

/// One pin: the chain it holds, first block to last, and until when.
#[derive(Debug)]
pub struct Pin {
    pub chain: Vec<Slot>,
    pub until: Instant,
}

/// Every live pin, oldest first.
#[derive(Debug, Default)]
pub struct Pins {
    live: VecDeque<Pin>,
    /// Pins holding each block (a block in several pinned chains counts once).
    holders: HashMap<Slot, u32>,
}

impl Pins {
    /// Distinct blocks held by pins.
    pub fn blocks(&self) -> u64 {
        self.holders.len() as u64
    }

    /// Live pins.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Blocks of `chain` no pin holds yet.
    pub fn unheld(&self, chain: &[Slot]) -> u64 {
        chain
            .iter()
            .filter(|s| !self.holders.contains_key(s))
            .count() as u64
    }

    /// Renews the pin on exactly `chain`, if there is one: its deadline becomes the later of
    /// the two and it becomes the newest.
    pub fn renew(&mut self, chain: &[Slot], until: Instant) -> bool {
        let Some(at) = self.live.iter().position(|p| p.chain == chain) else {
            return false;
        };
        if let Some(mut pin) = self.live.remove(at) {
            pin.until = pin.until.max(until);
            self.live.push_back(pin);
        }
        true
    }

    /// Records a new pin (the caller pinned its chain in the index).
    pub fn add(&mut self, chain: Vec<Slot>, until: Instant) {
        for &s in &chain {
            *self.holders.entry(s).or_insert(0) += 1;
        }
        self.live.push_back(Pin { chain, until });
    }

    /// Removes the oldest pin (the caller unpins its chain).
    pub fn pop_oldest(&mut self) -> Option<Pin> {
        let pin = self.live.pop_front()?;
        self.forget(&pin.chain);
        Some(pin)
    }

    /// Removes every pin whose deadline has passed.
    pub fn take_expired(&mut self, now: Instant) -> Vec<Pin> {
        let (expired, live): (Vec<Pin>, Vec<Pin>) =
            self.live.drain(..).partition(|p| p.until <= now);
        self.live = live.into();
        for p in &expired {
            self.forget(&p.chain);
        }
        expired
    }

    /// Forgets every pin (the daemon is gone; its blocks went with the index).
    pub fn clear(&mut self) {
        self.live.clear();
        self.holders.clear();
    }

    fn forget(&mut self, chain: &[Slot]) {
        for s in chain {
            if let Some(n) = self.holders.get_mut(s) {
                *n -= 1;
                if *n == 0 {
                    self.holders.remove(s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shared_blocks_count_once_and_renewal_makes_a_pin_the_newest() {
        let t = Instant::now();
        let mut pins = Pins::default();
        pins.add(vec![1, 2, 3], t + Duration::from_secs(300));
        pins.add(vec![1, 2, 4], t + Duration::from_secs(300));
        assert_eq!(pins.blocks(), 4);
        assert_eq!(pins.unheld(&[1, 2, 5, 6]), 2);
        assert!(pins.renew(&[1, 2, 3], t + Duration::from_secs(3600)));
        let oldest = pins.pop_oldest().unwrap();
        assert_eq!(oldest.chain, vec![1, 2, 4]);
        assert_eq!(pins.blocks(), 3);
        let expired = pins.take_expired(t + Duration::from_secs(600));
        assert!(expired.is_empty(), "renewed to an hour");
        assert_eq!(pins.take_expired(t + Duration::from_secs(3600)).len(), 1);
        assert_eq!(pins.blocks(), 0);
    }
}
