//! Where attention finds past keys and values.
//!
//! The forward pass never touches a cache layout: it hands each layer's new K/V rows to a
//! [`KvStore`] (which has room for them: the caller allocated it) and gets back everything the
//! sequence has. [`DenseKv`] keeps one growing tensor
//! per layer; the paged pool (blocks shared through the cache manager) implements the same trait
//! by writing rows into block slots and gathering by block table.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, ops};

use crate::Result;

/// Storage for one sequence's keys and values.
pub trait KvStore {
    /// Tokens stored so far (the position of the next token).
    fn len(&self) -> usize;

    /// Whether nothing is stored yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stores `k` and `v` (`[1, kv_heads, new_tokens, head_dim]`) for `layer` and returns all
    /// keys and values of the sequence for that layer, in order, as one or more spans (`[1,
    /// kv_heads, n_i, head_dim]` each) that together cover at least `len + new` positions; the
    /// caller masks any past that (a paged store returns whole blocks, read in place).
    fn append(&mut self, layer: usize, k: Array, v: Array) -> Result<Vec<(Array, Array)>>;

    /// Marks `tokens` new tokens as stored, after every layer has appended them.
    fn commit(&mut self, tokens: usize);
}

/// A [`KvStore`] a generation loop grows itself, one sequence outside the engine (tests,
/// benchmarks, the warm-up): it makes room before each forward pass, which never does.
pub trait GrowingKv: KvStore {
    /// Makes room for `tokens` more tokens (a no-op where room is free).
    fn grow(&mut self, tokens: usize) -> Result<()>;
}

/// Storage for a batch of sequences that each advance by one token.
///
/// Writing every sequence's new rows of a layer in one update matters: MLX updates a pool tensor
/// in place only when nothing else still refers to it, and a read between two writes would.
pub trait BatchKv {
    /// Tokens each sequence has stored.
    fn lens(&self) -> Vec<usize>;

    /// Stores each sequence's new row (`k`, `v`: `[batch, kv_heads, 1, head_dim]`) for `layer`
    /// and returns every sequence's keys and values (see [`BatchKeys`]), each row's own part
    /// as `layout` allows.
    fn append_all(
        &mut self,
        layer: usize,
        k: Array,
        v: Array,
        layout: OwnLayout,
    ) -> Result<BatchKeys>;

    /// Marks the token as stored in every sequence, after every layer has appended it.
    fn commit(&mut self);
}

/// Storage for several sequences that each add a chunk of new tokens in one forward pass (a
/// packed prefill): chunk `i` is sequence `i`, with [`KvStore`]'s contract each.
pub trait ChunksKv {
    /// Sequences in the pass.
    fn count(&self) -> usize;

    /// Tokens sequence `i` has stored.
    fn len(&self, i: usize) -> usize;

    /// Stores sequence `i`'s new rows for `layer` and returns all its keys and values (see
    /// [`KvStore::append`]).
    fn append(&mut self, i: usize, layer: usize, k: Array, v: Array)
    -> Result<Vec<(Array, Array)>>;

    /// Marks sequence `i`'s `tokens` new tokens as stored, after every layer.
    fn commit(&mut self, i: usize, tokens: usize);
}

/// One [`KvStore`] as a pass of one chunk.
pub struct OneChunk<'a>(pub &'a mut dyn KvStore);

impl ChunksKv for OneChunk<'_> {
    fn count(&self) -> usize {
        1
    }

    fn len(&self, _i: usize) -> usize {
        self.0.len()
    }

    fn append(
        &mut self,
        _i: usize,
        layer: usize,
        k: Array,
        v: Array,
    ) -> Result<Vec<(Array, Array)>> {
        self.0.append(layer, k, v)
    }

    fn commit(&mut self, _i: usize, tokens: usize) {
        self.0.commit(tokens)
    }
}

/// What the attention of a decode step can read each row's own keys as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnLayout {
    /// Only one padded tensor for the batch (a fused kernel wants it).
    Padded,
    /// Either, whichever the store reads cheaper.
    Either,
    /// In-place spans unless the store is told otherwise (the CPU's span kernel reads them
    /// without a copy).
    Spans,
    /// Block tables into the store's memory where it has them ([`OwnKeys::Tables`], for a
    /// kernel that reads them in place), else as [`OwnLayout::Padded`].
    Tables,
}

impl OwnLayout {
    /// Whether the attention wants every row's keys as one tensor per row (no shared spans).
    pub fn whole_rows(self) -> bool {
        matches!(self, OwnLayout::Padded | OwnLayout::Tables)
    }
}

/// A decode step's keys and values: the positions every sequence shares (the same full blocks,
/// e.g. a cached system prompt), read once for the whole batch, then each sequence's own rest.
pub struct BatchKeys {
    /// Spans of the shared positions, `[1, kv_heads, n_i, head_dim]` each (views, no copy).
    pub shared: Vec<(Array, Array)>,
    /// Positions covered by `shared` (the same in every row, all valid).
    pub shared_len: usize,
    /// Each row's positions after `shared_len`.
    pub own: OwnKeys,
}

