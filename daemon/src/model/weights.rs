//! A model file's named tensors, and the layers an architecture takes out of them.
//!
//! A quantized weight arrives as `name.weight` (packed `u32`), `name.scales` and `name.biases`
//! (MLX affine quantization). Where the backend computes in f32 (the CPU) it is dequantized once
//! at load; on a GPU it stays quantized and runs through `quantized_matmul`.

use std::collections::HashMap;

use mlx_rs::{Array, Dtype, ops};

use crate::backend::{Backend, Linear};
use crate::model::moe::Experts;
use crate::model::quantized::{self, Format, Mode};
use crate::{EngineError, Result};

/// Tensors by name, as the file names them.
pub struct Weights {
    tensors: HashMap<String, Array>,
    path: String,
    /// Quantization group size of the file's affine-quantized tensors ...
    group_size: i32,
    /// ... except these (mlx-community files name layers quantized otherwise, e.g. a router
    /// kept at 8 bits in groups of 64).
    group_sizes: HashMap<String, i32>,
}

impl Weights {
    /// Wraps the tensors of the file at `path`.
    pub fn new(tensors: HashMap<String, Array>, path: &str, group_size: i32) -> Self {
        Self {
            tensors,
            path: path.into(),
            group_size,
            group_sizes: HashMap::new(),
        }
    }

    /// The same, with tensors (by layer name) quantized in other group sizes.
    pub fn with_group_sizes(mut self, group_sizes: HashMap<String, i32>) -> Self {
        self.group_sizes = group_sizes;
        self
    }

    /// The error for a tensor the file lacks.
    pub fn missing(&self, name: &str) -> EngineError {
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
        match self.quantization(name)? {
            Some(format) => quantized::dequantize(w, &format, dtype),
            None => cast(w, dtype),
        }
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
        self.take_out(name);
        Ok(linear)
    }

    /// Drops layer `name`'s tensors (what was made of them holds what it needs).
    fn take_out(&mut self, name: &str) {
        for key in ["weight", "scales", "biases", "bias"] {
            self.tensors.remove(&format!("{name}.{key}"));
        }
        self.tensors.remove(name);
    }

    /// Layer `name`'s packed weight and format where the placement keeps it quantized, affine
    /// scales and biases cast to the placement's dtype (float modes' u8 scales stay as stored).
    fn kept_quantized(&self, name: &str, backend: &dyn Backend) -> Result<Option<(Array, Format)>> {
        let placement = backend.placement();
        if !placement.keep_quantized {
            return Ok(None);
        }
        let Some(mut format) = self.quantization(name)? else {
            return Ok(None);
        };
        let w = self
            .tensors
            .get(&format!("{name}.weight"))
            .ok_or_else(|| self.missing(name))?;
        if format.mode == Mode::Affine {
            format.scales = cast(&format.scales, placement.dtype)?;
            format.biases = (format.biases.as_ref())
                .map(|b| cast(b, placement.dtype))
                .transpose()?;
        }
        Ok(Some((w.clone(), format)))
    }

    fn linear_of(&self, name: &str, backend: &dyn Backend) -> Result<Linear> {
        let placement = backend.placement();
        let bias = self.vector(&format!("{name}.bias"), placement.dtype)?;
        // The backends' quantized matmuls are affine; other modes are dequantized here.
        if let Some((w, format)) = self.kept_quantized(name, backend)?
            && let (Mode::Affine, Some(biases)) = (format.mode, format.biases)
        {
            return Ok(Linear::Quantized {
                w,
                scales: format.scales,
                biases,
                group_size: format.group_size,
                bits: format.bits,
                bias,
            });
        }
        let w = self.dense(name, placement.dtype)?;
        // Dequantize now, once; the transpose is a view BLAS reads with its transpose flag.
        w.eval()?;
        Ok(Linear::dense(w, bias, backend))
    }

    /// The stacked projections of a mixture's experts, `name` (`[experts, out, in]`, with
    /// `name.bias` `[experts, out]` if present), as `backend` runs them, taken out of the file's
    /// tensors. Hugging Face checkpoints that keep one tensor per expert (`experts.E.` where
    /// MLX's have `switch_mlp.`) are stacked here.
    pub fn experts(&mut self, name: &str, backend: &dyn Backend) -> Result<Experts> {
        let placement = backend.placement();
        let bias = self.vector(&format!("{name}.bias"), placement.dtype)?;
        let out = if !self.has(&format!("{name}.weight")) && name.contains("switch_mlp") {
            let mut parts = Vec::new();
            while let Some(one) = self.tensors.remove(&format!(
                "{}.weight",
                name.replace("switch_mlp", &format!("experts.{}", parts.len()))
            )) {
                parts.push(cast(&one, placement.dtype)?);
            }
            if parts.is_empty() {
                return Err(self.missing(&format!("{name}.weight")));
            }
            let stacked = ops::stack(&parts, 0)?;
            stacked.eval()?;
            Experts::Dense {
                wt: stacked.swap_axes(-1, -2)?,
                bias,
            }
        } else if let Some((w, format)) = self.kept_quantized(name, backend)? {
            Experts::Quantized { w, format, bias }
        } else {
            let w = self.dense(name, placement.dtype)?;
            w.eval()?;
            Experts::Dense {
                wt: w.swap_axes(-1, -2)?,
                bias,
            }
        };
        self.take_out(name);
        Ok(out)
    }

    /// How tensor `name` is quantized (None if it is not): affine with biases (its bit width
    /// from the packed and scale widths and the group size), or a float mode (u8 scales, no
    /// biases) inferred from the same widths, as MLX's loader does.
    fn quantization(&self, name: &str) -> Result<Option<Format>> {
        let Some(scales) = self.tensors.get(&format!("{name}.scales")) else {
            return Ok(None);
        };
        let bad = |reason: String| EngineError::Model {
            path: self.path.clone(),
            reason: format!("quantized tensor `{name}`: {reason}"),
        };
        let w = self
            .tensors
            .get(&format!("{name}.weight"))
            .ok_or_else(|| self.missing(&format!("{name}.weight")))?;
        if !matches!(w.ndim(), 2 | 3) || scales.ndim() != w.ndim() || w.dtype() != Dtype::Uint32 {
            return Err(bad(format!(
                "{:?} {:?} with scales {:?} is not a packed matrix or a stack of them",
                w.dtype(),
                w.shape(),
                scales.shape()
            )));
        }
        let last = w.ndim() - 1;
        let (packed, groups) = (w.shape()[last], scales.shape()[last]);
        let biases = self.tensors.get(&format!("{name}.biases")).cloned();
        let (mode, group_size, bits) = match &biases {
            None if scales.dtype() == Dtype::Uint8 && groups > 0 && packed % groups == 0 => {
                Mode::of_float(packed / groups).ok_or_else(|| {
                    bad(format!(
                        "{} words per scale is no MLX format",
                        packed / groups
                    ))
                })?
            }
            None => return Err(bad("scales without biases".into())),
            Some(_) => {
                let gs = self
                    .group_sizes
                    .get(name)
                    .copied()
                    .unwrap_or(self.group_size);
                let bits = if groups > 0 && gs > 0 {
                    packed * 32 / (groups * gs)
                } else {
                    0
                };
                if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) || packed * 32 != bits * groups * gs {
                    return Err(bad(format!("{bits} bits in groups of {gs} is unsupported")));
                }
                (Mode::Affine, gs, bits)
            }
        };
        Ok(Some(Format {
            scales: scales.clone(),
            biases,
            group_size,
            bits,
            mode,
        }))
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
