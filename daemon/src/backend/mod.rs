//! The operations architectures are written against, provided by a backend chosen once at load:
//! an architecture in `model/` asks for a projection, a rotation, the attention of a prefill
//! chunk or of a decode step, and never which device it runs on.
//!
//! - [`cpu`]: MLX's CPU backend, which has no fused kernels: RoPE by precomputed angles,
//!   attention read in place from the K/V spans, a few-row matmul for decode steps.
//! - [`gpu`]: a GPU through MLX's own fused ops (`fast::rope`, `fast::scaled_dot_product_attention`),
//!   what Metal runs.
//! - `cuda` (CUDA builds only): the GPU path with prefill padded to a few shapes (MLX builds
//!   CUDA kernels per shape) and custom kernels (a few-row matmul with fused epilogues, a decode
//!   attention that reads the pool by block table).
//! - [`linear`] and [`joined`]: projections (dense or quantized), with a backend's few-row kernel
//!   where it has one, and projections that read one input joined into one matmul.
//! - [`masks`]: the additive attention masks the plain-op paths use.
//!
//! A layer's attention may see only a sliding window of keys ([`Heads::window`]) and may have
//! sink logits ([`Heads::sinks`]): the backends run both through their plain-op or fused paths
//! (their custom kernels read every key up to the diagonal, and have no sink column).

use std::rc::Rc;

use mlx_rs::Array;

use crate::Result;
use crate::device::Placement;
use crate::kv::{BatchKeys, OwnLayout};

pub mod cpu;
#[cfg(mlxcel_cuda)]
pub mod cuda;
pub mod gpu;
pub mod joined;
pub mod linear;
pub mod masks;

pub use joined::Joined;
pub use linear::{Epilogue, FewRows, Linear};

/// One attention layer's heads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heads {
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    /// Multiplies the scores (`1 / sqrt(head_dim)` for most models).
    pub scale: f32,
    /// A sliding-window layer: each query sees itself and the `window - 1` keys before it.
    pub window: Option<i32>,
    /// Each head has a learned sink logit (gpt-oss): a column in the softmax with no value.
    pub sinks: bool,
}

impl Heads {
    /// Query heads per KV head.
    pub fn group(&self) -> i32 {
        self.heads / self.kv_heads.max(1)
    }
}

/// A rotary position embedding: which dimensions turn and how fast.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// Dimensions rotated (the head's, or its first part for partial rotary).
    pub dims: i32,
    pub theta: f32,
    /// Pairs are adjacent dimensions (`2i`, `2i + 1`) rather than halves.
    pub traditional: bool,
    /// Multiplies positions (linear RoPE scaling: `1 / factor`).
    pub scale: f32,
    /// Each pair's frequency (radians per position) where the model computes its own (YaRN,
    /// proportional RoPE); else `theta^(-2i / dims)`.
    pub freqs: Option<Vec<f32>>,
}

impl RopeSpec {
    /// The plain rotation of `dims` dimensions at base `theta`.
    pub fn plain(dims: i32, theta: f32, traditional: bool) -> RopeSpec {
        RopeSpec {
            dims,
            theta,
            traditional,
            scale: 1.0,
            freqs: None,
        }
    }
}

/// The positions a forward pass rotates.
#[derive(Debug, Clone, Copy)]
pub enum Positions<'a> {
    /// `t` consecutive positions from `start` (a prefill chunk).
    Span { start: i32, t: i32 },
    /// One position per row of a batch (a decode step).
    PerRow(&'a [i32]),
}

/// A rotation of one forward pass's positions, applied to q and k of every layer.
pub trait Rotate {
    /// `x` (`[b, heads, t, head_dim]`) rotated.
    fn apply(&self, x: &Array) -> Result<Array>;
}

