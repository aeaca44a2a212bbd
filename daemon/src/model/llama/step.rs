//! A decode step for several sequences at once. Every op runs once for the whole batch: the
//! projections, one RoPE with per-row positions, one write of the new K/V rows per layer, one
//! attention per layer over the blocks every row shares (read once, in place: a shared system
//! prompt costs one read, not one per row) and each row's own blocks, as the backend reads them.

use mlx_rs::Array;

use super::Llama;
use crate::Result;
use crate::backend::Positions;
use crate::kv::BatchKv;

impl Llama {
    /// See [`crate::model::Architecture::forward_step`].
    pub(super) fn step(&self, ids: &Array, kv: &mut dyn BatchKv) -> Result<Array> {
        let c = &self.config;
        let b = ids.shape()[0];
        let lens: Vec<i32> = kv.lens().into_iter().map(|l| l as i32).collect();
        let rope = self.backend.rope(&self.rope, Positions::PerRow(&lens))?;
        let mut attention = self.backend.step_attention(self.heads, &lens);
        let layout = attention.layout();
        let mut x = self
            .embed
            .take_axis(ids, 0)?
            .reshape(&[b, 1, c.hidden as i32])?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = mlx_rs::fast::rms_norm(&x, Some(&layer.attn_norm), c.rms_eps)?;
            let p = self.project(layer, &h)?;
            let (q, k, v) = self.heads(layer, p, &*rope)?;
            let keys = kv.append_all(i, k, v, layout)?;
            let out = attention.attend(&q, &keys)?;
            x = layer.o.forward_add(&out, &x)?;
            x = self.mlp_add(layer, &x)?;
        }
        kv.commit();
        Ok(self.logits(&x)?.reshape(&[b, c.vocab as i32])?)
    }
}
