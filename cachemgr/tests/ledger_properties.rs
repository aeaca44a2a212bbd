//! Property tests: random sequences of register / acquire / donate / unlease / release acks /
//! evict / reclaim / tick against a model daemon that owns blocks the way the real one does.
//!
//! The model is the independent measure: it applies `Release` and `Donated` to its own refcounts,
//! and after every step the ledger must equal what the model really holds for the cache.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use mlxcel_cachemgr::{Cache, Policy};
use mlxcel_ipc::block_hash::{HashSeed, block_hashes};
use mlxcel_ipc::proto::admin::EvictSelector;
use mlxcel_ipc::proto::cache::{
    CacheToDaemon, CallId, DonatedBlock, Epoch, InventoryReport, LeaseId, ReleaseId,
};
use mlxcel_ipc::{BlockHash, BlockId, Dtype, Geometry};
use proptest::prelude::*;
use tokio::time::Instant;

const BLOCK_TOKENS: usize = 4;
const POOL: u32 = 96;

fn geometry() -> Geometry {
    Geometry {
        model_id: "model".into(),
        layers: 2,
        kv_heads: 1,
        head_dim: 8,
        dtype: Dtype::F16,
        block_tokens: BLOCK_TOKENS as u32,
        pool_blocks: POOL,
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Start a request: prompt = a family's shared prefix + a distinct tail.
    Start {
        family: u8,
        prefix_blocks: u8,
        tail_seed: u16,
        tail_blocks: u8,
    },
    /// Finish the n-th running request: donate, then unlease.
    Finish(usize),
    /// Cancel the n-th running request without donating.
    Cancel(usize),
    /// Acknowledge every release received so far.
    AckReleases,
    Evict(u8),
    Reclaim(u8),
    Advance(u16),
    Reconcile,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0u8..6, any::<u16>(), 0u8..4).prop_map(|(family, prefix_blocks, tail_seed, tail_blocks)| {
            Op::Start { family, prefix_blocks, tail_seed, tail_blocks }
        }),
        5 => (0usize..8).prop_map(Op::Finish),
        1 => (0usize..8).prop_map(Op::Cancel),
        3 => Just(Op::AckReleases),
        1 => (0u8..4).prop_map(Op::Evict),
        1 => (0u8..6).prop_map(Op::Reclaim),
        2 => (0u16..3000).prop_map(Op::Advance),
        1 => Just(Op::Reconcile),
    ]
}

/// A request in the model daemon: its chain and the blocks holding it (refs held).
struct Seq {
    hashes: Vec<BlockHash>,
    blocks: Vec<BlockId>,
    lease: Option<LeaseId>,
    /// Blocks of the chain the lease pins (the cached prefix at acquire time).
    leased: usize,
}

/// The model daemon: pool refcounts, cache references, running sequences.
struct ModelDaemon {
    refs: Vec<u32>,
    free: Vec<BlockId>,
    /// Blocks the cache holds a reference on, with the hash each holds.
    cache_held: HashMap<BlockId, BlockHash>,
    /// Parent of each hash seen.
    parent: HashMap<BlockHash, Option<BlockHash>>,
    /// Releases received and not yet applied: the daemon applies a release and acknowledges it
    /// in one step, later (its blocks stay real memory until then).
    unapplied: Vec<(ReleaseId, Vec<BlockId>)>,
    running: Vec<Seq>,
    /// Donations awaiting their reply: the sequence stays alive (refs held) until then.
    donating: HashMap<CallId, Seq>,
    /// Live leases' blocks: no release may ever name one.
    leased: HashMap<LeaseId, Vec<BlockId>>,
    /// Hash -> last time the model used it (acquire, donate, donation admitted, unlease).
    last_use: HashMap<BlockHash, Instant>,
    epoch: Epoch,
    next_call: CallId,
}

