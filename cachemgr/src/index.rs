//! The block tree: every cached block keyed by its [`BlockHash`], linked to its parent, with an
//! intrusive recency list over the unpinned blocks.
//!
//! # Why the recency list only ever yields leaves
//! Every time a block is used, its whole chain is touched leaf-first, so in the list every block
//! stands before all of its ancestors. Pins are prefix-closed (a lease pins a chain from its first
//! block), so a pinned block's ancestors are pinned too and out of the list. Hence the list's head
//! has no child in the list and no pinned child: it is an unpinned leaf, the least recently used
//! one. Eviction pops the head: O(1) per block, never a scan.

use std::collections::HashMap;

use mlxcel_ipc::block_hash::BlockHashMap;
use mlxcel_ipc::{BlockHash, BlockId};
use tokio::time::Instant;

/// A node's place in the slab.
pub type Slot = u32;
const NIL: Slot = Slot::MAX;

/// One cached block.
#[derive(Debug, Clone)]
pub struct Node {
    /// The block's chained hash.
    pub hash: BlockHash,
    /// The daemon's pool slot holding it.
    pub block: BlockId,
    /// The previous block of the chain (None for a first block).
    pub parent: Option<Slot>,
    /// How many cached blocks continue this one.
    pub children: u32,
    /// Blocks in the chain up to and including this one.
    pub depth: u32,
    /// Leases (and pending donations) pinning this block.
    pub pins: u32,
    /// Acquires whose matched prefix ended at this block.
    pub hits: u64,
    /// Last time the block was used (touched, inserted or unpinned).
    pub last_used: Instant,
    prev: Slot,
    next: Slot,
}

/// The tree of cached blocks and their recency order.
#[derive(Debug, Default)]
pub struct BlockIndex {
    slots: Vec<Option<Node>>,
    free: Vec<Slot>,
    by_hash: BlockHashMap<Slot>,
    by_block: HashMap<BlockId, Slot>,
    head: Option<Slot>,
    tail: Option<Slot>,
    len: u64,
    leaves: u64,
    pinned: u64,
}

impl BlockIndex {
    /// Cached blocks.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks no other block continues (one per cached prefix chain).
    pub fn leaves(&self) -> u64 {
        self.leaves
    }

    /// Blocks pinned by at least one lease.
    pub fn pinned(&self) -> u64 {
        self.pinned
    }

    /// The slot holding `hash`.
    pub fn find(&self, hash: &BlockHash) -> Option<Slot> {
        self.by_hash.get(hash).copied()
    }

    /// Whether the cache holds pool block `block` (under any hash).
    pub fn holds_block(&self, block: BlockId) -> bool {
        self.by_block.contains_key(&block)
    }

    /// Counts an acquire whose matched prefix ended at `slot`.
    pub fn bump_hits(&mut self, slot: Slot) {
        self.node_mut(slot).hits += 1;
    }

    /// The node at `slot` (slots handed out by this index stay valid until removed).
    pub fn node(&self, slot: Slot) -> &Node {
        self.slots[slot as usize].as_ref().expect("live slot")
    }

    fn node_mut(&mut self, slot: Slot) -> &mut Node {
        self.slots[slot as usize].as_mut().expect("live slot")
    }

