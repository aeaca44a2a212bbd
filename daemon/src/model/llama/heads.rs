//! A layer's attention inputs: q, k and v projected from the normed residual, split into heads,
//! normed (Qwen3) and rotated (RoPE).

use mlx_rs::{Array, fast};

use super::{Layer, Model, Offset, Rope};
use crate::Result;
use crate::device::Backend;
use crate::kv::{BatchKeys, BatchKv, OwnLayout};
use crate::model::rope_cuda::{self, RopeKv};
use crate::model::skinny_cuda::RmsNorm;

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

impl Model {
    pub(super) fn project(&self, layer: &Layer, h: &Array) -> Result<Projected> {
        Self::projected(layer.qkv.forward_leading(h, 2)?)
    }

    /// [`Model::project`] of the residual stream `x`, the layer's attention norm applied first
    /// (in the projection's own kernel where the device's few-row kernel takes it).
    pub(super) fn project_normed(&self, layer: &Layer, x: &Array) -> Result<Projected> {
        let norm = RmsNorm {
            weight: &layer.attn_norm,
            eps: self.config.rms_eps,
        };
        Self::projected(layer.qkv.forward_leading_normed(x, norm, 2)?)
    }

    fn projected((parts, qk): (Vec<Array>, Option<Array>)) -> Result<Projected> {
        match <[Array; 3]>::try_from(parts) {
            Ok([q, k, v]) => Ok(Projected { q, k, v, qk }),
            Err(_) => Err(crate::EngineError::Internal(
                "q, k and v projections are not three".into(),
            )),
        }
    }

    /// Splits projected q, k, v into heads (`[b, n, t, head_dim]`), applies the q/k norms and
    /// RoPE: one call over q and k side by side where they are ([`Placement::ropes_qk_together`]
    /// and no q/k norms), else one each.
    ///
    /// [`Placement::ropes_qk_together`]: crate::device::Placement::ropes_qk_together
    pub(super) fn heads(
        &self,
        layer: &Layer,
        p: Projected,
        rope: &Rope,
    ) -> Result<(Array, Array, Array)> {
        let c = &self.config;
        let (b, t) = (p.q.shape()[0], p.q.shape()[1]);
        let (heads, kv_heads, hd) = (c.heads as i32, c.kv_heads as i32, c.head_dim as i32);
        let split = |x: &Array, n: i32| -> Result<Array> {
            Ok(x.reshape(&[b, t, n, hd])?.transpose_axes(&[0, 2, 1, 3])?)
        };
        let (trad, theta) = (c.rope_traditional, c.rope_theta);
        let turn = |x: &Array| -> Result<Array> {
            Ok(match rope {
                Rope::Fused(Offset::Fixed(o)) => fast::rope(x, hd, trad, theta, 1.0, *o, None)?,
                Rope::Fused(Offset::PerRow(o)) => {
                    fast::rope_dynamic(x, hd, trad, theta, 1.0, o, None)?
                }
                Rope::Table(angles) => self.rotary.apply(x, angles)?,
            })
        };
        let v = split(&p.v, kv_heads)?;
        let together =
            self.placement.ropes_qk_together && layer.q_norm.is_none() && layer.k_norm.is_none();
        if let (true, Some(qk)) = (together, &p.qk) {
            // [b, heads + kv_heads, t, hd], rotated at once, cut back into q and k (views).
            let qk = turn(&split(qk, heads + kv_heads)?)?;
            let mut parts = qk.split_at_indices(&[heads], 1)?.into_iter();
            if let (Some(q), Some(k)) = (parts.next(), parts.next()) {
                return Ok((q, k, v));
            }
            return Err(crate::EngineError::Internal(
                "q and k do not split into two".into(),
            ));
        }
        let mut q = split(&p.q, heads)?;
        let mut k = split(&p.k, kv_heads)?;
        if let Some(w) = &layer.q_norm {
            q = fast::rms_norm(&q, Some(w), c.rms_eps)?;
        }
        if let Some(w) = &layer.k_norm {
            k = fast::rms_norm(&k, Some(w), c.rms_eps)?;
        }
        Ok((turn(&q)?, turn(&k)?, v))
    }

    /// A decode step's queries for `layer` (`[b, heads, 1, head_dim]`), rotated, and every
    /// row's keys after this step's K/V rows are stored in `kv` (see [`BatchKv::append_all`]):
    /// on CUDA with [`rope_cuda::wanted`] one kernel rotates q and k and packs the rows as the
    /// pool stores them, else [`Model::heads`] and the pool's own packing.
    pub(super) fn turn_and_store(
        &self,
        (index, layer): (usize, &Layer),
        p: Projected,
        rope: &Rope,
        kv: &mut dyn BatchKv,
        layout: OwnLayout,
    ) -> Result<(Array, BatchKeys)> {
        let c = &self.config;
        let one_kernel = self.placement.backend == Backend::Cuda
            && rope_cuda::wanted()
            && layer.q_norm.is_none()
            && layer.k_norm.is_none();
        if let (true, Rope::Fused(Offset::PerRow(offsets))) = (one_kernel, rope) {
            let r = RopeKv {
                heads: c.heads as i32,
                kv_heads: c.kv_heads as i32,
                head_dim: c.head_dim as i32,
                theta: c.rope_theta,
                traditional: c.rope_traditional,
            };
            if let Some((q, values)) = r.apply(&p.q, &p.k, &p.v, offsets)? {
                return Ok((q, kv.append_packed(index, values, layout)?));
            }
        }
        let (q, k, v) = self.heads(layer, p, rope)?;
        Ok((q, kv.append_all(index, k, v, layout)?))
    }
}
