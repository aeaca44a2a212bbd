//! A GPU through MLX's own fused ops, what Metal runs: `fast::rope` (one offset per chunk, one
//! per row in a decode step), `fast::scaled_dot_product_attention` over exact shapes (Metal's
//! kernels are specialized by alignment only), the SiLU as MLX's op. CUDA's backend builds on
//! the same pieces ([`fused_attend`], [`fused_batch_attention`], [`PaddedRows`]).

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, fast, nn, ops};

use super::masks::{causal_mask, padding_mask};
use super::{Backend, ChunkAttention, Heads, Positions, RopeSpec, Rotate, StepAttention, WarmUp};
use crate::Result;
use crate::device::Placement;
use crate::kv::{BatchKeys, OwnLayout};

/// The plain-MLX GPU backend.
pub struct Gpu {
    placement: Placement,
}

impl Gpu {
    pub fn new(placement: Placement) -> Self {
        Gpu { placement }
    }
}

impl WarmUp for Gpu {
    fn batches(&self, max: usize) -> Vec<usize> {
        batch_sizes(max)
    }
}

impl Backend for Gpu {
    fn placement(&self) -> &Placement {
        &self.placement
    }

    fn silu_mul(&self, g: &Array, u: &Array) -> Result<Array> {
        Ok(ops::multiply(&nn::silu(g)?, u)?)
    }

    fn rope(&self, spec: &RopeSpec, at: Positions<'_>) -> Result<Box<dyn Rotate>> {
        Ok(Box::new(FusedRope::new(spec, at)))
    }

    fn chunk_attention(
        &self,
        heads: Heads,
        t: i32,
        offset: i32,
        keys: i32,
    ) -> Box<dyn ChunkAttention + '_> {
        Box::new(FusedChunk {
            heads,
            shape: (t, keys),
            canonical: false,
            mask: LazyMask::of(heads, (t, offset, keys), self.placement.dtype),
        })
    }

    fn step_attention(&self, heads: Heads, lens: &[i32]) -> Box<dyn StepAttention + '_> {
        Box::new(FusedStep::new(heads, lens, self.placement.dtype))
    }
}

/// The batch sizes a GPU's warm-up steps so that serving up to `max` rows meets no row count
/// whose kernels it has not built: one per kind of matmul a step's row count chooses (one row:
/// MLX's matrix-vector kernel; 2-8 and 9-16 rows: a few-row kernel's tiles; more: the BLAS),
/// then `max`.
pub(crate) fn batch_sizes(max: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = [1, 8, 16].into_iter().filter(|&n| n < max).collect();
    sizes.push(max);
    sizes
}

/// RoPE through MLX's fused kernel.
pub(crate) struct FusedRope {
    spec: RopeSpec,
    at: FusedAt,
    /// The pairs' periods (`1 / frequency`, as MLX's kernel takes them) where the spec gives
    /// its own frequencies.
    periods: Option<Array>,
}

enum FusedAt {
    Fixed(i32),
    PerRow(Array),
}

impl FusedRope {
    pub(crate) fn new(spec: &RopeSpec, at: Positions<'_>) -> Self {
        let at = match at {
            Positions::Span { start, .. } => FusedAt::Fixed(start),
            Positions::PerRow(rows) => {
                FusedAt::PerRow(Array::from_slice(rows, &[rows.len() as i32]))
            }
        };
        let periods = spec.freqs.as_ref().map(|f| {
            let p: Vec<f32> = f.iter().map(|&x| 1.0 / x).collect();
            Array::from_slice(&p, &[p.len() as i32])
        });
        FusedRope {
            spec: spec.clone(),
            at,
            periods,
        }
    }
}

impl Rotate for FusedRope {
    fn apply(&self, x: &Array) -> Result<Array> {
        let s = &self.spec;
        // MLX takes either a base or the periods.
        let base = self.periods.is_none().then_some(s.theta);
        let periods = self.periods.as_ref();
        Ok(match &self.at {
            FusedAt::Fixed(o) => fast::rope(x, s.dims, s.traditional, base, s.scale, *o, periods)?,
            FusedAt::PerRow(o) => {
                fast::rope_dynamic(x, s.dims, s.traditional, base, s.scale, o, periods)?
            }
        })
    }
}

/// A causal mask `(queries, offset, keys)` built the first time a layer asks for it.
pub(crate) struct LazyMask {
    shape: Option<(i32, i32, i32)>,
    dtype: mlx_rs::Dtype,
    /// A sliding window's size.
    window: Option<i32>,
    built: Option<Array>,
}

impl LazyMask {
    pub(crate) fn new(shape: Option<(i32, i32, i32)>, dtype: mlx_rs::Dtype) -> Self {
        LazyMask {
            shape,
            dtype,
            window: None,
            built: None,
        }
    }

