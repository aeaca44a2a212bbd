//! Reading K/V out of the pool for attention: whole blocks, for a batch of sequences padded to
//! the same number of blocks, as `[kv_heads, batch, blocks × block_tokens, head_dim]` (heads
//! first: that is how the chunks lie once gathered, so nothing is transposed).
//!
//! A [`Gather`] is planned once per forward pass (every layer shares the block tables) and read
//! once per layer. Within one slab it is one take. Across slabs there are two ways, and the plan
//! picks the cheaper: one take per run of chunks from the same slab, concatenated in order (more
//! graph nodes), or one take per slab, concatenated, then reordered (two more copies).
//!
//! The takes move 8-byte words, not elements: MLX's gather runs one GPU thread per element it
//! copies (index arithmetic each), so an f16 chunk read as `u64` takes a quarter of the threads.
//! [`Order::RowsFirst`] lays the chunks out as a fused kernel reads them.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

use super::{BlockId, BlockPool, dtype_bytes};
use crate::{EngineError, Result};

/// What the plans weigh: one graph node at decode shapes against copying bytes, on the device
/// the pool lives on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyCosts {
    pub node_seconds: f64,
    pub copy_bytes_per_second: f64,
}

impl CopyCosts {
    /// MLX's CPU backend here: a node ~8 µs, a copy ~10 GB/s on one core.
    pub const CPU: CopyCosts = CopyCosts {
        node_seconds: 8e-6,
        copy_bytes_per_second: 10e9,
    };
    /// A GPU: a kernel launch ~10 µs, copies at device bandwidth (200 GB/s is below every
    /// Apple M-series and far below an H200's 4.8 TB/s). Measured on an H200 with the CPU's
    /// costs: a 4k-token context was read as 256 takes per layer, 94 ms per decode step of an
    /// 8B-like model.
    pub const GPU: CopyCosts = CopyCosts {
        node_seconds: 10e-6,
        copy_bytes_per_second: 200e9,
    };
}

/// Whether reading each row's own blocks (`tables`, exactly the blocks each row reads) as
/// in-place spans, one attention per row, costs less than gathering them into one padded
/// tensor: graph nodes per span and per row against the bytes a gather copies (once within a
/// slab; a take per slab, a join and a reorder across slabs).
pub fn spans_cheaper(pool: &BlockPool, tables: &[&[BlockId]]) -> bool {
    let spans: usize = tables.iter().map(|t| pool.span_count(t)).sum();
    let nodes = 4 * tables.len() + 2 * spans;
    let blocks = tables.iter().map(|t| t.len()).max().unwrap_or(0);
    let mut slabs: Vec<usize> = tables
        .iter()
        .flat_map(|t| t.iter())
        .map(|&b| pool.slab_of(b))
        .collect();
    slabs.sort_unstable();
    slabs.dedup();
    let copies = if slabs.len() > 1 { 3.0 } else { 1.0 };
    let bytes = (tables.len()
        * blocks
        * 2
        * pool.shape.kv_heads
        * pool.shape.head_chunk_elems()
        * dtype_bytes(pool.shape.dtype)) as f64;
    let costs = pool.costs;
    nodes as f64 * costs.node_seconds < copies * bytes / costs.copy_bytes_per_second
}

/// How gathered chunks lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `[kv_heads, rows, keys, head_dim]`: the CPU's batch attention reads all rows of a head
    /// as one matrix.
    HeadsFirst,
    /// `[rows, kv_heads, keys, head_dim]`: what MLX's attention takes; gathered in this order
    /// it is contiguous, so a masked (unfused) attention need not copy it again.
    RowsFirst,
}

/// The chunks to read for one forward pass.
pub struct Gather {
    rows: usize,
    blocks: usize,
    order: Order,
    /// Takes, in order: a slab and chunk ids within it.
    parts: Vec<(usize, Array)>,
    /// Where each output chunk is in the concatenated parts, when they are not in order.
    reorder: Option<Array>,
}

