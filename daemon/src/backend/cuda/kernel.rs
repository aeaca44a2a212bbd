//! MLX custom CUDA kernels (`mlx_fast_cuda_kernel`, through mlx-c): a kernel's body is CUDA C
//! that MLX wraps in a signature (each input, with `<name>_shape` / `<name>_strides` where the
//! body names them, then each output) and compiles with NVRTC once per set of template
//! constants. Applying one is a graph node like any op: lazy, on the default stream.
//!
//! Used only where the placement is CUDA; elsewhere nothing here is called.

use std::ffi::{CStr, CString};

use mlx_rs::{Array, Dtype, Stream};

use crate::{EngineError, Result};

mod render;

pub use render::write_sources_to;

/// A compiled-on-first-use kernel description: MLX's handle (`None` only where MLX has no CUDA
/// back end and sources are being written, see [`render`]) and the parts it was made of.
pub struct CudaKernel {
    handle: Option<mlx_sys::mlx_fast_cuda_kernel>,
    parts: render::Parts,
}

// SAFETY: the handle is an immutable description (a name, a source, argument names); applying
// it builds a new graph node and changes nothing in the handle.
unsafe impl Send for CudaKernel {}
unsafe impl Sync for CudaKernel {}

/// A template constant of one application: `using NAME = <dtype>;`, `constexpr int NAME`, or
/// `constexpr bool NAME`.
pub enum Constant {
    Type(&'static CStr, Dtype),
    Int(&'static CStr, i32),
    Bool(&'static CStr, bool),
}

impl CudaKernel {
    /// A kernel named `name` over inputs and outputs named as the body names them. With
    /// `row_contiguous`, MLX copies any input that is not row-major first; without it, the body
    /// reads `<input>_strides`. `None` if mlx-c refuses it (a name with a NUL byte, no CUDA back
    /// end) and no sources are being written.
    pub fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
        row_contiguous: bool,
    ) -> Option<CudaKernel> {
        let names = |list: &[&str]| -> Option<mlx_sys::mlx_vector_string> {
            let list: Vec<CString> = list
                .iter()
                .map(|s| CString::new(*s).ok())
                .collect::<Option<_>>()?;
            // SAFETY: a new vector; each appended string is copied by mlx-c.
            unsafe {
                let v = mlx_sys::mlx_vector_string_new();
                for s in &list {
                    if mlx_sys::mlx_vector_string_append_value(v, s.as_ptr()) != 0 {
                        mlx_sys::mlx_vector_string_free(v);
                        return None;
                    }
                }
                Some(v)
            }
        };
        let owned = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
        let parts = render::Parts {
            name: name.to_string(),
            inputs: owned(inputs),
            outputs: owned(outputs),
            source: source.to_string(),
            header: header.to_string(),
        };
        let (name, source, header) = (
            CString::new(name).ok()?,
            CString::new(source).ok()?,
            CString::new(header).ok()?,
        );
        let inputs = names(inputs)?;
        let Some(outputs) = names(outputs) else {
            // SAFETY: made above, not used after.
            unsafe { mlx_sys::mlx_vector_string_free(inputs) };
            return None;
        };
        // SAFETY: valid C strings and vectors for the call; mlx-c copies what it keeps.
        let k = unsafe {
            let k = mlx_sys::mlx_fast_cuda_kernel_new(
                name.as_ptr(),
                inputs,
                outputs,
                source.as_ptr(),
                header.as_ptr(),
                row_contiguous,
                0,
            );
            mlx_sys::mlx_vector_string_free(inputs);
            mlx_sys::mlx_vector_string_free(outputs);
            k
        };
        let handle = (!k.ctx.is_null()).then_some(k);
        if handle.is_none() && render::sources_dir().is_none() {
            return None;
        }
        Some(CudaKernel { handle, parts })
    }

    /// The kernel applied to `inputs`, giving `outputs` (shape, dtype each), over `grid` threads
    /// in blocks of `block` threads (as MLX counts them: the grid in threads, not blocks).
    pub fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        grid: [i32; 3],
        block: [i32; 3],
        constants: &[Constant],
    ) -> Result<Vec<Array>> {
        if let Some(dir) = render::sources_dir() {
            render::write(dir, &self.parts, inputs, outputs, constants)?;
        }
        let Some(handle) = self.handle else {
            return render::stand_ins(outputs);
        };
        let stream = Stream::new();
        // SAFETY: every handle passed is live for its call (the arrays borrowed, the config and
        // vectors made here and freed below); outputs are read only after a successful apply.
        unsafe {
            let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
            let mut ok = true;
            for (shape, dtype) in outputs {
                ok &= mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                    config,
                    shape.as_ptr(),
                    shape.len(),
                    *dtype as mlx_sys::mlx_dtype,
                ) == 0;
            }
            ok &= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, grid[0], grid[1], grid[2])
                == 0;
            ok &= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
                config, block[0], block[1], block[2],
            ) == 0;
            for c in constants {
                ok &= match c {
                    Constant::Type(n, d) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                            config,
                            n.as_ptr(),
                            *d as mlx_sys::mlx_dtype,
                        )
                    }
                    Constant::Int(n, v) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                            config,
                            n.as_ptr(),
                            *v,
                        )
                    }
                    Constant::Bool(n, v) => {
                        mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_bool(
                            config,
                            n.as_ptr(),
                            *v,
                        )
                    }
                } == 0;
            }
            let ptrs: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
            let ins = mlx_sys::mlx_vector_array_new_data(ptrs.as_ptr(), ptrs.len());
            let mut outs = mlx_sys::mlx_vector_array_new();
            ok = ok
                && mlx_sys::mlx_fast_cuda_kernel_apply(
                    &mut outs,
                    handle,
                    ins,
                    config,
                    stream.as_ptr(),
                ) == 0;
            let mut got = Vec::with_capacity(outputs.len());
            if ok {
                for i in 0..outputs.len() {
                    let mut y = mlx_sys::mlx_array_new();
                    if mlx_sys::mlx_vector_array_get(&mut y, outs, i) == 0 {
                        got.push(Array::from_ptr(y));
                    } else {
                        mlx_sys::mlx_array_free(y);
                        ok = false;
                    }
                }
            }
            mlx_sys::mlx_vector_array_free(ins);
            mlx_sys::mlx_vector_array_free(outs);
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            if ok {
                Ok(got)
            } else {
                Err(EngineError::Internal(
                    "an MLX custom CUDA kernel could not be applied (see MLX's log)".into(),
                ))
            }
        }
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        if let Some(handle) = self.handle {
            // SAFETY: the handle was made by `mlx_fast_cuda_kernel_new` and is dropped once.
            unsafe { mlx_sys::mlx_fast_cuda_kernel_free(handle) };
        }
    }
}