    /// The mask of a chunk of `t` queries at `offset` over `keys` keys as `heads` see them: a
    /// sliding window always needs one once the keys pass it.
    pub(crate) fn of(heads: Heads, shape: (i32, i32, i32), dtype: mlx_rs::Dtype) -> Self {
        let (t, offset, keys) = shape;
        let windowed = heads.window.is_some_and(|w| keys > w);
        let needed = t > 1 || keys > offset + t || windowed;
        LazyMask::new(needed.then_some(shape), dtype).windowed(heads.window)
    }

    /// The same mask through a sliding window of `window` keys.
    pub(crate) fn windowed(mut self, window: Option<i32>) -> Self {
        self.window = window;
        self
    }

    pub(crate) fn get(&mut self) -> Result<Option<&Array>> {
        let Some((t, offset, keys)) = self.shape else {
            return Ok(None);
        };
        if self.built.is_none() {
            self.built = Some(causal_mask(t, offset, keys, self.window, self.dtype)?);
        }
        Ok(self.built.as_ref())
    }
}

/// A prefill chunk's attention through the fused kernel, at `shape` (queries, keys), padded to
/// it where it is larger than the chunk's.
pub(crate) struct FusedChunk {
    pub(crate) heads: Heads,
    pub(crate) shape: (i32, i32),
    /// Always a contiguous layout (CUDA builds a kernel per shape and stride).
    pub(crate) canonical: bool,
    pub(crate) mask: LazyMask,
}

impl ChunkAttention for FusedChunk {
    fn attend(
        &mut self,
        q: &Array,
        spans: &[(Array, Array)],
        sinks: Option<&Array>,
    ) -> Result<Array> {
        let t = q.shape()[2];
        let out = fused_attend(
            q,
            spans,
            self.heads.scale,
            self.mask.get()?,
            self.shape,
            self.canonical,
            sinks,
        )?;
        let width = self.heads.heads * self.heads.head_dim;
        Ok(out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[1, t, width])?)
    }
}

/// Attention of one sequence's `t` queries (`[1, heads, t, head_dim]`) over the keys and values
/// in `spans` through the fused kernel, queries and keys padded with zero rows to `(tp, sp)`
/// and, with `canonical`, laid out contiguously; `mask` is the causal mask of that shape (`None`
/// only for one query over exactly its keys), `sinks` the heads' sink logits where the layer
/// has them. Returns `[1, heads, t, head_dim]`.
pub(crate) fn fused_attend(
    q: &Array,
    spans: &[(Array, Array)],
    scale: f32,
    mask: Option<&Array>,
    (tp, sp): (i32, i32),
    canonical: bool,
    sinks: Option<&Array>,
) -> Result<Array> {
    let t = q.shape()[2];
    let q = padded(std::slice::from_ref(q), tp, canonical)?;
    let (ks, vs): (Vec<Array>, Vec<Array>) = spans.iter().cloned().unzip();
    let (k, v) = (padded(&ks, sp, canonical)?, padded(&vs, sp, canonical)?);
    let mask = mask.map(fast::ScaledDotProductAttentionMask::Array);
    let sinks = sinks.map(|s| s.as_dtype(q.dtype())).transpose()?;
    let out = fast::scaled_dot_product_attention(&q, &k, &v, scale, mask, sinks.as_ref())?;
    Ok(if tp == t {
        out
    } else {
        out.index((.., .., ..t))
    })
}

/// `parts` (`[1, n, rows_i, d]`) joined along the rows and padded with zero rows to `rows`;
/// with `canonical`, always in a contiguous layout.
fn padded(parts: &[Array], rows: i32, canonical: bool) -> Result<Array> {
    let Some(first) = parts.first() else {
        return Err(crate::EngineError::Internal(
            "attention over no keys".into(),
        ));
    };
    let have: i32 = parts.iter().map(|p| p.shape()[2]).sum();
    let mut all = parts.to_vec();
    if have < rows {
        let s = first.shape();
        all.push(ops::zeros_dtype(
            &[s[0], s[1], rows - have, s[3]],
            first.dtype(),
        )?);
    }
    Ok(match all.as_slice() {
        [one] if canonical => one.contiguous()?,
        [one] => one.clone(),
        _ => ops::concatenate(&all, 2)?,
    })
}

/// How a decode step's rows read their own keys padded to one length: each row's own length,
/// and the padding mask where some row is shorter than the padded keys. Known at the first
/// layer (the store pads to the longest row); each part built when first asked for.
pub(crate) struct PaddedRows {
    lens: Vec<i32>,
    dtype: mlx_rs::Dtype,
    /// A sliding window's size (its rows are always read whole, never after shared spans).
    window: Option<i32>,
    /// Each row's own positions before this step (after the shared ones), the padded length and
    /// the shared count, once the first layer's keys are seen.
    read: Option<(Vec<i32>, i32, i32)>,
    mask: Option<Option<Array>>,
}

