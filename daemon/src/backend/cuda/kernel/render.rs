//! The CUDA C that MLX compiles for one application of a custom kernel, written as MLX 0.32's
//! `build_kernel` (`mlx/backend/cuda/custom_kernel.cpp`) writes it: MLX's device header, the
//! kernel's header, then in `mlx::core::cu` a `__global__` function whose parameters are each
//! input (`const T* name`, then `name_shape` / `name_strides` / `name_ndim` where the body names
//! them and the input has a rank), each output, and whose body starts with the template
//! constants.
//!
//! [`write_sources_to`] makes every later application write its source to a directory, so that
//! `scripts/cuda_kernel_check.sh` (through `tests/kernel_sources.rs`) can compile every kernel
//! with NVRTC on a machine without a GPU. Where MLX has no CUDA back end, an application then gives zeros of its outputs' shapes
//! (so the caller goes on and the next kernel is written too); nothing else reads them.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mlx_rs::{Array, Dtype, ops};

use super::Constant;
use crate::{EngineError, Result};

/// A kernel's description as the caller gave it.
pub struct Parts {
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub source: String,
    pub header: String,
}

static SOURCES: OnceLock<PathBuf> = OnceLock::new();

/// From now on, each application's source is written into `dir` (once per process; a second
/// call is refused, false).
pub fn write_sources_to(dir: PathBuf) -> bool {
    SOURCES.set(dir).is_ok()
}

/// Where applications' sources are written, if anywhere ([`write_sources_to`]).
pub fn sources_dir() -> Option<&'static Path> {
    SOURCES.get().map(PathBuf::as_path)
}

/// The name MLX gives one application's kernel and the source it compiles.
pub fn render(
    parts: &Parts,
    inputs: &[&Array],
    outputs: &[(&[i32], Dtype)],
    constants: &[Constant],
) -> Result<(String, String)> {
    let mut name = format!("custom_kernel_{}", parts.name);
    for c in constants {
        name += &match c {
            Constant::Int(_, v) => format!("_{v}"),
            Constant::Bool(_, v) => if *v { "_t" } else { "_f" }.to_string(),
            Constant::Type(_, d) => format!("_{}", type_string(*d)?),
        };
    }
    let mut s = String::with_capacity(parts.header.len() + parts.source.len() + 4096);
    s += "\n#include \"mlx/backend/cuda/device/utils.cuh\"\n\n#include <cooperative_groups.h>\n\n";
    s += &parts.header;
    s += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n";
    s += &format!("__global__ void {name}(\n");
    for (n, a) in parts.inputs.iter().zip(inputs) {
        s += &format!("    const {}* {n},\n", cuda_type(a.dtype())?);
        if a.ndim() > 0 {
            for (suffix, ty) in [("shape", "Shape"), ("strides", "Strides"), ("ndim", "int")] {
                if parts.source.contains(&format!("{n}_{suffix}")) {
                    s += &format!("    const __grid_constant__ {ty} {n}_{suffix},\n");
                }
            }
        }
    }
    let last = parts.outputs.len().saturating_sub(1);
    for (i, (n, (_, d))) in parts.outputs.iter().zip(outputs).enumerate() {
        let end = if i < last { ",\n" } else { ") {\n" };
        s += &format!("    {}* {n}{end}", cuda_type(*d)?);
    }
    for c in constants {
        s += &match c {
            Constant::Int(n, v) => format!("  constexpr int {} = {v};\n", n.to_string_lossy()),
            Constant::Bool(n, v) => format!("  constexpr bool {} = {v};\n", n.to_string_lossy()),
            Constant::Type(n, d) => {
                format!("  using {} = {};\n", n.to_string_lossy(), cuda_type(*d)?)
            }
        };
    }
    if !constants.is_empty() {
        s += "\n";
    }
    s += &parts.source;
    s += "\n}\n\n} // namespace mlx::core::cu\n";
    Ok((name, s))
}

/// Writes one application's source to `dir` as `<kernel name>_<hash of the source>.cu`.
pub fn write(
    dir: &Path,
    parts: &Parts,
    inputs: &[&Array],
    outputs: &[(&[i32], Dtype)],
    constants: &[Constant],
) -> Result<()> {
    let (name, source) = render(parts, inputs, outputs, constants)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    let path = dir.join(format!("{name}_{:016x}.cu", h.finish()));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, source))
        .map_err(|e| EngineError::Internal(format!("writing {}: {e}", path.display())))
}

/// Zeros of each output's shape and dtype: what an application gives where it is only written.
pub fn stand_ins(outputs: &[(&[i32], Dtype)]) -> Result<Vec<Array>> {
    outputs
        .iter()
        .map(|(shape, d)| Ok(ops::zeros_dtype(shape, *d)?))
        .collect()
}

/// MLX's `dtype_to_cuda_type`.
fn cuda_type(d: Dtype) -> Result<&'static str> {
    Ok(match d {
        Dtype::Bool => "bool",
        Dtype::Int8 => "int8_t",
        Dtype::Int16 => "int16_t",
        Dtype::Int32 => "int32_t",
        Dtype::Int64 => "int64_t",
        Dtype::Uint8 => "uint8_t",
        Dtype::Uint16 => "uint16_t",
        Dtype::Uint32 => "uint32_t",
        Dtype::Uint64 => "uint64_t",
        Dtype::Float16 => "__half",
        Dtype::Bfloat16 => "__nv_bfloat16",
        Dtype::Float32 => "float",
        other => return Err(unsupported(other)),
    })
}

/// MLX's `get_type_string`, as the kernel's name spells a type constant.
fn type_string(d: Dtype) -> Result<&'static str> {
    Ok(match d {
        Dtype::Float32 => "float",
        Dtype::Float16 => "float16_t",
        Dtype::Bfloat16 => "bfloat16_t",
        other => cuda_type(other)?,
    })
}

fn unsupported(d: Dtype) -> EngineError {
    EngineError::Internal(format!("a custom CUDA kernel over {d:?}"))
}
