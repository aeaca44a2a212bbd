//! Prefill: a forward pass over the new tokens of several sequences at once (the chunks of
//! several arrivals in one pass).
//!
//! The projections and the MLP run once over every chunk's rows; RoPE, the K/V writes and the
//! attention run per chunk (each over its own keys). One pass instead of one per chunk reads the
//! weights once and, on a GPU, encodes each layer's matmuls once: a GPU step is mostly the
//! host's work of encoding its ops.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, fast, ops};

use super::Decoder;
use crate::Result;
use crate::backend::{ChunkAttention, Positions, Rotate};
use crate::kv::ChunksKv;

impl Decoder {
    /// See [`crate::model::Architecture::forward_packed`].
    pub(super) fn prefill(&self, tokens: &[&[u32]], kv: &mut dyn ChunksKv) -> Result<Array> {
        let c = &self.config;
        let mut starts = Vec::with_capacity(tokens.len());
        let mut offsets = Vec::with_capacity(tokens.len());
        let mut total = 0i32;
        for (i, t) in tokens.iter().enumerate() {
            starts.push(total);
            offsets.push(kv.len(i) as i32);
            total += t.len() as i32;
        }
        // Where the backend runs a padded row count (CUDA builds kernels per shape), the padding
        // rows (token 0) come last; no chunk reads them, and their outputs are dropped.
        let rows = self.backend.prefill_rows(total);
        let mut ids: Vec<u32> = tokens.iter().flat_map(|t| t.iter().copied()).collect();
        ids.resize(rows as usize, 0);
        let mut x = self.embed(
            &Array::from_slice(&ids, &[rows]),
            &[1, rows, c.hidden as i32],
        )?;
        // Each chunk's rotation per kind of layer.
        let mut ropes: Vec<Vec<Box<dyn Rotate>>> = Vec::with_capacity(tokens.len());
        for (t, &start) in tokens.iter().zip(&offsets) {
            let at = Positions::Span {
                start,
                t: t.len() as i32,
            };
            let per_kind = self.kinds.iter().map(|k| self.backend.rope(&k.rope, at));
            ropes.push(per_kind.collect::<Result<_>>()?);
        }
        // Each chunk's attention per kind of layer, made at the first layer of the kind (when
        // its keys are known) and kept for the others: what they share, the mask, is built once.
        let mut attention: Vec<Vec<Option<Box<dyn ChunkAttention + '_>>>> = tokens
            .iter()
            .map(|_| self.kinds.iter().map(|_| None).collect())
            .collect();
        let whole = tokens.len() == 1 && rows == total;
        for (l, layer) in self.layers.iter().enumerate() {
            let heads = self.kinds[layer.kind].heads;
            let h = fast::rms_norm(&x, Some(&layer.attn_norm), c.rms_eps)?;
            let projected = self.project(layer, &h)?;
            let mut outs = Vec::with_capacity(tokens.len() + 1);
            for (i, chunk) in tokens.iter().enumerate() {
                let (a, t, offset) = (starts[i], chunk.len() as i32, offsets[i]);
                let rows_of = |y: &Array| {
                    if whole {
                        y.clone()
                    } else {
                        y.index((.., a..a + t))
                    }
                };
                let rope = &*ropes[i][layer.kind];
                let (qi, ki, vi) = self.heads(layer, projected.map(rows_of), rope)?;
                let spans = kv.append(i, l, ki, vi)?;
                let att = attention[i][layer.kind].get_or_insert_with(|| {
                    let keys: i32 = spans.iter().map(|(k, _)| k.shape()[2]).sum();
                    self.backend.chunk_attention(heads, t, offset, keys)
                });
                outs.push(att.attend(&qi, &spans, layer.sinks.as_ref())?);
            }
            if rows > total {
                let width = heads.heads * heads.head_dim;
                let dtype = self.backend.placement().dtype;
                outs.push(ops::zeros_dtype(&[1, rows - total, width], dtype)?);
            }
            let out = if outs.len() == 1 {
                outs.remove(0)
            } else {
                ops::concatenate(&outs, 1)?
            };
            x = self.rest(layer, &x, &out)?;
        }
        for (i, t) in tokens.iter().enumerate() {
            kv.commit(i, t.len());
        }
        let last: Vec<i32> = tokens
            .iter()
            .zip(&starts)
            .map(|(t, &a)| a + t.len() as i32 - 1)
            .collect();
        let n = last.len() as i32;
        let last = x.take_axis(Array::from_slice(&last, &[n]), 1)?;
        Ok(self.logits(&last)?.reshape(&[n, c.vocab as i32])?)
    }
}
