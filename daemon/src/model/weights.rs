//! A model file's named tensors, and the layers an architecture takes out of them.
//!
//! A quantized weight arrives as `name.weight` (packed `u32`), `name.scales` and `name.biases`
//! (MLX affine quantization). Where the backend computes in f32 (the CPU) it is dequantized once
//! at load; on a GPU it stays quantized and runs through `quantized_matmul`.

use std::collections::HashMap;

use mlx_rs::{Array, Dtype, ops};

use crate::backend::{Backend, Linear};
use crate::{EngineError, Result};

/// Tensors by name, as the file names them.
pub struct Weights {
    tensors: HashMap<String, Array>,
    path: String,
    /// Quantization group size of the file's quantized tensors.
    group_size: i32,
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

    /// A linear layer `name` (with `name.bias` if present), as `backend` runs it, its
    /// tensors taken out of the file's: the layer holds what it needs, and a copy made here or
    /// later (dequantized, cast, joined) does not keep the file's tensor alive beside it.
    pub fn linear(&mut self, name: &str, backend: &dyn Backend) -> Result<Linear> {
        let linear = self.linear_of(name, backend)?;
        for key in ["weight", "scales", "biases", "bias"] {
            self.tensors.remove(&format!("{name}.{key}"));
        }
        self.tensors.remove(name);
        Ok(linear)
    }

    fn linear_of(&self, name: &str, backend: &dyn Backend) -> Result<Linear> {
        let placement = backend.placement();
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
        Ok(Linear::dense(w, bias, backend))
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