impl ModelDaemon {
    fn new(epoch: Epoch) -> Self {
        Self {
            refs: vec![0; POOL as usize],
            free: (0..POOL).rev().collect(),
            cache_held: HashMap::new(),
            parent: HashMap::new(),
            unapplied: Vec::new(),
            running: Vec::new(),
            donating: HashMap::new(),
            leased: HashMap::new(),
            last_use: HashMap::new(),
            epoch,
            next_call: 0,
        }
    }

    fn unref(&mut self, b: BlockId) {
        let r = &mut self.refs[b as usize];
        assert!(*r > 0, "refcount underflow on block {b}");
        *r -= 1;
        if *r == 0 {
            self.free.push(b);
        }
    }

    fn touch(&mut self, hashes: &[BlockHash], now: Instant) {
        for h in hashes {
            self.last_use.insert(*h, now);
        }
    }

    /// Unpinned cached leaves in the model's view (chains being donated count as pinned, by
    /// hash: the manager pins the cached prefix a donation extends, whatever block holds it).
    fn unpinned_leaves(&self) -> Vec<BlockHash> {
        let releasing = self.releasing_ids();
        let retained: HashMap<BlockId, BlockHash> = self
            .cache_held
            .iter()
            .filter(|(b, _)| !releasing.contains(b))
            .map(|(b, h)| (*b, *h))
            .collect();
        let held: HashSet<BlockHash> = retained.values().copied().collect();
        let leased: HashSet<BlockId> = self.leased.values().flatten().copied().collect();
        let donating: HashSet<BlockHash> = self
            .donating
            .values()
            .flat_map(|s| s.hashes.iter())
            .copied()
            .collect();
        let parents: HashSet<BlockHash> = held.iter().filter_map(|h| self.parent[h]).collect();
        retained
            .iter()
            .filter(|(b, h)| !leased.contains(b) && !donating.contains(h) && !parents.contains(h))
            .map(|(_, h)| *h)
            .collect()
    }

    /// Applies every received release and acknowledges it.
    fn apply_releases(&mut self, cache: &mut Cache, now: Instant) {
        for (release, blocks) in std::mem::take(&mut self.unapplied) {
            for b in blocks {
                self.cache_held.remove(&b);
                self.unref(b);
            }
            cache.release_ack(release, now);
        }
    }

    /// Blocks released but not yet applied.
    fn releasing_ids(&self) -> HashSet<BlockId> {
        self.unapplied
            .iter()
            .flat_map(|(_, b)| b.iter())
            .copied()
            .collect()
    }

    /// Applies the manager's messages, in order, as the real daemon must.
    fn apply(
        &mut self,
        cache: &mut Cache,
        now: Instant,
        check_lru: bool,
    ) -> Result<(), TestCaseError> {
        let mut evicted: Vec<BlockHash> = Vec::new();
        loop {
            let msgs = cache.drain_outbox();
            if msgs.is_empty() {
                break;
            }
            for msg in msgs {
                match msg {
                    CacheToDaemon::Release { release, blocks } => {
                        for &b in &blocks {
                            let leased = self.leased.values().any(|l| l.contains(&b));
                            prop_assert!(!leased, "release of leased block {}", b);
                            let h = self.cache_held.get(&b);
                            prop_assert!(
                                h.is_some(),
                                "release of block {} the cache does not hold",
                                b
                            );
                            evicted.extend(h);
                        }
                        self.unapplied.push((release, blocks));
                    }
                    CacheToDaemon::Donated { call, outcome } => {
                        let seq = self
                            .donating
                            .remove(&call)
                            .expect("reply to a known donation");
                        let hash_of: HashMap<BlockId, BlockHash> = seq
                            .blocks
                            .iter()
                            .copied()
                            .zip(seq.hashes.iter().copied())
                            .collect();
                        for b in &outcome.retained {
                            self.refs[*b as usize] += 1;
                            let prev = self.cache_held.insert(*b, hash_of[b]);
                            prop_assert!(prev.is_none(), "block {} retained twice", b);
                        }
                        let n = outcome.retained.len() + outcome.already_cached.len();
                        self.touch(&seq.hashes[..n.min(seq.hashes.len())], now);
                        for b in seq.blocks {
                            self.unref(b);
                        }
                    }
                    CacheToDaemon::InventoryRequest { inventory } => {
                        // In-order processing: releases sent before the request are applied first.
                        self.apply_releases(cache, now);
                        let report = InventoryReport {
                            epoch: self.epoch,
                            cache_blocks: self.cache_held.keys().copied().collect(),
                            pool_blocks: POOL,
                            free_blocks: self.free.len() as u32,
                            pool_bytes_measured: geometry().pool_bytes().unwrap(),
                            engine_active_bytes: 0,
                        };
                        let r = cache.inventory(inventory, report, now);
                        prop_assert_eq!(r.map(|r| r.report.drift_bytes), Some(0));
                    }
                    other => prop_assert!(false, "unexpected message {:?}", other),
                }
            }
        }
        if check_lru && !evicted.is_empty() {
            let newest_evicted = evicted.iter().map(|h| self.last_use[h]).max();
            let oldest_kept = self
                .unpinned_leaves()
                .iter()
                .map(|h| self.last_use[h])
                .min();
            if let (Some(e), Some(k)) = (newest_evicted, oldest_kept) {
                prop_assert!(
                    e <= k,
                    "evicted a block used more recently than a kept unpinned leaf"
                );
            }
        }
        Ok(())
    }
}

