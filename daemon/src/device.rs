//! Device selection: Metal GPU where MLX has it, else CPU.
//!
//! On the CPU backend quantized matmuls are slow (~2 GFLOP/s) and f16/bf16 matmuls run at
//! ~4–5 GFLOP/s, while f32 matmuls go through BLAS (~60 GFLOP/s with OpenBLAS here), so the CPU
//! computes in f32 with weights dequantized at load. On Metal weights stay quantized and
//! activations are f16.

use mlx_rs::{Device, Dtype};

/// Where the model runs and in which precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// True on a Metal GPU.
    pub gpu: bool,
    /// Activation and (dense) weight dtype.
    pub dtype: Dtype,
    /// Keep quantized weights quantized (GPU) or dequantize them at load (CPU).
    pub keep_quantized: bool,
}

impl Placement {
    /// Picks the GPU if MLX has Metal, else the CPU, and makes it MLX's default device.
    pub fn choose() -> Self {
        let gpu = metal_available();
        let placement = if gpu {
            Placement {
                gpu,
                dtype: Dtype::Float16,
                keep_quantized: true,
            }
        } else {
            Placement {
                gpu,
                dtype: Dtype::Float32,
                keep_quantized: false,
            }
        };
        Device::set_default(&if gpu { Device::gpu() } else { Device::cpu() });
        placement
    }

    /// A human-readable name ("metal gpu, f16" / "cpu, f32").
    pub fn describe(&self) -> String {
        format!(
            "{}, {:?}",
            if self.gpu { "metal gpu" } else { "cpu" },
            self.dtype
        )
    }
}

/// Whether MLX was built with Metal and a GPU is present.
fn metal_available() -> bool {
    let mut available = false;
    // SAFETY: plain FFI call writing one bool through a valid pointer.
    let status = unsafe { mlx_sys::mlx_metal_is_available(&mut available) };
    status == 0 && available
}
