//! Mixture-of-experts feed-forward blocks (Qwen3-MoE, gpt-oss): a router scores every expert for
//! each row, the row runs through its top k experts (MLX's gathered matmuls over the experts'
//! stacked weights, quantized or not, for every row of a pass at once), and their outputs are
//! summed with the routing weights.

use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype, ops};

use super::activation::Activation;
use super::quantized::{self, Format};
use crate::Result;
use crate::backend::{Backend, Linear};

/// How a router's scores become the chosen experts and their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// A softmax over every expert, then the top k (renormalized to sum to 1 when `norm`):
    /// Qwen3-MoE, Mixtral.
    SoftmaxTopK { norm: bool },
    /// The top k raw scores, then a softmax over those k: gpt-oss.
    TopKSoftmax,
}

/// One projection of every expert, stacked: `[experts, out, in]`.
pub enum Experts {
    /// Dense: kept as `[experts, in, out]` (a transposed view) for the gathered matmul.
    Dense { wt: Array, bias: Option<Array> },
    /// MLX-quantized, in any of its modes.
    Quantized {
        w: Array,
        format: Format,
        bias: Option<Array>,
    },
}

impl Experts {
    /// Bytes of its parameters.
    pub fn nbytes(&self) -> usize {
        let bias = |b: &Option<Array>| b.as_ref().map_or(0, Array::nbytes);
        match self {
            Experts::Dense { wt, bias: b } => wt.nbytes() + bias(b),
            Experts::Quantized { w, format, bias: b } => {
                w.nbytes() + format.scales.nbytes() + bias(&format.biases) + bias(b)
            }
        }
    }

    /// `x` (`[..., 1, in]`, rows broadcast against `idx`) through the experts `idx` names:
    /// `[..., k, 1, out]` (or, `sorted`, `x` `[m, 1, in]` and `idx` `[m]` in expert order).
    fn forward(&self, x: &Array, idx: &Array, sorted: bool) -> Result<Array> {
        let (y, bias) = match self {
            Experts::Dense { wt, bias } => (ops::gather_mm(x, wt, None, idx, sorted)?, bias),
            Experts::Quantized { w, format, bias } => {
                (quantized::gather_qmm(x, w, format, idx, sorted)?, bias)
            }
        };
        Ok(match bias {
            Some(b) => ops::add(&y, &ops::expand_dims_axes(&b.take_axis(idx, 0)?, &[-2])?)?,
            None => y,
        })
    }
}

/// A mixture-of-experts block.
pub struct Moe {
    pub router: Linear,
    pub gate: Experts,
    pub up: Experts,
    pub down: Experts,
    pub top_k: i32,
    pub routing: Routing,
    pub activation: Activation,
}

/// From this many (row, expert) pairs a pass sorts its rows by expert, so each expert's
/// weights are read once (mlx_lm's threshold).
const SORT_FROM: i32 = 64;

impl Moe {
    /// Bytes a decode step reads (the router and, of the experts, the top k's share).
    pub fn nbytes_per_token(&self, experts: i32) -> usize {
        let share = |e: &Experts| e.nbytes() * self.top_k as usize / experts.max(1) as usize;
        self.router.nbytes() + share(&self.gate) + share(&self.up) + share(&self.down)
    }

    /// The block over `h` (`[..., hidden]`).
    pub fn forward(&self, h: &Array, backend: &dyn Backend) -> Result<Array> {
        let shape = h.shape().to_vec();
        let d = *shape.last().unwrap_or(&0);
        let x = h.reshape(&[-1, d])?;
        let n = x.shape()[0];
        let k = self.top_k;
        let scores = self.router.forward(&x)?.as_dtype(Dtype::Float32)?;
        let top = |s: &Array| -> Result<Array> {
            let neg = ops::negative(s)?;
            Ok(ops::argpartition_axis(&neg, k - 1, -1)?.index((.., ..k)))
        };
        let (idx, weights) = match self.routing {
            Routing::SoftmaxTopK { norm } => {
                let probs = ops::softmax_axis(&scores, -1, true)?;
                let idx = top(&probs)?;
                let mut w = probs.take_along_axis(&idx, -1)?;
                if norm {
                    w = ops::divide(&w, &ops::sum_axis(&w, -1, true)?)?;
                }
                (idx, w)
            }
            Routing::TopKSoftmax => {
                let idx = top(&scores)?;
                let w = ops::softmax_axis(&scores.take_along_axis(&idx, -1)?, -1, true)?;
                (idx, w)
            }
        };
        let idx = idx.as_dtype(Dtype::Uint32)?;
        let y = if n * k >= SORT_FROM {
            let flat = idx.reshape(&[-1])?;
            let order = ops::argsort_axis(&flat, 0)?;
            let back = ops::argsort_axis(&order, 0)?;
            let rows = ops::floor_divide(&order, Array::from_int(k))?;
            let xs = ops::expand_dims_axes(&x.take_axis(&rows, 0)?, &[-2])?;
            let ids = flat.take_axis(&order, 0)?;
            let y = self.experts(&xs, &ids, true, backend)?;
            y.take_axis(&back, 0)?.reshape(&[n, k, d])?
        } else {
            let xs = ops::expand_dims_axes(&x, &[-2, -3])?;
            self.experts(&xs, &idx, false, backend)?
                .reshape(&[n, k, d])?
        };
        let weighted = ops::multiply(
            &y,
            &ops::expand_dims_axes(&weights.as_dtype(y.dtype())?, &[-1])?,
        )?;
        Ok(ops::sum_axis(&weighted, -2, false)?.reshape(&shape)?)
    }

    fn experts(
        &self,
        x: &Array,
        idx: &Array,
        sorted: bool,
        backend: &dyn Backend,
    ) -> Result<Array> {
        let up = self.up.forward(x, idx, sorted)?;
        let gate = self.gate.forward(x, idx, sorted)?;
        let act = self.activation.apply(&gate, &up, backend)?;
        self.down.forward(&act, idx, sorted)
    }
}