/// Each row's own keys and values in a decode step (its positions after the shared ones).
pub enum OwnKeys {
    /// Gathered and padded to one length, heads first: `[kv_heads, batch, keys, head_dim]`;
    /// row `i` is valid up to `lens()[i] + 1 - shared_len` (the caller masks the rest).
    Padded(Array, Array),
    /// The same, rows first: `[batch, kv_heads, keys, head_dim]`, as a fused kernel reads them
    /// (gathered in this order, so nothing copies them again to make them contiguous).
    RowsFirst(Array, Array),
    /// Per row, spans read in place (`[1, kv_heads, n_j, head_dim]` each, views of the pool)
    /// that cover exactly the row's own positions and the new one: nothing copied or masked.
    Spans(Vec<Vec<(Array, Array)>>),
    /// Every row's keys where they lie in the pool, by block table.
    Tables(TableKeys),
}

/// A decode step's keys of one layer read in place by block table: nothing gathered, padded or
/// masked. The pool's memory is a few slabs; each holds, per layer, one flat array
/// `[2 * kv_heads * blocks * block_tokens, head_dim]`: K then V, by head, by block.
pub struct TableKeys {
    /// This layer's array of each slab the tables point into.
    pub slabs: Vec<Array>,
    /// `[slabs.len()]` i32: blocks in each of `slabs`.
    pub slab_blocks: Array,
    /// `[rows, blocks]` i32: row `i`'s `j`-th block as `slab << 24 | block within the slab`
    /// (`slab` indexes `slabs`); entries past a row's last block repeat its first.
    pub tables: Array,
    /// `[rows]` i32: keys row `i` reads, this step's included.
    pub lens: Array,
    /// The most keys a row reads (`lens`' maximum, known on the host).
    pub longest: i32,
    /// Positions per block.
    pub block_tokens: i32,
}

/// Where a [`TableKeys`] entry points: `slab << TABLE_SLAB_SHIFT | block within the slab`.
pub const TABLE_SLAB_SHIFT: u32 = 24;

/// The most slabs one [`TableKeys`] reads (a kernel's fixed number of slab inputs); a step
/// whose blocks lie in more is gathered instead.
pub const MOST_TABLE_SLABS: usize = 4;

impl OwnKeys {
    /// Keys per row of a padded tensor (`None` for spans and tables, which are never padded).
    pub fn padded_len(&self) -> Option<i32> {
        match self {
            OwnKeys::Padded(k, _) | OwnKeys::RowsFirst(k, _) => Some(k.shape()[2]),
            OwnKeys::Spans(_) | OwnKeys::Tables(_) => None,
        }
    }

    /// Padded keys and values heads first (a view of rows-first ones); `None` for spans and tables.
    pub fn heads_first(&self) -> Result<Option<(Array, Array)>> {
        Ok(match self {
            OwnKeys::Padded(k, v) => Some((k.clone(), v.clone())),
            OwnKeys::RowsFirst(k, v) => Some((k.swap_axes(0, 1)?, v.swap_axes(0, 1)?)),
            OwnKeys::Spans(_) | OwnKeys::Tables(_) => None,
        })
    }

    /// Padded keys and values rows first (a view of heads-first ones); `None` for spans and tables.
    pub fn rows_first(&self) -> Result<Option<(Array, Array)>> {
        Ok(match self {
            OwnKeys::RowsFirst(k, v) => Some((k.clone(), v.clone())),
            OwnKeys::Padded(k, v) => Some((k.swap_axes(0, 1)?, v.swap_axes(0, 1)?)),
            OwnKeys::Spans(_) | OwnKeys::Tables(_) => None,
        })
    }
}

/// The first `n` positions of `spans` (`[1, kv_heads, n_i, head_dim]` each), as views.
pub fn first_positions(spans: &[(Array, Array)], n: usize) -> Vec<(Array, Array)> {
    let mut out = Vec::with_capacity(spans.len());
    let mut left = n as i32;
    for (k, v) in spans {
        if left <= 0 {
            break;
        }
        let len = k.shape()[2];
        if len <= left {
            out.push((k.clone(), v.clone()));
        } else {
            out.push((k.index((.., .., ..left)), v.index((.., .., ..left))));
        }
        left -= len;
    }
    out
}

/// One contiguous tensor per layer, grown by concatenation.
#[derive(Default)]
pub struct DenseKv {
    layers: Vec<Option<(Array, Array)>>,
    len: usize,
}

impl DenseKv {
    /// An empty store for `layers` layers.
    pub fn new(layers: usize) -> Self {
        Self {
            layers: (0..layers).map(|_| None).collect(),
            len: 0,
        }
    }
}

impl GrowingKv for DenseKv {
    fn grow(&mut self, _tokens: usize) -> Result<()> {
        Ok(())
    }
}

impl KvStore for DenseKv {
    fn len(&self) -> usize {
        self.len
    }

    fn append(&mut self, layer: usize, k: Array, v: Array) -> Result<Vec<(Array, Array)>> {
        let slot = &mut self.layers[layer];
        let (k, v) = match slot.take() {
            Some((pk, pv)) => (
                ops::concatenate(&[pk, k], 2)?,
                ops::concatenate(&[pv, v], 2)?,
            ),
            None => (k, v),
        };
        *slot = Some((k.clone(), v.clone()));
        Ok(vec![(k, v)])
    }

    fn commit(&mut self, tokens: usize) {
        self.len += tokens;
    }
}