impl Gather {
    /// Plans reading `blocks` blocks of every table (rows with fewer are padded with their own
    /// first block; the caller masks positions past each row's length), laid out as `order`.
    pub fn new(
        pool: &BlockPool,
        tables: &[&[BlockId]],
        blocks: usize,
        order: Order,
    ) -> Result<Gather> {
        let kvh = pool.shape.kv_heads;
        // (head, row) pairs in output order, within each half (K, then V).
        let pairs: Vec<(usize, usize)> = match order {
            Order::HeadsFirst => (0..kvh)
                .flat_map(|h| (0..tables.len()).map(move |r| (h, r)))
                .collect(),
            Order::RowsFirst => (0..tables.len())
                .flat_map(|r| (0..kvh).map(move |h| (h, r)))
                .collect(),
        };
        let mut chunks: Vec<(usize, i32)> = Vec::with_capacity(2 * pairs.len() * blocks);
        for half in 0..2 {
            for &(h, r) in &pairs {
                let table = tables[r];
                let first = *table.first().ok_or_else(|| {
                    EngineError::Internal("a gather of a sequence with no block".into())
                })?;
                for j in 0..blocks {
                    let b = table.get(j).copied().unwrap_or(first);
                    let s = pool.slab_of(b);
                    let local = (b - s as u32 * pool.slab_blocks) as usize;
                    let id = (half * kvh + h) * pool.slab_len(s) as usize + local;
                    chunks.push((s, id as i32));
                }
            }
        }
        let runs = 1 + chunks.windows(2).filter(|w| w[0].0 != w[1].0).count();
        let mut slabs: Vec<usize> = chunks.iter().map(|c| c.0).collect();
        slabs.sort_unstable();
        slabs.dedup();
        let bytes =
            (chunks.len() * pool.shape.head_chunk_elems() * dtype_bytes(pool.shape.dtype)) as f64;
        let by_runs = (runs - slabs.len()) as f64 * pool.costs.node_seconds;
        let by_slabs = 2.0 * bytes / pool.costs.copy_bytes_per_second;
        let (parts, reorder) = if slabs.len() == 1 || by_runs <= by_slabs {
            (in_runs(&chunks), None)
        } else {
            by_slab(&chunks, &slabs)
        };
        Ok(Gather {
            rows: tables.len(),
            blocks,
            order,
            parts,
            reorder,
        })
    }

    /// Blocks each row gets.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// How the gathered chunks lie.
    pub fn order(&self) -> Order {
        self.order
    }
}

fn ids_array(ids: &[i32]) -> Array {
    Array::from_slice(ids, &[ids.len() as i32])
}

/// One take per run of consecutive chunks from the same slab.
fn in_runs(chunks: &[(usize, i32)]) -> Vec<(usize, Array)> {
    let mut parts = Vec::new();
    let mut start = 0;
    for end in 1..=chunks.len() {
        if end == chunks.len() || chunks[end].0 != chunks[start].0 {
            let ids: Vec<i32> = chunks[start..end].iter().map(|c| c.1).collect();
            parts.push((chunks[start].0, ids_array(&ids)));
            start = end;
        }
    }
    parts
}

/// One take per slab, and the order that puts the concatenation back in output order.
fn by_slab(chunks: &[(usize, i32)], slabs: &[usize]) -> (Vec<(usize, Array)>, Option<Array>) {
    let mut parts = Vec::with_capacity(slabs.len());
    let mut order = vec![0i32; chunks.len()];
    let mut next = 0;
    for &s in slabs {
        let mut ids = Vec::new();
        for (out, &(cs, id)) in chunks.iter().enumerate() {
            if cs == s {
                ids.push(id);
                order[out] = next;
                next += 1;
            }
        }
        parts.push((s, ids_array(&ids)));
    }
    (parts, Some(ids_array(&order)))
}

