//! Device selection: a GPU where MLX has one (Metal on a Mac, CUDA on Linux with MLX's CUDA
//! build), else the CPU; `--device` can insist on either.
//!
//! On the CPU backend quantized matmuls are slow (~2 GFLOP/s) and f16/bf16 matmuls run at
//! ~4–5 GFLOP/s, while f32 matmuls go through BLAS (~190 GFLOP/s with OpenBLAS here), so the CPU
//! computes in f32 with weights dequantized at load. On a GPU weights stay quantized and
//! activations are f16.

use std::fmt;

use mlx_rs::{Device, Dtype};

/// What `--device` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The GPU if MLX has one, else the CPU.
    #[default]
    Auto,
    /// The GPU, or an error.
    Gpu,
    Cpu,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "gpu" => Ok(DeviceChoice::Gpu),
            "cpu" => Ok(DeviceChoice::Cpu),
            other => Err(format!("`{other}` is not a device: auto, gpu or cpu")),
        }
    }
}

/// The device MLX runs the model on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Metal,
    Cuda,
    Cpu,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Metal => "metal gpu",
            DeviceKind::Cuda => "cuda gpu",
            DeviceKind::Cpu => "cpu",
        })
    }
}

/// Where the model runs, in which precision, and whose formulation of the operations it runs
/// (`crate::backend::for_placement` builds the backend from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub kind: DeviceKind,
    /// A GPU's formulation (fused kernels, f16): on Metal and CUDA, and in tests of it.
    pub gpu: bool,
    /// Activation and (dense) weight dtype.
    pub dtype: Dtype,
    /// Keep quantized weights quantized (GPU) or dequantize them at load (CPU).
    pub keep_quantized: bool,
    /// CUDA's formulation: prefill padded to a few shapes, since MLX builds CUDA kernels per
    /// exact shape (`backend::cuda::padded`).
    pub pads_prefill: bool,
    /// Keep a step's freed buffers in MLX's cache for the next step, up to what the warm-up's
    /// prefill measured, instead of giving them back after each prefill step: on CUDA, where
    /// each buffer given back is a `cudaFree` and the next step's a fresh allocation (served
    /// 8 clients 7.6% faster on an H100, `docs/gpu.md`). Every device gives all of it back when
    /// the engine goes idle.
    pub keeps_step_buffers: bool,
    /// Read a prefill chunk's keys gathered into one array where that costs less than its
    /// spans (`paged::PagedChunks`): a GPU's attention joins spans with a copy per span per
    /// layer, and a prompt over blocks scattered by earlier requests can be hundreds of spans.
    pub gathers_prefill_keys: bool,
}

impl Placement {
    /// Picks the device `choice` asks for and makes it MLX's default device.
    pub fn choose(choice: DeviceChoice) -> Result<Self, String> {
        let gpu = gpu_backend();
        let kind = match (choice, gpu) {
            (DeviceChoice::Cpu, _) | (DeviceChoice::Auto, None) => DeviceKind::Cpu,
            (_, Some(b)) => b,
            (DeviceChoice::Gpu, None) => {
                return Err(
                    "--device gpu: this MLX build has no GPU backend (neither Metal nor \
                            CUDA, or no device present); use --device auto or cpu"
                        .into(),
                );
            }
        };
        let on_gpu = kind != DeviceKind::Cpu;
        let placement = Placement {
            kind,
            gpu: on_gpu,
            dtype: if on_gpu {
                Dtype::Float16
            } else {
                Dtype::Float32
            },
            keep_quantized: on_gpu,
            pads_prefill: kind == DeviceKind::Cuda,
            keeps_step_buffers: kind == DeviceKind::Cuda,
            gathers_prefill_keys: on_gpu,
        };
        Device::set_default(&if on_gpu { Device::gpu() } else { Device::cpu() });
        Ok(placement)
    }

    /// A GPU's formulation (fused kernels; with `padded`, CUDA's padded prefill shapes, else
    /// Metal's exact ones) run on the CPU in f32: MLX's reference implementations of the fused
    /// ops. For tests that check the GPU paths' logic where there is no GPU (CI); slow, never
    /// chosen by the daemon.
    pub fn formulation_on_cpu(padded: bool) -> Self {
        Device::set_default(&Device::cpu());
        Placement {
            kind: DeviceKind::Cpu,
            gpu: true,
            dtype: Dtype::Float32,
            keep_quantized: false,
            pads_prefill: padded,
            keeps_step_buffers: false,
            gathers_prefill_keys: true,
        }
    }

    /// A human-readable name ("metal gpu, Float16" / "cpu, Float32").
    pub fn describe(&self) -> String {
        format!("{}, {:?}", self.kind, self.dtype)
    }
}

/// The GPU backend MLX has here, if any.
fn gpu_backend() -> Option<DeviceKind> {
    let ask = |f: unsafe extern "C" fn(*mut bool) -> std::os::raw::c_int| {
        let mut available = false;
        // SAFETY: plain FFI call writing one bool through a valid pointer.
        let status = unsafe { f(&mut available) };
        status == 0 && available
    };
    if ask(mlx_sys::mlx_metal_is_available) {
        Some(DeviceKind::Metal)
    } else if ask(mlx_sys::mlx_cuda_is_available) {
        Some(DeviceKind::Cuda)
    } else {
        None
    }
}
