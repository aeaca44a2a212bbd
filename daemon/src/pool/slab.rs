//! A slab: the K/V arrays of `blocks` consecutive block ids, taken from the allocator when its
//! first block is needed and dropped (its memory given back) when its last block is released.
//!
//! Per layer one flat array of rows, `[2, kv_heads, blocks, block_tokens, head_dim]` (K then V,
//! head-major): one head of one block is a contiguous chunk, and gathered chunks laid side by
//! side are already `[kv_heads, rows, positions, head_dim]`, so attention reads them as they
//! are (no transpose copy). One array per layer (not one for
//! the slab) because MLX updates an array in place only when nothing else refers to it: layer
//! `l`'s write must not wait on the still-lazy reads of layer `l - 1`.

use mlx_rs::ops::indexing::{IndexOp, TryIndexMutOp};
use mlx_rs::{Array, Dtype, ops};

use super::PoolShape;
use crate::Result;

pub(super) struct Slab {
    /// Per layer, the flat rows.
    layers: Vec<Array>,
    /// Blocks of this slab with a nonzero refcount.
    pub(super) held: u32,
}

impl Slab {
    /// Zeroed arrays for `blocks` blocks (zeros, so padding read past a sequence's end is
    /// finite and a masked-out score times it stays 0).
    pub(super) fn new(shape: &PoolShape, blocks: u32) -> Result<Slab> {
        let rows = 2 * blocks as i32 * shape.kv_heads as i32 * shape.block_tokens as i32;
        let mut layers = Vec::with_capacity(shape.layers);
        for _ in 0..shape.layers {
            let a = ops::zeros_dtype(&[rows, shape.head_dim as i32], shape.dtype)?;
            a.eval()?;
            layers.push(a);
        }
        Ok(Slab { layers, held: 0 })
    }

    /// Bytes of the arrays as MLX reports them.
    pub(super) fn nbytes(&self) -> u64 {
        self.layers.iter().map(|a| a.nbytes() as u64).sum()
    }

    /// `layer`'s flat rows.
    pub(super) fn layer(&self, layer: usize) -> &Array {
        &self.layers[layer]
    }

    /// Writes `values` (`[n, head_dim]`) into `rows` of `layer`, one update.
    pub(super) fn write(&mut self, layer: usize, rows: &Array, values: &Array) -> Result<()> {
        self.layers[layer].try_index_mut(rows.clone(), values.clone())?;
        Ok(())
    }

    /// Chunks `ids` of `layer`, viewed as `[2 * kv_heads * blocks, block_tokens * head_dim]`
    /// (chunk `(half * kv_heads + head) * blocks + j`: K or V of one head of local block `j`),
    /// read as `word`s when given (the caller views the result back).
    pub(super) fn chunks(
        &self,
        layer: usize,
        chunk: i32,
        ids: &Array,
        word: Option<Dtype>,
    ) -> Result<Array> {
        let x = self.layers[layer].reshape(&[-1, chunk])?;
        let x = match word {
            Some(w) => x.view_dtype(w)?,
            None => x,
        };
        Ok(x.take_axis(ids, 0)?)
    }

    /// `layer`'s K and V of local blocks `from..to` as views (no copy), `[1, kv_heads,
    /// (to - from) × block_tokens, head_dim]` each; `len` is this slab's block count.
    pub(super) fn span(
        &self,
        layer: usize,
        shape: &PoolShape,
        len: u32,
        from: u32,
        to: u32,
    ) -> Result<(Array, Array)> {
        let (kvh, bt, hd) = (
            shape.kv_heads as i32,
            shape.block_tokens as i32,
            shape.head_dim as i32,
        );
        let x = self.layers[layer].reshape(&[2, kvh, len as i32 * bt, hd])?;
        let rows = (from as i32 * bt)..(to as i32 * bt);
        let k = x.index((0, .., rows.clone())).expand_dims(0)?;
        let v = x.index((1, .., rows)).expand_dims(0)?;
        Ok((k, v))
    }
}