impl PaddedRows {
    pub(crate) fn new(lens: &[i32], dtype: mlx_rs::Dtype) -> Self {
        PaddedRows {
            lens: lens.to_vec(),
            dtype,
            window: None,
            read: None,
            mask: None,
        }
    }

    /// The same rows read through a sliding window of `window` keys.
    pub(crate) fn windowed(mut self, window: Option<i32>) -> Self {
        self.window = window;
        self
    }

    /// Notes `keys`' layout at the first layer that has padded keys.
    pub(crate) fn see(&mut self, keys: &BatchKeys) {
        if self.read.is_none()
            && let Some(padded) = keys.own.padded_len()
        {
            let shared = keys.shared_len as i32;
            let own = self.lens.iter().map(|&l| l - shared).collect();
            self.read = Some((own, padded, shared));
        }
    }

    /// Whether some row is shorter than the padded keys, or longer than its window (so a mask
    /// is needed).
    pub(crate) fn ragged(&self) -> bool {
        self.read.as_ref().is_some_and(|(own, padded, _)| {
            own.iter()
                .any(|&l| l + 1 < *padded || self.window.is_some_and(|w| l + 1 > w))
        })
    }

    /// Each row's own keys with this step's, and the shared count (after [`PaddedRows::see`]).
    #[cfg(mlxcel_cuda)]
    pub(crate) fn own_and_shared(&self) -> Option<(Vec<i32>, i32)> {
        self.read
            .as_ref()
            .map(|(own, _, shared)| (own.iter().map(|&l| l + 1).collect(), *shared))
    }

    /// The padding mask (`[b, 1, 1, padded]`), `None` where every row fills the padded keys.
    pub(crate) fn mask(&mut self) -> Result<Option<&Array>> {
        if self.mask.is_none() {
            let mask = match &self.read {
                Some((own, padded, _)) if self.ragged() => {
                    Some(padding_mask(own, *padded, self.window, self.dtype)?)
                }
                _ => None,
            };
            self.mask = Some(mask);
        }
        Ok(self.mask.as_ref().and_then(Option::as_ref))
    }
}

/// A decode step's attention through the fused kernel over padded keys.
pub(crate) struct FusedStep {
    heads: Heads,
    rows: PaddedRows,
}

impl FusedStep {
    pub(crate) fn new(heads: Heads, lens: &[i32], dtype: mlx_rs::Dtype) -> Self {
        FusedStep {
            heads,
            rows: PaddedRows::new(lens, dtype).windowed(heads.window),
        }
    }
}

impl StepAttention for FusedStep {
    fn layout(&self) -> OwnLayout {
        OwnLayout::Padded
    }

    fn attend(&mut self, q: &Array, keys: &BatchKeys, sinks: Option<&Array>) -> Result<Array> {
        self.rows.see(keys);
        let h = self.heads;
        fused_batch_attention(q, keys, h.scale, self.rows.mask()?, h.kv_heads, sinks)
    }
}

/// Attention of a decode step through MLX's fused kernel (the GPU): the kernel wants one
/// padded K/V per row, so the shared spans are repeated per row and the mask widened to them.
/// `[b, 1, heads * head_dim]`.
pub(crate) fn fused_batch_attention(
    q: &Array,
    keys: &BatchKeys,
    scale: f32,
    mask: Option<&Array>,
    kv_heads: i32,
    sinks: Option<&Array>,
) -> Result<Array> {
    let (b, heads, hd) = (q.shape()[0], q.shape()[1], q.shape()[3]);
    let Some((tk, tv)) = keys.own.rows_first()? else {
        return Err(crate::EngineError::Internal(
            "the fused attention needs padded keys".into(),
        ));
    };
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for (k, v) in &keys.shared {
        let n = k.shape()[2];
        ks.push(ops::broadcast_to(k, &[b, kv_heads, n, hd])?);
        vs.push(ops::broadcast_to(v, &[b, kv_heads, n, hd])?);
    }
    ks.push(tk);
    vs.push(tv);
    let (k, v) = (ops::concatenate(&ks, 2)?, ops::concatenate(&vs, 2)?);
    let mask = match mask {
        Some(m) if keys.shared_len > 0 => Some(ops::concatenate(
            &[
                ops::zeros_dtype(&[b, 1, 1, keys.shared_len as i32], m.dtype())?,
                m.clone(),
            ],
            3,
        )?),
        m => m.cloned(),
    };
    let mask = mask
        .as_ref()
        .map(fast::ScaledDotProductAttentionMask::Array);
    let sinks = sinks.map(|s| s.as_dtype(q.dtype())).transpose()?;
    Ok(
        fast::scaled_dot_product_attention(q, &k, &v, scale, mask, sinks.as_ref())?.reshape(&[
            b,
            1,
            heads * hd,
        ])?,
    )
}
