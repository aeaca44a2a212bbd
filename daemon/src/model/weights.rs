//! Named tensors and linear layers.
//!
//! A quantized weight arrives as `name.weight` (packed `u32`), `name.scales` and `name.biases`
//! (MLX affine quantization). On the CPU it is dequantized once at load; on Metal it stays
//! quantized and runs through `quantized_matmul`.

use std::collections::HashMap;

use mlx_rs::{Array, Dtype, ops};

use super::skinny::Skinny;
use super::skinny_cuda::{self, CudaSkinny, Epilogue, RmsNorm};
use crate::device::{Backend, Placement};
use crate::{EngineError, Result};

/// Tensors by name, as the file names them.
pub struct Weights {
    tensors: HashMap<String, Array>,
    path: String,
    /// Quantization group size of the file's quantized tensors.
    group_size: i32,
}

/// A linear layer `y = x · Wᵀ (+ b)`.
#[derive(Clone)]
pub enum Linear {
    /// A dense weight stored transposed (`[in, out]`) for a plain matmul; where one runs, also
    /// a few-row kernel over the same buffer.
    Dense {
        wt: Array,
        bias: Option<Array>,
        skinny: Option<FewRows>,
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
    pub fn dense(w: Array, bias: Option<Array>, placement: Placement) -> Linear {
        let skinny = match placement.backend {
            Backend::Cpu if !placement.gpu => Skinny::new(&w).map(FewRows::Cpu),
            Backend::Cuda if skinny_cuda::wanted() => CudaSkinny::new(&w).map(FewRows::Cuda),
            _ => None,
        };
        Linear::Dense {
            wt: w.t(),
            bias,
            skinny,
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
        match self {
            Linear::Dense { wt, bias, .. } => wt.nbytes() + bias.as_ref().map_or(0, Array::nbytes),
            Linear::Quantized {
                w,
                scales,
                biases,
                bias,
                ..
            } => {
                w.nbytes()
                    + scales.nbytes()
                    + biases.nbytes()
                    + bias.as_ref().map_or(0, Array::nbytes)
            }
        }
    }

    /// Applies the layer to `x` (`[..., in]`).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (y, bias) = match self {
            Linear::Dense { wt, bias, skinny } => {
                let few = match skinny {
                    Some(k) => k.forward(x)?,
                    None => None,
                };
                match few {
                    Some(y) => (y, bias),
                    None => (ops::matmul(x, wt)?, bias),
                }
            }
            Linear::Quantized {
                w,
                scales,
                biases,
                group_size,
                bits,
                bias,
            } => (
                ops::quantized_matmul(x, w, scales, biases, true, *group_size, *bits)?,
                bias,
            ),
        };
        Ok(match bias {
            Some(b) => ops::add(&y, b)?,
            None => y,
        })
    }

    /// `residual + x · Wᵀ (+ bias)`: one node where CUDA's few-row kernel takes the sum
    /// ([`skinny_cuda::fuses`]), else the layer then an add.
    pub fn forward_add(&self, x: &Array, residual: &Array) -> Result<Array> {
        if let Some(k) = self.fusing_kernel()
            && let Some(y) = k.forward_with(x, Epilogue::Add(residual))?
        {
            return Ok(y);
        }
        Ok(ops::add(residual, &self.forward(x)?)?)
    }

    /// `silu(gate) * up` of a joined gate/up layer (gate rows first, as many as up rows), where
    /// CUDA's few-row kernel takes it; `None` elsewhere (the caller splits and multiplies).
    pub fn forward_swiglu(&self, x: &Array) -> Result<Option<Array>> {
        match self.fusing_kernel() {
            Some(k) => k.forward_with(x, Epilogue::SwiGlu),
            None => Ok(None),
        }
    }

    /// `rms_norm(x) · Wᵀ`, then `epilogue`, as one kernel where CUDA's few-row kernel takes it
    /// ([`skinny_cuda::fuses_norms`]); `None` elsewhere (the caller norms, then runs the layer).
    pub fn forward_normed(
        &self,
        x: &Array,
        norm: RmsNorm,
        epilogue: Epilogue,
    ) -> Result<Option<Array>> {
        match self.fusing_kernel() {
            Some(k) if skinny_cuda::fuses_norms() => k.forward_normed(x, norm, epilogue),
            _ => Ok(None),
        }
    }

    /// CUDA's few-row kernel, where it runs this layer and takes the op after it too (no bias,
    /// [`skinny_cuda::fuses`]).
    fn fusing_kernel(&self) -> Option<&CudaSkinny> {
        match self {
            Linear::Dense {
                bias: None,
                skinny: Some(FewRows::Cuda(k)),
                ..
            } if skinny_cuda::fuses() => Some(k),
            _ => None,
        }
    }
}

/// The decode step's matmul for a few rows, where the device's own costs more per call: the
/// CPU's `sgemm` packs the whole weight; CUDA's cuBLAS costs the host ~20 µs a call (see
/// `skinny_cuda`).
#[derive(Clone)]
pub enum FewRows {
    Cpu(Skinny),
    Cuda(CudaSkinny),
}

