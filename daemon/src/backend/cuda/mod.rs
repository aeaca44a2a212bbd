//! CUDA (Linux, MLX's CUDA build; compiled only there, or with the `cuda` feature for the
//! kernel-source check): the GPU path of [`super::gpu`] with prefill padded to a few shapes
//! ([`padded`]: MLX builds CUDA kernels per exact shape) and custom kernels where a decode step
//! is bound by the host's encoding of MLX's ops: a few-row matmul with fused epilogues
//! ([`few_rows`]) and a decode attention over rows of different lengths, reading the pool by
//! block table where it can ([`attention`]). [`kernel`] applies MLX custom kernels;
//! [`kernel_modules`] keeps their compiled modules across starts.
//!
//! Run on another device (CUDA's formulation checked on the CPU in tests), only the padding
//! applies: the custom kernels need a CUDA device.

use std::rc::Rc;

use mlx_rs::Array;

use super::gpu::{FusedChunk, FusedRope, LazyMask, PaddedRows, batch_sizes, fused_batch_attention};
use super::{
    Backend, ChunkAttention, FewRows, Heads, Positions, RopeSpec, Rotate, StepAttention, WarmUp,
};
use crate::Result;
use crate::device::{DeviceKind, Placement};
use crate::kv::{BatchKeys, OwnKeys, OwnLayout};

pub mod attention;
pub mod few_rows;
pub mod kernel;
pub mod kernel_modules;
pub mod padded;

/// The CUDA backend.
pub struct Cuda {
    placement: Placement,
    /// The custom kernels run (a CUDA device).
    kernels: bool,
}

impl Cuda {
    pub fn new(placement: Placement) -> Self {
        Cuda {
            kernels: placement.kind == DeviceKind::Cuda,
            placement,
        }
    }

    /// Whether decode steps read K/V by block table (the table kernel takes these heads).
    fn reads_tables(&self, h: Heads) -> bool {
        self.kernels
            && attention::reads_tables(h.heads, h.kv_heads, h.head_dim, self.placement.dtype)
    }
}

impl WarmUp for Cuda {
    fn chunks(&self, chunk: usize) -> Vec<usize> {
        padded::row_shapes(chunk)
    }

    fn attention(&self, heads: Heads, chunk: usize, keys: usize) -> Result<usize> {
        let shapes = padded::attention_shapes(chunk, keys.min(padded::WARM_KEYS));
        padded::warm(&shapes, heads, self.placement.dtype)?;
        Ok(shapes.len())
    }

    fn batches(&self, max: usize) -> Vec<usize> {
        batch_sizes(max)
    }

    fn split_decode_from(&self, heads: Heads) -> Option<usize> {
        self.reads_tables(heads)
            .then_some(attention::SPLIT_FROM as usize)
    }
}

impl Backend for Cuda {
    fn placement(&self) -> &Placement {
        &self.placement
    }

    fn few_rows(&self, w: &Array) -> Option<Rc<dyn FewRows>> {
        if !self.kernels {
            return None;
        }
        few_rows::CudaSkinny::new(w).map(|k| Rc::new(k) as Rc<dyn FewRows>)
    }

    fn silu_mul(&self, g: &Array, u: &Array) -> Result<Array> {
        Ok(mlx_rs::ops::multiply(&mlx_rs::nn::silu(g)?, u)?)
    }

    fn rope(&self, spec: &RopeSpec, at: Positions<'_>) -> Result<Box<dyn Rotate>> {
        Ok(Box::new(FusedRope::new(spec, at)))
    }

    fn prefill_rows(&self, tokens: i32) -> i32 {
        padded::query_rows(tokens)
    }

    fn chunk_attention(
        &self,
        heads: Heads,
        t: i32,
        offset: i32,
        keys: i32,
    ) -> Box<dyn ChunkAttention + '_> {
        let shape = padded::shape(t, keys);
        let mask = if t > 1 || heads.window.is_some_and(|w| keys > w) {
            Some((shape.0, offset, shape.1))
        } else {
            (keys > offset + t).then_some((t, offset, keys))
        };
        Box::new(FusedChunk {
            heads,
            shape,
            canonical: true,
            mask: LazyMask::new(mask, self.placement.dtype).windowed(heads.window),
        })
    }

    fn step_attention(&self, heads: Heads, lens: &[i32]) -> Box<dyn StepAttention + '_> {
        if heads.window.is_some() || heads.sinks {
            // The custom kernels read every key up to the row's length and have no sink
            // column: these run through MLX's fused attention, masked.
            return Box::new(super::gpu::FusedStep::new(
                heads,
                lens,
                self.placement.dtype,
            ));
        }
        Box::new(CudaStep {
            heads,
            tables: self.reads_tables(heads),
            kernels: self.kernels,
            rows: PaddedRows::new(lens, self.placement.dtype),
            lengths: None,
        })
    }
}

/// A decode step's attention on CUDA: by block table where the table kernel reads these heads;
/// over gathered keys of rows of different lengths (or after a shared prefix), the length
/// kernel; else MLX's fused attention, masked.
struct CudaStep {
    heads: Heads,
    tables: bool,
    kernels: bool,
    rows: PaddedRows,
    /// The length kernel's lengths input, built at the first layer that uses it.
    lengths: Option<Array>,
}

impl StepAttention for CudaStep {
    fn layout(&self) -> OwnLayout {
        if self.tables {
            OwnLayout::Tables
        } else {
            OwnLayout::Padded
        }
    }

    fn attend(&mut self, q: &Array, keys: &BatchKeys, sinks: Option<&Array>) -> Result<Array> {
        let h = self.heads;
        if sinks.is_some() {
            return Err(crate::EngineError::Internal(
                "sinks reached the CUDA kernels' step".into(),
            ));
        }
        if let OwnKeys::Tables(t) = &keys.own {
            return attention::attend_tables(q, t, h.kv_heads);
        }
        self.rows.see(keys);
        if self.kernels
            && (self.rows.ragged() || keys.shared_len > 0)
            && let Some((own, shared)) = self.rows.own_and_shared()
        {
            let lengths = self
                .lengths
                .get_or_insert_with(|| attention::lengths(&own, shared));
            if let Some(out) = attention::attend_batch(q, keys, lengths, h.kv_heads)? {
                return Ok(out);
            }
        }
        fused_batch_attention(q, keys, h.scale, self.rows.mask()?, h.kv_heads, None)
    }
}
