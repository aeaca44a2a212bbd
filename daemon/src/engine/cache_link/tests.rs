use std::collections::HashMap;

use mlxcel_ipc::proto::cache::DonateOutcome;
use mlxcel_ipc::{BlockHash, BlockId, HashSeed, block_hash::block_hashes};

use super::*;

/// References per block, as the pool would count them.
#[derive(Default)]
struct Counts(HashMap<BlockId, i64>);

impl Refcounts for Counts {
    fn retain(&mut self, block: BlockId) {
        *self.0.entry(block).or_default() += 1;
    }
    fn release(&mut self, block: BlockId) {
        *self.0.entry(block).or_default() -= 1;
    }
}

impl Counts {
    fn of(&self, block: BlockId) -> i64 {
        self.0.get(&block).copied().unwrap_or(0)
    }
}

fn hashes(seed: u32, blocks: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..blocks as u32 * 4).map(|t| seed * 1000 + t).collect();
    block_hashes(
        &HashSeed::new(&mlxcel_ipc::HashKey([0; 32]), "m", None),
        &tokens,
        4,
    )
}

/// A link holding `blocks` for the cache under `hashes`, as after an accepted donation.
fn holding(blocks: &[BlockId], hashes: &[BlockHash]) -> CacheLink {
    let mut link = CacheLink::default();
    for (&b, &h) in blocks.iter().zip(hashes) {
        link.held.insert(b, h);
    }
    link
}

#[test]
fn a_prefix_maps_only_blocks_held_under_its_own_hashes() {
    let mine = hashes(1, 3);
    let theirs = hashes(2, 2);
    let mut link = holding(&[10, 11, 12], &mine);
    link.held.insert(20, theirs[0]);
    let mut pool = Counts::default();
    assert_eq!(
        link.map_prefix(&mut pool, &mine, &[10, 11, 12], 3, None),
        [10, 11, 12]
    );
    assert_eq!((pool.of(10), pool.of(12), link.refused()), (1, 1, 0));
    // At most `usable` blocks.
    assert_eq!(
        link.map_prefix(&mut pool, &mine, &[10, 11, 12], 1, None),
        [10]
    );
    // Another prefix's block at position 1: the prefix stops before it, both ids counted.
    assert_eq!(
        link.map_prefix(&mut pool, &mine, &[10, 20, 12], 3, None),
        [10]
    );
    assert_eq!(link.refused(), 2);
    // Out of range / never donated.
    assert!(
        link.map_prefix(&mut pool, &mine, &[999_999], 3, None)
            .is_empty()
    );
    assert_eq!((link.refused(), pool.of(20), pool.of(999_999)), (3, 0, 0));
    // More ids than hashes.
    assert_eq!(
        link.map_prefix(&mut pool, &mine[..1], &[10, 11], 3, None),
        [10]
    );
    assert_eq!(link.refused(), 4);
}

#[test]
fn a_donation_outcome_retains_only_offered_blocks_and_frees_the_sequence() {
    let h = hashes(3, 2);
    let mut link = CacheLink::default();
    let offered = vec![
        DonatedBlock {
            hash: h[0],
            block: 5,
        },
        DonatedBlock {
            hash: h[1],
            block: 6,
        },
    ];
    link.finishing.insert(
        1,
        Finishing {
            table: vec![5, 6, 7],
            offered,
            then: None,
        },
    );
    let mut pool = Counts::default();
    let outcome = DonateOutcome {
        retained: vec![5, 42],
        ..DonateOutcome::default()
    };
    link.apply(
        &mut pool,
        ManagerOrder::Donated { tag: 1, outcome },
        PoolStats::default,
    );
    // 5: +1 for the cache, -1 for the sequence; 6 and 7: the sequence's reference dropped.
    assert_eq!(
        (pool.of(5), pool.of(6), pool.of(7), pool.of(42)),
        (0, -1, -1, 0)
    );
    assert_eq!((link.held_blocks(), link.refused()), (1, 1));
    assert_eq!(link.held.get(&5), Some(&h[0]));
    // An outcome for a tag that is not waiting changes nothing.
    let outcome = DonateOutcome {
        retained: vec![6],
        ..DonateOutcome::default()
    };
    link.apply(
        &mut pool,
        ManagerOrder::Donated { tag: 9, outcome },
        PoolStats::default,
    );
    assert_eq!(link.held_blocks(), 1);
}

#[test]
fn releases_of_blocks_not_held_are_refused_and_a_lost_manager_frees_everything() {
    let h = hashes(4, 2);
    let mut link = holding(&[1, 2], &h);
    let mut pool = Counts::default();
    let (done, applied) = tokio::sync::oneshot::channel();
    let order = ManagerOrder::Release {
        blocks: vec![1, 77],
        done,
    };
    link.apply(&mut pool, order, PoolStats::default);
    assert!(applied.blocking_recv().is_ok(), "acknowledged");
    assert_eq!((pool.of(1), pool.of(77), link.refused()), (-1, 0, 1));
    link.apply(&mut pool, ManagerOrder::Disconnected, PoolStats::default);
    assert_eq!((pool.of(2), link.held_blocks()), (-1, 0));
    assert!(!link.may_free_blocks());
}

#[test]
fn without_a_manager_a_finished_sequence_is_freed_at_once() {
    let h = hashes(5, 1);
    let mut link = CacheLink::default();
    let mut pool = Counts::default();
    let unsent = link.donate(
        &mut pool,
        vec![3, 4],
        vec![DonatedBlock {
            hash: h[0],
            block: 3,
        }],
        Vec::new(),
        None,
    );
    assert!(unsent.is_none());
    assert_eq!((pool.of(3), pool.of(4)), (-1, -1));
    assert!(!link.may_free_blocks());
}
