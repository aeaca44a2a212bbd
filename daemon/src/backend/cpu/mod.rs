//! MLX's CPU backend, which has no fused kernels (its `fast::` ops fall back to plain ops) and
//! runs f16 matmuls ~40x slower than f32 ones: the model computes in f32 with weights
//! dequantized at load, RoPE by angles computed once per pass ([`rotary`]), attention read in
//! place from the K/V spans ([`span_attention`], else plain matmuls and a softmax in base 2:
//! [`attention`], [`fast_exp`]), and a few-row matmul for decode steps ([`few_rows`]).

use std::cell::RefCell;
use std::rc::Rc;

use mlx_rs::Array;

use super::gpu::{LazyMask, PaddedRows};
use super::{
    Backend, ChunkAttention, FewRows, Heads, Positions, RopeSpec, Rotate, StepAttention, WarmUp,
};
use crate::Result;
use crate::device::Placement;
use crate::kv::{BatchKeys, OwnLayout};

pub mod attention;
pub mod fast_exp;
pub mod few_rows;
pub mod rotary;
pub mod span_attention;

use rotary::Rotary;

/// Query rows per piece of a long prefill chunk's attention: each piece reads the keys up to its
/// own last position only, so the scores above the diagonal past that are neither computed nor
/// exponentiated (a 512-token chunk at offset 0 computes 10/16 of them).
const CAUSAL_PIECE: i32 = 128;

/// The CPU backend.
pub struct Cpu {
    placement: Placement,
    /// The rotations made so far, by spec (their permutation matrix is made once).
    rotaries: RefCell<Vec<Rc<Rotary>>>,
}

impl Cpu {
    pub fn new(placement: Placement) -> Self {
        Cpu {
            placement,
            rotaries: RefCell::new(Vec::new()),
        }
    }

    fn rotary(&self, spec: &RopeSpec) -> Rc<Rotary> {
        let mut made = self.rotaries.borrow_mut();
        if let Some(r) = made.iter().find(|r| r.spec() == spec) {
            return r.clone();
        }
        let r = Rc::new(Rotary::new(spec.clone()));
        made.push(r.clone());
        r
    }
}

impl WarmUp for Cpu {}

impl Backend for Cpu {
    fn placement(&self) -> &Placement {
        &self.placement
    }

    fn few_rows(&self, w: &Array) -> Option<Rc<dyn FewRows>> {
        few_rows::Skinny::new(w).map(|k| Rc::new(k) as Rc<dyn FewRows>)
    }

    fn silu_mul(&self, g: &Array, u: &Array) -> Result<Array> {
        fast_exp::silu_mul(g, u)
    }

    fn rope(&self, spec: &RopeSpec, at: Positions<'_>) -> Result<Box<dyn Rotate>> {
        let rotary = self.rotary(spec);
        let angles = match at {
            Positions::Span { start, t } => rotary.span(start, t),
            Positions::PerRow(rows) => rotary.rows(rows),
        };
        Ok(Box::new(rotary::Turn { rotary, angles }))
    }

    fn chunk_attention(
        &self,
        heads: Heads,
        t: i32,
        offset: i32,
        keys: i32,
    ) -> Box<dyn ChunkAttention + '_> {
        Box::new(CpuChunk {
            heads,
            offset,
            mask: LazyMask::of(heads, (t, offset, keys), self.placement.dtype),
        })
    }

    fn step_attention(&self, heads: Heads, lens: &[i32]) -> Box<dyn StepAttention + '_> {
        Box::new(CpuStep {
            heads,
            rows: PaddedRows::new(lens, self.placement.dtype).windowed(heads.window),
        })
    }
}

/// A prefill chunk's attention on the CPU: in place from the spans where the span kernel runs,
/// else plain ops (in causal pieces for a long chunk).
struct CpuChunk {
    heads: Heads,
    offset: i32,
    /// The causal mask (the span kernel masks as it reads and never builds it: at 3.7k keys a
    /// 512-token chunk's mask is 7.5 MB).
    mask: LazyMask,
}

impl ChunkAttention for CpuChunk {
    fn attend(
        &mut self,
        q: &Array,
        spans: &[(Array, Array)],
        sinks: Option<&Array>,
    ) -> Result<Array> {
        let h = self.heads;
        let t = q.shape()[2];
        let valid = [(self.offset + t) as usize];
        let group = h.group();
        // The span kernel reads every key up to the diagonal: not for a sliding window.
        let plain = h.window.is_some() || sinks.is_some();
        if !plain
            && let Some(out) =
                span_attention::attend(q, &[spans.to_vec()], &valid, h.scale, group as usize)?
        {
            return Ok(out);
        }
        let out = match self.mask.get()? {
            Some(mask) if t >= 2 * CAUSAL_PIECE && !plain => attention::causal_attention(
                q,
                spans,
                h.scale,
                mask,
                group,
                self.offset,
                CAUSAL_PIECE,
            )?,
            mask => attention::explicit_attention(q, spans, h.scale, mask, group, sinks)?,
        };
        Ok(out
            .transpose_axes(&[0, 2, 1, 3])?
            .reshape(&[1, t, h.heads * h.head_dim])?)
    }
}

/// A decode step's attention on the CPU: each row's spans in place where the span kernel runs,
/// else one softmax over the shared spans' and the rows' own scores.
struct CpuStep {
    heads: Heads,
    rows: PaddedRows,
}

impl StepAttention for CpuStep {
    fn layout(&self) -> OwnLayout {
        if self.heads.window.is_some() || self.heads.sinks {
            // A window masks each row's own keys, a sink adds a column: read whole, none shared.
            OwnLayout::Padded
        } else if span_attention::available() {
            OwnLayout::Spans
        } else {
            OwnLayout::Either
        }
    }

    fn attend(&mut self, q: &Array, keys: &BatchKeys, sinks: Option<&Array>) -> Result<Array> {
        let h = self.heads;
        let group = h.group();
        if h.window.is_none()
            && sinks.is_none()
            && let Some(out) = span_attention::attend_batch(q, keys, h.scale, group as usize)?
        {
            return Ok(out);
        }
        self.rows.see(keys);
        attention::batch_attention(q, keys, h.scale, self.rows.mask()?, group, sinks)
    }
}
