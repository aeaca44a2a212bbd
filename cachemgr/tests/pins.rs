//! Prefixes pinned by requests (Anthropic's `cache_control`): they survive evictions that take
//! every unpinned block, never hold more than the pin share of the cap (the oldest lapses
//! first), and unpin at their deadline; the donation's outcome says how much was pinned.

use std::time::Duration;

use mlxcel_cachemgr::{Cache, Policy};
use mlxcel_ipc::block_hash::{HashSeed, block_hashes};
use mlxcel_ipc::proto::admin::EvictSelector;
use mlxcel_ipc::proto::cache::{CacheToDaemon, DonatedBlock, PinRequest};
use mlxcel_ipc::{Dtype, Geometry};
use tokio::time::Instant;

const BLOCK_TOKENS: usize = 4;

fn geometry() -> Geometry {
    Geometry {
        model_id: "model".into(),
        layers: 2,
        kv_heads: 1,
        head_dim: 8,
        dtype: Dtype::F16,
        block_tokens: BLOCK_TOKENS as u32,
        pool_blocks: 256,
    }
}

struct Harness {
    cache: Cache,
    now: Instant,
    next_block: u32,
    next_call: u64,
    bb: u64,
}

impl Harness {
    fn new(capacity_blocks: u64) -> Self {
        let bb = geometry().block_bytes().unwrap();
        let mut cache = Cache::new(Policy {
            capacity_bytes: capacity_blocks * bb,
            reconcile_interval: None,
            ..Policy::default()
        });
        let now = Instant::now();
        cache.register(1, geometry(), now).unwrap();
        Self {
            cache,
            now,
            next_block: 0,
            next_call: 0,
            bb,
        }
    }

    /// Donates a chain of `blocks` blocks of prompt `family`, pinning its first `pin` for
    /// `ttl`; returns how many blocks the outcome says are pinned.
    fn donate(&mut self, family: u32, blocks: usize, pin: u32, ttl: u32) -> u32 {
        let tokens: Vec<u32> = (0..(blocks * BLOCK_TOKENS) as u32)
            .map(|i| family * 10_000 + i)
            .collect();
        let seed = HashSeed::new(&mlxcel_ipc::HashKey([0; 32]), "model", None);
        let donated: Vec<DonatedBlock> = block_hashes(&seed, &tokens, BLOCK_TOKENS)
            .into_iter()
            .map(|hash| {
                self.next_block += 1;
                DonatedBlock {
                    hash,
                    block: self.next_block,
                }
            })
            .collect();
        self.next_call += 1;
        let pins = vec![PinRequest {
            blocks: pin,
            ttl_secs: ttl,
        }];
        self.cache
            .donate(self.next_call, donated, pins, self.now)
            .unwrap();
        self.cache.check_invariants().unwrap();
        // Acknowledge the releases that make room, as the daemon would, until the outcome.
        for _ in 0..4 {
            for m in self.cache.drain_outbox() {
                match m {
                    CacheToDaemon::Donated { outcome, .. } => return outcome.pinned,
                    CacheToDaemon::Release { release, .. } => {
                        self.cache.release_ack(release, self.now)
                    }
                    _ => {}
                }
            }
        }
        panic!("no outcome")
    }

    fn blocks(&self) -> u64 {
        self.cache.stats(self.now).blocks
    }
}

#[test]
fn a_pinned_prefix_survives_an_eviction_of_everything_unpinned() {
    let mut h = Harness::new(64);
    assert_eq!(h.donate(1, 8, 4, 300), 4);
    h.donate(2, 8, 0, 300);
    assert_eq!(h.blocks(), 16);
    h.cache.evict(&EvictSelector::All, h.now).unwrap();
    assert_eq!(h.blocks(), 4, "only the pinned prefix stays");
    let stats = h.cache.stats(h.now);
    assert_eq!(stats.pins, 1);
    assert_eq!(stats.pinned_by_requests_bytes, 4 * h.bb);
}

#[test]
fn pins_stay_within_their_share_and_the_oldest_lapses_first() {
    // 20 blocks, half for pins: 10.
    let mut h = Harness::new(20);
    assert_eq!(h.donate(1, 6, 6, 300), 6);
    assert_eq!(
        h.donate(2, 6, 6, 300),
        6,
        "the first pin lapses to make room"
    );
    let stats = h.cache.stats(h.now);
    assert_eq!((stats.pins, stats.pins_lapsed), (1, 1));
    // One pin larger than the share is cut to it.
    assert_eq!(h.donate(3, 14, 14, 300), 10);
    // The same prefix again renews its pin rather than adding one.
    assert_eq!(h.donate(3, 14, 14, 3600), 10);
    assert_eq!(h.cache.stats(h.now).pins, 1);
}

#[test]
fn pins_unpin_at_their_deadline() {
    let mut h = Harness::new(64);
    h.donate(1, 4, 4, 1);
    h.now += Duration::from_secs(2);
    h.cache.tick(h.now);
    let stats = h.cache.stats(h.now);
    assert_eq!((stats.pins, stats.pins_expired), (0, 1));
    h.cache.evict(&EvictSelector::All, h.now).unwrap();
    assert_eq!(h.blocks(), 0);
}