impl BlockPool {
    /// `layer`'s keys and values for `plan`, each `[kv_heads, rows, blocks × block_tokens,
    /// head_dim]` (or rows first, as the plan's [`Order`] says).
    pub fn gather(&self, layer: usize, plan: &Gather) -> Result<(Array, Array)> {
        let s = self.shape;
        let chunk = s.head_chunk_elems() as i32;
        let bytes = chunk as usize * dtype_bytes(s.dtype);
        // Chunks are whole rows of head_dim elements; read as words where they divide evenly.
        let word = bytes.is_multiple_of(8).then_some(Dtype::Uint64);
        let mut pieces = Vec::with_capacity(plan.parts.len());
        for (slab, ids) in &plan.parts {
            let Some(slab) = self.slabs[*slab].as_ref() else {
                return Err(EngineError::Internal(
                    "a gather from a slab that holds no block".into(),
                ));
            };
            pieces.push(slab.chunks(layer, chunk, ids, word)?);
        }
        let mut x = if pieces.len() == 1 {
            pieces.remove(0)
        } else {
            mlx_rs::ops::concatenate(&pieces, 0)?
        };
        if let Some(reorder) = &plan.reorder {
            x = x.take_axis(reorder, 0)?;
        }
        if word.is_some() {
            x = x.view_dtype(s.dtype)?;
        }
        let (rows, blocks) = (plan.rows as i32, plan.blocks as i32);
        let (kvh, bt, hd) = (s.kv_heads as i32, s.block_tokens as i32, s.head_dim as i32);
        let x = match plan.order {
            Order::HeadsFirst => x.reshape(&[2, kvh, rows, blocks * bt, hd])?,
            Order::RowsFirst => x.reshape(&[2, rows, kvh, blocks * bt, hd])?,
        };
        Ok((
            x.index(0..1).squeeze_axes(&[0])?,
            x.index(1..2).squeeze_axes(&[0])?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolShape;
    use mlx_rs::ops;

    /// One row of 32 blocks over 2 slabs of 16, with the device's costs: takes per layer.
    fn takes(costs: CopyCosts) -> usize {
        let shape = PoolShape {
            layers: 1,
            num_blocks: 32,
            block_tokens: 16,
            kv_heads: 8,
            head_dim: 128,
            dtype: Dtype::Float32,
        };
        let mut pool = BlockPool::with_slab_blocks(shape, 16)
            .expect("pool")
            .with_costs(costs);
        let table = pool.allocate(32).expect("blocks");
        let plan = Gather::new(&pool, &[&table], table.len(), Order::HeadsFirst).expect("plan");
        plan.parts.len()
    }

    #[test]
    fn a_gpu_reads_one_take_per_slab_where_the_cpu_reads_runs() {
        // 2 halves x 8 heads x 2 slabs = 32 runs (30 more nodes: 240 us on the CPU, against
        // copying 4 MiB twice, 840 us); on a GPU the copies cost 42 us, the nodes 300 us.
        assert_eq!(takes(CopyCosts::CPU), 32);
        assert_eq!(takes(CopyCosts::GPU), 2);
    }

    /// Rows of 3, 2 and 3 blocks over slabs of 4 (one row's blocks in both slabs), each block
    /// written with distinct values; every way of gathering must give each row's own positions.
    fn gathers_match_the_spans(
        dtype: Dtype,
        block_tokens: usize,
        head_dim: usize,
        costs: CopyCosts,
    ) {
        let shape = PoolShape {
            layers: 2,
            num_blocks: 8,
            block_tokens,
            kv_heads: 2,
            head_dim,
            dtype,
        };
        let mut pool = BlockPool::with_slab_blocks(shape, 4)
            .expect("pool")
            .with_costs(costs);
        let tables: Vec<Vec<BlockId>> = [3, 2, 3]
            .iter()
            .map(|&n| pool.allocate(n).expect("blocks"))
            .collect();
        let (kvh, hd) = (shape.kv_heads as i32, head_dim as i32);
        for layer in 0..shape.layers {
            for table in &tables {
                let at: Vec<(BlockId, usize)> = table
                    .iter()
                    .flat_map(|&b| (0..shape.block_tokens).map(move |p| (b, p)))
                    .collect();
                let n = at.len() as i32;
                let k = mlx_rs::random::normal::<f32>(&[kvh, n, hd], None, None, None)
                    .and_then(|x| x.as_dtype(dtype))
                    .expect("k");
                let v = ops::multiply(&k, Array::from_f32(-2.0)).expect("v");
                pool.write(layer, &at, &k, &v).expect("write");
            }
        }
        let refs: Vec<&[BlockId]> = tables.iter().map(|t| t.as_slice()).collect();
        let bt = shape.block_tokens as i32;
        for order in [Order::HeadsFirst, Order::RowsFirst] {
            let plan = Gather::new(&pool, &refs, 3, order).expect("plan");
            for layer in 0..shape.layers {
                let (k, v) = pool.gather(layer, &plan).expect("gather");
                for (r, table) in tables.iter().enumerate() {
                    let spans = pool.spans(layer, table, table.len()).expect("spans");
                    let ks: Vec<Array> = spans.iter().map(|s| s.0.clone()).collect();
                    let vs: Vec<Array> = spans.iter().map(|s| s.1.clone()).collect();
                    let want_k = ops::concatenate(&ks, 2).expect("k").squeeze_axes(&[0]);
                    let want_v = ops::concatenate(&vs, 2).expect("v").squeeze_axes(&[0]);
                    let len = table.len() as i32 * bt;
                    let r = r as i32;
                    let got = |x: &Array| match order {
                        Order::HeadsFirst => x.index((.., r, ..len)),
                        Order::RowsFirst => x.index((r, .., ..len)),
                    };
                    let same = |a: &Array, b: &Array| {
                        ops::array_eq(a, b, None).map(|e| e.item_exact::<bool>())
                    };
                    assert!(
                        same(&got(&k), &want_k.expect("k")).expect("eq"),
                        "{order:?} K"
                    );
                    assert!(
                        same(&got(&v), &want_v.expect("v")).expect("eq"),
                        "{order:?} V"
                    );
                }
            }
        }
    }

    #[test]
    fn gathered_rows_equal_their_spans_in_either_order_and_either_element_width() {
        for costs in [CopyCosts::CPU, CopyCosts::GPU] {
            // Chunks of 64 and 48 bytes are read as u64 words, one of 18 bytes as elements.
            gathers_match_the_spans(Dtype::Float16, 4, 8, costs);
            gathers_match_the_spans(Dtype::Float32, 4, 3, costs);
            gathers_match_the_spans(Dtype::Float16, 3, 3, costs);
        }
    }
}
