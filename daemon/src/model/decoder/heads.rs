//! A layer's attention inputs: q, k and v projected from the normed residual, split into heads,
//! normed (Qwen3, Gemma) and rotated (RoPE).

use mlx_rs::{Array, fast};

use super::{Decoder, Layer};
use crate::Result;
use crate::backend::Rotate;

/// q, k and v of a pass's rows, `[b, t, n * head_dim]` each; `qk`, where the projections are
/// joined, is q and k side by side (`[b, t, (heads + kv_heads) * head_dim]`, a view).
pub(super) struct Projected {
    pub q: Array,
    pub k: Array,
    pub v: Array,
    pub qk: Option<Array>,
}

impl Projected {
    /// The same projections cut by `rows` (a chunk's rows of a packed pass).
    pub fn map(&self, rows: impl Fn(&Array) -> Array) -> Projected {
        Projected {
            q: rows(&self.q),
            k: rows(&self.k),
            v: rows(&self.v),
            qk: self.qk.as_ref().map(&rows),
        }
    }
}

impl Decoder {
    /// q, k and v of the normed residual `h`.
    pub(super) fn project(&self, layer: &Layer, h: &Array) -> Result<Projected> {
        let (parts, qk) = layer.qkv.forward_leading(h, 2)?;
        match <[Array; 3]>::try_from(parts) {
            Ok([q, k, v]) => Ok(Projected { q, k, v, qk }),
            Err(_) => Err(crate::EngineError::Internal(
                "q, k and v projections are not three".into(),
            )),
        }
    }

    /// Splits projected q, k, v into heads (`[b, n, t, head_dim]`), applies the q/k norms and
    /// RoPE: one rotation over q and k side by side where they are (joined projections and no
    /// q/k norms: one op a layer fewer, the same numbers), else one each.
    pub(super) fn heads(
        &self,
        layer: &Layer,
        p: Projected,
        rope: &dyn Rotate,
    ) -> Result<(Array, Array, Array)> {
        let (b, t) = (p.q.shape()[0], p.q.shape()[1]);
        let h = self.kinds[layer.kind].heads;
        let split = |x: &Array, n: i32| -> Result<Array> {
            Ok(x.reshape(&[b, t, n, h.head_dim])?
                .transpose_axes(&[0, 2, 1, 3])?)
        };
        let v = split(&p.v, h.kv_heads)?;
        let together = layer.q_norm.is_none() && layer.k_norm.is_none();
        if let (true, Some(qk)) = (together, &p.qk) {
            // [b, heads + kv_heads, t, hd], rotated at once, cut back into q and k (views).
            let qk = rope.apply(&split(qk, h.heads + h.kv_heads)?)?;
            let mut parts = qk.split_at_indices(&[h.heads], 1)?.into_iter();
            if let (Some(q), Some(k)) = (parts.next(), parts.next()) {
                return Ok((q, k, v));
            }
            return Err(crate::EngineError::Internal(
                "q and k do not split into two".into(),
            ));
        }
        let eps = self.config.rms_eps;
        let mut q = split(&p.q, h.heads)?;
        let mut k = split(&p.k, h.kv_heads)?;
        if let Some(w) = &layer.q_norm {
            q = fast::rms_norm(&q, Some(w), eps)?;
        }
        if let Some(w) = &layer.k_norm {
            k = fast::rms_norm(&k, Some(w), eps)?;
        }
        Ok((rope.apply(&q)?, rope.apply(&k)?, v))
    }
}
