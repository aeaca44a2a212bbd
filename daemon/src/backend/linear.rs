//! Linear layers `y = x · Wᵀ (+ b)`, dense or MLX affine-quantized, with a backend's few-row
//! kernel for a decode step's handful of rows where it has one ([`FewRows`]).

use std::rc::Rc;

use mlx_rs::{Array, ops};

use super::Backend;
use crate::Result;

/// What a projection's kernel does with each output before storing it.
pub enum Epilogue<'a> {
    /// Stores it.
    Plain,
    /// Adds `r` (the residual stream, shaped as the output) to it: `r + x · Wᵀ`.
    Add(&'a Array),
    /// The weight is a gate's rows then an up projection's, as many each: stores
    /// `silu(gate) * up`, half as many outputs.
    SwiGlu,
}

/// A decode step's matmul for a few rows, where the device's own costs more per call (the CPU's
/// `sgemm` packs the whole weight; CUDA's cuBLAS costs the host ~20 µs a call).
pub trait FewRows {
    /// `x · Wᵀ` followed by `epilogue`, or `None` where `x` or the epilogue is not for this
    /// kernel (the caller runs MLX's ops).
    fn forward(&self, x: &Array, epilogue: &Epilogue) -> Result<Option<Array>>;
}

/// A linear layer `y = x · Wᵀ (+ b)`.
#[derive(Clone)]
pub enum Linear {
    /// A dense weight stored transposed (`[in, out]`) for a plain matmul; where the backend has
    /// one, also a few-row kernel over the same buffer.
    Dense {
        wt: Array,
        bias: Option<Array>,
        few: Option<Rc<dyn FewRows>>,
    },
    /// MLX affine-quantized weight.
    Quantized {
        w: Array,
        scales: Array,
        biases: Array,
        group_size: i32,
        bits: i32,
        bias: Option<Array>,
    },
}

impl Linear {
    /// A dense layer over `w` (`[out, in]`, evaluated).
    pub fn dense(w: Array, bias: Option<Array>, backend: &dyn Backend) -> Linear {
        Linear::Dense {
            few: backend.few_rows(&w),
            wt: w.t(),
            bias,
        }
    }

    /// Output features (rows of the weight).
    pub fn out_features(&self) -> i32 {
        match self {
            Linear::Dense { wt, .. } => wt.shape()[1],
            Linear::Quantized { w, .. } => w.shape()[0],
        }
    }

    /// The added bias, if any.
    pub fn bias(&self) -> Option<&Array> {
        match self {
            Linear::Dense { bias, .. } | Linear::Quantized { bias, .. } => bias.as_ref(),
        }
    }

    /// A dense layer's weight as `[out, in]` (a view), None for a quantized one.
    pub fn dense_weight(&self) -> Option<Array> {
        match self {
            Linear::Dense { wt, .. } => Some(wt.t()),
            Linear::Quantized { .. } => None,
        }
    }

    /// A quantized layer's packed weight, scales, biases, group size and bits.
    pub fn quantized(&self) -> Option<(&Array, &Array, &Array, i32, i32)> {
        match self {
            Linear::Quantized {
                w,
                scales,
                biases,
                group_size,
                bits,
                ..
            } => Some((w, scales, biases, *group_size, *bits)),
            Linear::Dense { .. } => None,
        }
    }

    /// Bytes of parameters a forward pass reads.
    pub fn nbytes(&self) -> usize {
        let bias = self.bias().map_or(0, Array::nbytes);
        match self {
            Linear::Dense { wt, .. } => wt.nbytes() + bias,
            Linear::Quantized {
                w, scales, biases, ..
            } => w.nbytes() + scales.nbytes() + biases.nbytes() + bias,
        }
    }

    /// Applies the layer to `x` (`[..., in]`).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = match self {
            Linear::Dense { wt, few, .. } => match few {
                Some(k) => match k.forward(x, &Epilogue::Plain)? {
                    Some(y) => y,
                    None => ops::matmul(x, wt)?,
                },
                None => ops::matmul(x, wt)?,
            },
            Linear::Quantized {
                w,
                scales,
                biases,
                group_size,
                bits,
                ..
            } => ops::quantized_matmul(x, w, scales, biases, true, *group_size, *bits)?,
        };
        Ok(match self.bias() {
            Some(b) => ops::add(&y, b)?,
            None => y,
        })
    }

    /// `residual + x · Wᵀ (+ bias)`: one kernel where the few-row kernel takes the sum, else the
    /// layer then an add.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        if let Some(y) = self.fused(x, &Epilogue::Add(residual))? {
            return Ok(y);
        }
        Ok(ops::add(residual, &self.forward(x)?)?)
    }

    /// `silu(gate) * up` of a joined gate/up layer (gate rows first, as many as up rows), where
    /// the few-row kernel takes it; `None` elsewhere (the caller splits and multiplies).
    pub fn forward_swiglu(&self, x: &Array) -> Result<Option<Array>> {
        self.fused(x, &Epilogue::SwiGlu)
    }

    /// `x · Wᵀ` then `epilogue` in the few-row kernel, where it runs this layer (no bias) and
    /// takes the epilogue.
    fn fused(&self, x: &Array, epilogue: &Epilogue) -> Result<Option<Array>> {
        match self {
            Linear::Dense {
                bias: None,
                few: Some(k),
                ..
            } => k.forward(x, epilogue),
            _ => Ok(None),
        }
    }
}