/// The attention of one prefill chunk, for every layer of one pass: built once per chunk, so
/// what every layer shares (its mask) is built once.
pub trait ChunkAttention {
    /// Queries `[1, heads, t, head_dim]` over the sequence's K/V `spans` (`[1, kv_heads, n_i,
    /// head_dim]` each, covering at least its positions up to the chunk's last; the rest is
    /// masked), with the layer's `sinks` (`[heads]`, where [`Heads::sinks`]). Returns `[1, t,
    /// heads * head_dim]`.
    fn attend(
        &mut self,
        q: &Array,
        spans: &[(Array, Array)],
        sinks: Option<&Array>,
    ) -> Result<Array>;
}

/// The attention of one batched decode step, for every layer of it.
pub trait StepAttention {
    /// How the step's K/V store should hand each row's own keys over.
    fn layout(&self) -> OwnLayout;
    /// Queries `[b, heads, 1, head_dim]` over `keys`, with the layer's `sinks` (`[heads]`,
    /// where [`Heads::sinks`]). Returns `[b, 1, heads * head_dim]`.
    fn attend(&mut self, q: &Array, keys: &BatchKeys, sinks: Option<&Array>) -> Result<Array>;
}

/// What a warm-up runs so that no request meets a shape whose kernels it has not built.
pub trait WarmUp {
    /// Prefill chunk sizes to run through the model, for chunks of at most `chunk` tokens.
    fn chunks(&self, chunk: usize) -> Vec<usize> {
        vec![chunk]
    }
    /// Builds the prefill attention's shapes for chunks of at most `chunk` tokens over at most
    /// `keys` keys, on their own; how many.
    fn attention(&self, _heads: Heads, _chunk: usize, _keys: usize) -> Result<usize> {
        Ok(0)
    }
    /// Batch sizes to step, for batches of at most `max` rows.
    fn batches(&self, max: usize) -> Vec<usize> {
        vec![max]
    }
    /// Where decode steps split a long row's keys into parts: from this many keys.
    fn split_decode_from(&self, _heads: Heads) -> Option<usize> {
        None
    }
}

/// A backend: the operations of one device and formulation.
pub trait Backend: WarmUp {
    /// Where it computes and in which precision.
    fn placement(&self) -> &Placement;

    /// The decode step's kernel for a dense weight `[out, in]` (evaluated, in the placement's
    /// dtype), where this backend has one.
    fn few_rows(&self, _w: &Array) -> Option<Rc<dyn FewRows>> {
        None
    }

    /// `silu(g) * u`.
    fn silu_mul(&self, g: &Array, u: &Array) -> Result<Array>;

    /// The rotation of `at` by `spec`.
    fn rope(&self, spec: &RopeSpec, at: Positions<'_>) -> Result<Box<dyn Rotate>>;

    /// Rows a packed prefill pass of `tokens` tokens runs as (padding rows after them).
    fn prefill_rows(&self, tokens: i32) -> i32 {
        tokens
    }

    /// The attention of a prefill chunk of `t` queries at positions `offset..offset + t` whose
    /// spans hold `keys` positions.
    fn chunk_attention(
        &self,
        heads: Heads,
        t: i32,
        offset: i32,
        keys: i32,
    ) -> Box<dyn ChunkAttention + '_>;

    /// The attention of a decode step over rows whose stored lengths (before the step) are
    /// `lens`.
    fn step_attention(&self, heads: Heads, lens: &[i32]) -> Box<dyn StepAttention + '_>;
}

/// The backend `placement` asks for: the CPU's, CUDA's (a CUDA device, or CUDA's padded
/// formulation run elsewhere for tests), or a GPU's plain MLX path.
pub fn for_placement(placement: Placement) -> Rc<dyn Backend> {
    if !placement.gpu {
        return Rc::new(cpu::Cpu::new(placement));
    }
    #[cfg(mlxcel_cuda)]
    if placement.pads_prefill {
        return Rc::new(cuda::Cuda::new(placement));
    }
    Rc::new(gpu::Gpu::new(placement))
}