    /// Every live node, in no particular order (admin listings only; never on a hot path).
    pub fn iter(&self) -> impl Iterator<Item = (Slot, &Node)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i as Slot, n)))
    }

    /// Adds a block under `parent` (unpinned, most recently used). The caller has checked that
    /// `hash` is not cached yet.
    pub fn insert(
        &mut self,
        hash: BlockHash,
        block: BlockId,
        parent: Option<Slot>,
        now: Instant,
    ) -> Slot {
        debug_assert!(!self.by_hash.contains_key(&hash));
        let depth = match parent {
            Some(p) => {
                let pn = self.node_mut(p);
                pn.children += 1;
                let (first_child, depth) = (pn.children == 1, pn.depth);
                if first_child {
                    self.leaves -= 1;
                }
                depth + 1
            }
            None => 1,
        };
        let node = Node {
            hash,
            block,
            parent,
            children: 0,
            depth,
            pins: 0,
            hits: 0,
            last_used: now,
            prev: NIL,
            next: NIL,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(node);
                s
            }
            None => {
                self.slots.push(Some(node));
                (self.slots.len() - 1) as Slot
            }
        };
        self.by_hash.insert(hash, slot);
        self.by_block.insert(block, slot);
        self.len += 1;
        self.leaves += 1;
        self.push_back(slot);
        slot
    }

    /// Marks a chain used now. `chain` runs from the first block to the last; it is touched
    /// last-first so that every block stays ahead of its ancestors in the recency list.
    pub fn touch_chain(&mut self, chain: &[Slot], now: Instant) {
        for &slot in chain.iter().rev() {
            self.node_mut(slot).last_used = now;
            if self.node(slot).pins == 0 {
                self.unlink(slot);
                self.push_back(slot);
            }
        }
    }

    /// Pins a chain (first block to last).
    pub fn pin_chain(&mut self, chain: &[Slot], now: Instant) {
        for &slot in chain {
            let n = self.node_mut(slot);
            n.pins += 1;
            n.last_used = now;
            if n.pins == 1 {
                self.pinned += 1;
                self.unlink(slot);
            }
        }
    }

    /// Unpins a chain pinned by [`Self::pin_chain`]; blocks whose last pin goes return to the
    /// recency list as most recently used, last block first.
    pub fn unpin_chain(&mut self, chain: &[Slot], now: Instant) {
        for &slot in chain.iter().rev() {
            let n = self.node_mut(slot);
            debug_assert!(n.pins > 0, "unpin of an unpinned block");
            n.pins = n.pins.saturating_sub(1);
            n.last_used = now;
            if n.pins == 0 {
                self.pinned -= 1;
                self.push_back(slot);
            }
        }
    }

    /// The least recently used unpinned block (always a leaf).
    pub fn lru_leaf(&self) -> Option<Slot> {
        self.head
    }

    /// Removes an unpinned leaf, returning it.
    pub fn remove_leaf(&mut self, slot: Slot) -> Node {
        let n = self.node(slot);
        assert!(
            n.children == 0 && n.pins == 0,
            "only unpinned leaves are removed"
        );
        self.unlink(slot);
        let node = self.slots[slot as usize].take().expect("live slot");
        self.free.push(slot);
        self.by_hash.remove(&node.hash);
        self.by_block.remove(&node.block);
        self.len -= 1;
        self.leaves -= 1;
        if let Some(p) = node.parent {
            let pn = self.node_mut(p);
            pn.children -= 1;
            if pn.children == 0 {
                self.leaves += 1;
            }
        }
        node
    }

    /// Drops every block (their memory is gone with the daemon).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    fn push_back(&mut self, slot: Slot) {
        let old_tail = self.tail;
        {
            let n = self.node_mut(slot);
            n.prev = old_tail.unwrap_or(NIL);
            n.next = NIL;
        }
        match old_tail {
            Some(t) => self.node_mut(t).next = slot,
            None => self.head = Some(slot),
        }
        self.tail = Some(slot);
    }

    fn unlink(&mut self, slot: Slot) {
        let (prev, next) = {
            let n = self.node(slot);
            (n.prev, n.next)
        };
        let in_list = prev != NIL || next != NIL || self.head == Some(slot);
        if !in_list {
            return;
        }
        if prev == NIL {
            self.head = (next != NIL).then_some(next);
        } else {
            self.node_mut(prev).next = next;
        }
        if next == NIL {
            self.tail = (prev != NIL).then_some(prev);
        } else {
            self.node_mut(next).prev = prev;
        }
        let n = self.node_mut(slot);
        n.prev = NIL;
        n.next = NIL;
    }

    /// Walks the recency list head to tail (tests check its order).
    #[cfg(test)]
    pub fn recency(&self) -> Vec<Slot> {
        let mut out = Vec::new();
        let mut cur = self.head;
        while let Some(s) = cur {
            out.push(s);
            let next = self.node(s).next;
            cur = (next != NIL).then_some(next);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u8) -> BlockHash {
        BlockHash([i; 32])
    }

    #[test]
    fn lru_head_is_always_a_leaf_and_pins_leave_the_list() {
        let t = Instant::now();
        let mut ix = BlockIndex::default();
        let a = ix.insert(h(1), 10, None, t);
        let b = ix.insert(h(2), 11, Some(a), t);
        ix.touch_chain(&[a, b], t);
        let c = ix.insert(h(3), 12, Some(a), t);
        ix.touch_chain(&[a, c], t);
        assert_eq!(ix.recency(), vec![b, c, a]);
        assert_eq!((ix.len(), ix.leaves()), (3, 2));
        ix.pin_chain(&[a, c], t);
        assert_eq!(ix.recency(), vec![b]);
        assert_eq!(ix.pinned(), 2);
        ix.remove_leaf(b);
        assert_eq!(ix.lru_leaf(), None);
        ix.unpin_chain(&[a, c], t);
        assert_eq!(ix.recency(), vec![c, a]);
        ix.remove_leaf(c);
        assert_eq!((ix.len(), ix.leaves()), (1, 1));
        assert_eq!(ix.lru_leaf(), Some(a));
    }
}
