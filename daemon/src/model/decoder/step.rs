//! A decode step for several sequences at once. Every op runs once for the whole batch: the
//! projections, one RoPE with per-row positions, one write of the new K/V rows per layer, one
//! attention per layer over the blocks every row shares (read once, in place: a shared system
//! prompt costs one read, not one per row) and each row's own blocks, as the backend reads them.

use mlx_rs::Array;

use super::Decoder;
use crate::Result;
use crate::backend::Positions;
use crate::kv::BatchKv;

impl Decoder {
    /// See [`crate::model::Architecture::forward_step`].
    pub(super) fn step(&self, ids: &Array, kv: &mut dyn BatchKv) -> Result<Array> {
        let c = &self.config;
        let b = ids.shape()[0];
        let lens: Vec<i32> = kv.lens().into_iter().map(|l| l as i32).collect();
        let at = Positions::PerRow(&lens);
        let ropes = (self.kinds.iter())
            .map(|k| self.backend.rope(&k.rope, at))
            .collect::<Result<Vec<_>>>()?;
        let mut attention: Vec<_> = (self.kinds.iter())
            .map(|k| self.backend.step_attention(k.heads, &lens))
            .collect();
        let mut x = self.embed(ids, &[b, 1, c.hidden as i32])?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = mlx_rs::fast::rms_norm(&x, Some(&layer.attn_norm), c.rms_eps)?;
            let p = self.project(layer, &h)?;
            let (q, k, v) = self.heads(layer, p, &*ropes[layer.kind])?;
            let attention = &mut attention[layer.kind];
            let keys = kv.append_all(i, k, v, attention.layout())?;
            let out = attention.attend(&q, &keys, layer.sinks.as_ref())?;
            x = self.rest(layer, &x, &out)?;
        }
        kv.commit();
        Ok(self.logits(&x)?.reshape(&[b, c.vocab as i32])?)
    }
}