fn run(capacity_blocks: u64, max_blocks: Option<u64>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let bb = geometry().block_bytes().unwrap();
    let policy = Policy {
        capacity_bytes: capacity_blocks * bb + bb / 2,
        max_blocks,
        idle_ttl: None,
        lease_timeout: Duration::from_secs(24 * 3600),
        release_timeout: Duration::from_secs(3600),
        reconcile_interval: None,
        ..Policy::default()
    };
    let mut cache = Cache::new(policy);
    let mut now = Instant::now();
    let (epoch, block_bytes) = cache.register(1, geometry(), now).unwrap();
    prop_assert_eq!(block_bytes, bb);
    let mut d = ModelDaemon::new(epoch);
    let seed = HashSeed::new(&mlxcel_ipc::HashKey([0; 32]), "model", None);

    for op in ops {
        now += Duration::from_millis(1);
        let mut check_lru = false;
        match op {
            Op::Start {
                family,
                prefix_blocks,
                tail_seed,
                tail_blocks,
            } => {
                let mut tokens: Vec<u32> = (0..prefix_blocks as u32 * BLOCK_TOKENS as u32)
                    .map(|i| u32::from(family) * 1000 + i)
                    .collect();
                tokens.extend(
                    (0..tail_blocks as u32 * BLOCK_TOKENS as u32 + 1)
                        .map(|i| 100_000 + u32::from(tail_seed) * 64 + i),
                );
                let hashes = block_hashes(&seed, &tokens, BLOCK_TOKENS);
                let mut parent = None;
                for h in &hashes {
                    d.parent.insert(*h, parent);
                    parent = Some(*h);
                }
                let (lease, cached) = cache.acquire(&hashes, now);
                prop_assert_eq!(lease.is_some(), !cached.is_empty());
                for &b in &cached {
                    prop_assert!(
                        d.cache_held.contains_key(&b),
                        "acquire returned block {} not held for the cache",
                        b
                    );
                    d.refs[b as usize] += 1;
                }
                d.touch(&hashes[..cached.len()], now);
                let cached_len = cached.len();
                let mut blocks = cached.clone();
                for _ in cached.len()..hashes.len() {
                    match d.free.pop() {
                        Some(b) => {
                            d.refs[b as usize] = 1;
                            blocks.push(b);
                        }
                        None => break,
                    }
                }
                if let Some(l) = lease {
                    d.leased.insert(l, cached);
                }
                if blocks.len() < hashes.len() {
                    // Pool exhausted: the request fails; give everything back.
                    for b in blocks {
                        d.unref(b);
                    }
                    if let Some(l) = lease {
                        d.leased.remove(&l);
                        cache.unlease(l, now);
                    }
                } else {
                    let leased = cached_len;
                    d.running.push(Seq {
                        hashes,
                        blocks,
                        lease,
                        leased,
                    });
                }
            }
            Op::Finish(i) if i < d.running.len() => {
                let seq = d.running.remove(i);
                d.next_call += 1;
                let call = d.next_call;
                let donated: Vec<DonatedBlock> = seq
                    .hashes
                    .iter()
                    .zip(&seq.blocks)
                    .map(|(&hash, &block)| DonatedBlock { hash, block })
                    .collect();
                d.touch(&seq.hashes, now);
                let lease = seq.lease;
                d.donating.insert(call, seq);
                cache
                    .donate(call, donated, Vec::new(), now)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if let Some(l) = lease {
                    d.leased.remove(&l);
                    cache.unlease(l, now);
                }
                check_lru = true;
            }
            Op::Cancel(i) if i < d.running.len() => {
                let seq = d.running.remove(i);
                if let Some(l) = seq.lease {
                    d.leased.remove(&l);
                    cache.unlease(l, now);
                    // Unpinning counts as a use: the lease held the prefix until now.
                    d.touch(&seq.hashes[..seq.leased], now);
                }
                for b in seq.blocks {
                    d.unref(b);
                }
            }
            Op::Finish(_) | Op::Cancel(_) => {}
            Op::AckReleases => d.apply_releases(&mut cache, now),
            Op::Evict(k) => {
                let selector = match k {
                    0 => EvictSelector::All,
                    1 => EvictSelector::ToBytes(bb * 3),
                    2 => EvictSelector::OlderThanMs(500),
                    _ => EvictSelector::Entry("0000".into()),
                };
                check_lru = matches!(selector, EvictSelector::All | EvictSelector::ToBytes(_));
                let _ = cache.evict(&selector, now);
            }
            Op::Reclaim(n) => {
                cache.reclaim(u32::from(n), now);
                check_lru = true;
            }
            Op::Advance(ms) => {
                now += Duration::from_millis(u64::from(ms));
                cache.tick(now);
            }
            Op::Reconcile => {
                cache.request_inventory(now);
            }
        }
        d.apply(&mut cache, now, check_lru)?;
        cache.check_invariants().map_err(TestCaseError::fail)?;

        // The ledger equals what the model daemon really holds for the cache, block for block:
        // retained + releasing is exactly the memory the daemon holds a cache reference on.
        let stats = cache.stats(now);
        let releasing = d.unapplied.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        prop_assert_eq!(
            stats.used_bytes + stats.releasing_bytes,
            d.cache_held.len() as u64 * bb
        );
        prop_assert_eq!(stats.releasing_bytes, releasing * bb);
        prop_assert_eq!(stats.blocks * bb, stats.used_bytes);
        prop_assert!(stats.used_bytes + stats.releasing_bytes <= stats.capacity_bytes);
        if let Some(m) = max_blocks {
            prop_assert!(stats.blocks <= m);
        }
        // No donation was refused as invalid: the model daemon never misuses block ids.
        prop_assert_eq!(stats.rejected_blocks.invalid_block, 0);
        // Shared prefixes are stored (and counted) once.
        let releasing_ids = d.releasing_ids();
        let retained: Vec<&BlockHash> = d
            .cache_held
            .iter()
            .filter(|(b, _)| !releasing_ids.contains(b))
            .map(|(_, h)| h)
            .collect();
        let distinct: HashSet<&BlockHash> = retained.iter().copied().collect();
        prop_assert_eq!(distinct.len(), retained.len());
        // Pinned bytes are a subset of used bytes.
        prop_assert!(stats.pinned_bytes <= stats.used_bytes);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn ledger_matches_the_daemon_and_never_exceeds_capacity(
        capacity_blocks in 2u64..40,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(capacity_blocks, None, ops)?;
    }

    #[test]
    fn max_blocks_is_a_second_cap(
        capacity_blocks in 10u64..40,
        max in 1u64..12,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(capacity_blocks, Some(max), ops)?;
    }
}
