//! Prefill: a forward pass over new tokens of one sequence ([`Model::forward`]) or of several
//! ([`Model::forward_packed`]: the chunks of several arrivals in one pass).
//!
//! The projections and the MLP run once over every chunk's rows; RoPE, the K/V writes and the
//! attention run per chunk (each over its own keys). One pass instead of one per chunk reads the
//! weights once and, on a GPU, encodes each layer's matmuls once: a GPU step is mostly the
//! host's work of encoding its ops.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype, fast, ops};

use super::{LazyMask, Model, Offset, Rope};
use crate::Result;
use crate::kv::{ChunksKv, KvStore, OneChunk};
use crate::model::fused_prefill;

impl Model {
    /// Runs `tokens` (new positions after what `kv` holds) and returns the logits of the last
    /// position as f32 (`[vocab]`).
    pub fn forward(&self, tokens: &[u32], kv: &mut dyn KvStore) -> Result<Array> {
        let logits = self.forward_packed(&[tokens], &mut OneChunk(kv))?;
        Ok(logits.reshape(&[self.config.vocab as i32])?)
    }

    /// Runs chunk `i` = `tokens[i]` (new positions after what sequence `i` of `kv` holds) for
    /// every chunk in one pass and returns each chunk's last-position logits, `[chunks, vocab]`
    /// f32.
    pub fn forward_packed(&self, tokens: &[&[u32]], kv: &mut dyn ChunksKv) -> Result<Array> {
        let c = &self.config;
        if tokens.is_empty() || tokens.len() != kv.count() || tokens.iter().any(|t| t.is_empty()) {
            return Err(crate::EngineError::Internal(
                "a prefill pass needs one non-empty chunk per sequence".into(),
            ));
        }
        let mut starts = Vec::with_capacity(tokens.len());
        let mut offsets = Vec::with_capacity(tokens.len());
        let mut total = 0i32;
        for (i, t) in tokens.iter().enumerate() {
            kv.reserve(i, t.len())?;
            starts.push(total);
            offsets.push(kv.len(i) as i32);
            total += t.len() as i32;
        }
        // On CUDA the pass runs a padded row count (`fused_prefill`): kernels are built per
        // shape there, the quantized matmuls' too. The padding rows (token 0) come last; no
        // chunk reads them, and their outputs are dropped.
        let rows = if self.placement.pads_prefill {
            fused_prefill::query_rows(total)
        } else {
            total
        };
        let mut ids: Vec<u32> = tokens.iter().flat_map(|t| t.iter().copied()).collect();
        ids.resize(rows as usize, 0);
        let mut x = self
            .embed
            .take_axis(Array::from_slice(&ids, &[rows]), 0)?
            .reshape(&[1, rows, c.hidden as i32])?;
        let ropes: Vec<Rope> = tokens
            .iter()
            .zip(&offsets)
            .map(|(t, &offset)| {
                if self.placement.gpu {
                    Rope::Fused(Offset::Fixed(offset))
                } else {
                    Rope::Table(self.rotary.span(offset, t.len() as i32))
                }
            })
            .collect();
        // Each chunk's causal mask, built on first use: the CPU's span kernel masks as it
        // reads and never needs one (at 3.7k keys a 512-token chunk's mask is 7.5 MB).
        let mut masks: Vec<LazyMask> = tokens.iter().map(|_| LazyMask::default()).collect();
        let whole = tokens.len() == 1 && rows == total;
        for (l, layer) in self.layers.iter().enumerate() {
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
                let (qi, ki, vi) = self.heads(layer, projected.map(rows_of), &ropes[i])?;
                let spans = kv.append(i, l, ki, vi)?;
                let s: i32 = spans.iter().map(|(k, _)| k.shape()[2]).sum();
                masks[i].keys = if self.placement.pads_prefill && t > 1 {
                    // The fused kernel runs a padded shape (see `fused_prefill`).
                    let (tp, sp) = fused_prefill::Pad::of(&self.placement).shape(t, s);
                    Some((tp, offset, sp, self.placement.dtype))
                } else {
                    (t > 1 || s > offset + t).then_some((t, offset, s, self.placement.dtype))
                };
                outs.push(self.attend(&qi, &spans, &mut masks[i], offset)?);
            }
            if rows > total {
                let width = (c.heads * c.head_dim) as i32;
                outs.push(ops::zeros_dtype(
                    &[1, rows - total, width],
                    self.placement.dtype,
                )?);
            }
            let out = if outs.len() == 1 {
                outs.remove(0)
            } else {
                ops::concatenate(&outs, 1)?
            };
            x = layer.o.forward_add(&out, &x)?;
            x = self.mlp_add(layer, &x)?;
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
        let last = fast::rms_norm(&last, Some(&self.norm), c.rms_eps)?;
        let logits = self.lm_head.forward(&last)?.reshape(&[n, c.vocab as i32])?;
        Ok(logits.as_dtype(Dtype::Float32)?)
    }
}
