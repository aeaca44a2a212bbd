//! MLX's quantized formats, and the ops over them in every mode: mlx-rs 0.33 passes only
//! "affine", so the other modes (MXFP4, NVFP4, MXFP8: gpt-oss's experts) call MLX's C API.

use std::ffi::CStr;

use mlx_rs::{Array, Dtype, ops};

use crate::{EngineError, Result};

/// An MLX quantization mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `w = scale * q + bias` per group, 2 to 8 bits.
    Affine,
    /// 4-bit floats (e2m1), a power-of-two (e8m0) scale per 32.
    Mxfp4,
    /// 4-bit floats, an e4m3 scale per 16.
    Nvfp4,
    /// 8-bit floats, a power-of-two scale per 32.
    Mxfp8,
}

impl Mode {
    fn name(self) -> &'static CStr {
        match self {
            Mode::Affine => c"affine",
            Mode::Mxfp4 => c"mxfp4",
            Mode::Nvfp4 => c"nvfp4",
            Mode::Mxfp8 => c"mxfp8",
        }
    }

    /// The floating-point mode of a tensor whose scales are `u8` (no biases), from its packed
    /// width per scale (`bits * group_size / 32` u32 words): what MLX's loader infers too.
    pub fn of_float(words_per_scale: i32) -> Option<(Mode, i32, i32)> {
        match words_per_scale {
            4 => Some((Mode::Mxfp4, 32, 4)),
            2 => Some((Mode::Nvfp4, 16, 4)),
            8 => Some((Mode::Mxfp8, 32, 8)),
            _ => None,
        }
    }
}

/// How a quantized tensor is stored beside its packed `u32` weight.
#[derive(Clone)]
pub struct Format {
    pub scales: Array,
    /// Affine only.
    pub biases: Option<Array>,
    pub group_size: i32,
    pub bits: i32,
    pub mode: Mode,
}

fn optional_int(value: i32) -> mlx_sys::mlx_optional_int {
    mlx_sys::mlx_optional_int {
        value,
        has_value: true,
    }
}

/// Runs an MLX C op that writes one array, freeing what the call does not hand over.
///
/// SAFETY (the caller's): `call` passes only live arrays and streams.
unsafe fn one_result(
    what: &str,
    call: impl FnOnce(*mut mlx_sys::mlx_array, mlx_sys::mlx_array) -> i32,
) -> Result<Array> {
    // SAFETY: `empty` and `res` are fresh arrays owned here; `res` is handed to the Array on
    // success, both are freed otherwise.
    unsafe {
        let empty = mlx_sys::mlx_array_new();
        let mut res = mlx_sys::mlx_array_new();
        let status = call(&mut res, empty);
        mlx_sys::mlx_array_free(empty);
        if status != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(EngineError::Internal(format!("MLX's {what} failed")));
        }
        Ok(Array::from_ptr(res))
    }
}

/// `w` (packed as `format` says) as `dtype`.
pub fn dequantize(w: &Array, format: &Format, dtype: Dtype) -> Result<Array> {
    if let (Mode::Affine, Some(biases)) = (format.mode, &format.biases) {
        let out = ops::dequantize(w, &format.scales, biases, format.group_size, format.bits)?;
        return Ok(out.as_dtype(dtype)?);
    }
    let stream = mlx_rs::Stream::new();
    // SAFETY: every operand is a live array for the call's duration.
    let out = unsafe {
        one_result("dequantize", |res, empty| {
            mlx_sys::mlx_dequantize(
                res,
                w.as_ptr(),
                format.scales.as_ptr(),
                format.biases.as_ref().map_or(empty, |b| b.as_ptr()),
                optional_int(format.group_size),
                optional_int(format.bits),
                format.mode.name().as_ptr(),
                empty,
                mlx_sys::mlx_optional_dtype {
                    value: mlx_sys::mlx_dtype__MLX_FLOAT32,
                    has_value: false,
                },
                stream.as_ptr(),
            )
        })?
    };
    Ok(out.as_dtype(dtype)?)
}

/// MLX's gathered quantized matmul: `x` against the transposed experts `w` that `idx` names.
pub fn gather_qmm(
    x: &Array,
    w: &Array,
    format: &Format,
    idx: &Array,
    sorted: bool,
) -> Result<Array> {
    let stream = mlx_rs::Stream::new();
    // SAFETY: every operand is a live array for the call's duration.
    unsafe {
        one_result("gather_qmm", |res, empty| {
            mlx_sys::mlx_gather_qmm(
                res,
                x.as_ptr(),
                w.as_ptr(),
                format.scales.as_ptr(),
                format.biases.as_ref().map_or(empty, |b| b.as_ptr()),
                empty,
                idx.as_ptr(),
                true,
                optional_int(format.group_size),
                optional_int(format.bits),
                format.mode.name().as_ptr(),
                sorted,
                stream.as_ptr(),
            )
        })
    }
}