impl FewRows {
    /// `x · Wᵀ`, or `None` where `x` is not for this kernel (the caller runs MLX's matmul).
    fn forward(&self, x: &Array) -> Result<Option<Array>> {
        match self {
            FewRows::Cpu(k) => k.forward(x),
            FewRows::Cuda(k) => k.forward(x),
        }
    }
}

impl Weights {
    /// Wraps the tensors of the file at `path`.
    pub fn new(tensors: HashMap<String, Array>, path: &str, group_size: i32) -> Self {
        Self {
            tensors,
            path: path.into(),
            group_size,
        }
    }

    fn missing(&self, name: &str) -> EngineError {
        EngineError::Model {
            path: self.path.clone(),
            reason: format!("tensor `{name}` is missing"),
        }
    }

    /// Whether the file has tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A tensor as stored (quantized ones dequantized), cast to `dtype`.
    pub fn dense(&self, name: &str, dtype: Dtype) -> Result<Array> {
        let w = self
            .tensors
            .get(&format!("{name}.weight"))
            .or_else(|| self.tensors.get(name));
        let w = w.ok_or_else(|| self.missing(&format!("{name}.weight")))?;
        let out = match self.quantization(name)? {
            Some((scales, biases, bits)) => {
                ops::dequantize(w, scales, biases, self.group_size, bits)?
            }
            None => w.clone(),
        };
        cast(&out, dtype)
    }

    /// An optional 1-D tensor (norm weights, biases), cast to `dtype`.
    pub fn vector(&self, name: &str, dtype: Dtype) -> Result<Option<Array>> {
        self.tensors.get(name).map(|a| cast(a, dtype)).transpose()
    }

    /// A linear layer `name` (with `name.bias` if present), placed as `placement` wants, its
    /// tensors taken out of the file's: the layer holds what it needs, and a copy made here or
    /// later (dequantized, cast, joined) does not keep the file's tensor alive beside it.
    pub fn linear(&mut self, name: &str, placement: Placement) -> Result<Linear> {
        let linear = self.linear_of(name, placement)?;
        for key in ["weight", "scales", "biases", "bias"] {
            self.tensors.remove(&format!("{name}.{key}"));
        }
        self.tensors.remove(name);
        Ok(linear)
    }

    fn linear_of(&self, name: &str, placement: Placement) -> Result<Linear> {
        let bias = self.vector(&format!("{name}.bias"), placement.dtype)?;
        if placement.keep_quantized
            && let Some((scales, biases, bits)) = self.quantization(name)?
        {
            let w = self
                .tensors
                .get(&format!("{name}.weight"))
                .ok_or_else(|| self.missing(name))?;
            return Ok(Linear::Quantized {
                w: w.clone(),
                scales: cast(scales, placement.dtype)?,
                biases: cast(biases, placement.dtype)?,
                group_size: self.group_size,
                bits,
                bias,
            });
        }
        let w = self.dense(name, placement.dtype)?;
        // Dequantize now, once; the transpose is a view BLAS reads with its transpose flag.
        w.eval()?;
        Ok(Linear::dense(w, bias, placement))
    }

    /// The scales, biases and bit width of a quantized tensor (None if it is not quantized).
    fn quantization(&self, name: &str) -> Result<Option<(&Array, &Array, i32)>> {
        let (Some(scales), Some(biases)) = (
            self.tensors.get(&format!("{name}.scales")),
            self.tensors.get(&format!("{name}.biases")),
        ) else {
            return Ok(None);
        };
        let w = self
            .tensors
            .get(&format!("{name}.weight"))
            .ok_or_else(|| self.missing(name))?;
        if w.ndim() != 2 || scales.ndim() != 2 {
            return Err(EngineError::Model {
                path: self.path.clone(),
                reason: format!("quantized tensor `{name}` is not a matrix"),
            });
        }
        let (packed, groups) = (w.shape()[1], scales.shape()[1]);
        let bits = if groups > 0 {
            packed * 32 / (groups * self.group_size)
        } else {
            0
        };
        if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) || w.dtype() != Dtype::Uint32 {
            return Err(EngineError::Model {
                path: self.path.clone(),
                reason: format!(
                    "tensor `{name}` has an unsupported quantization ({bits} bits, {:?})",
                    w.dtype()
                ),
            });
        }
        Ok(Some((scales, biases, bits)))
    }
}

/// `a` as `dtype`. A float64 source (a safetensors file may hold one) is cast on the CPU: GPUs
/// (Metal, CUDA) have no float64, so that cast cannot run on the default device there.
fn cast(a: &Array, dtype: Dtype) -> Result<Array> {
    if a.dtype() == Dtype::Float64 {
        return Ok(mlx_rs::with_device(mlx_rs::Device::cpu(), || {
            a.as_dtype(dtype)
        })?);
    }
    Ok(a.as_dtype(dtype)?)
}
