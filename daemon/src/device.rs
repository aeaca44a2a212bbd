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

/// The MLX backend that runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Metal,
    Cuda,
    Cpu,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Metal => "metal gpu",
            Backend::Cuda => "cuda gpu",
            Backend::Cpu => "cpu",
        })
    }
}

/// Where the model runs and in which precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub backend: Backend,
    /// True on a GPU (Metal or CUDA).
    pub gpu: bool,
    /// Activation and (dense) weight dtype.
    pub dtype: Dtype,
    /// Keep quantized weights quantized (GPU) or dequantize them at load (CPU).
    pub keep_quantized: bool,
    /// Run prefill chunks as a few padded shapes (`model::fused_prefill`): on CUDA, where MLX
    /// builds kernels per exact shape (a cuDNN graph per attention shape, the quantized matmuls
    /// per row count). Not on Metal, whose kernels are specialized by alignment only (MLX's
    /// `align_Q` / `align_K` function constants), so padding would only add work there.
    pub pads_prefill: bool,
    /// Join the projections that read one input (q/k/v, gate/up) into one matmul at load
    /// (`model::joined`): fewer, larger matmuls per layer per step, on every device.
    /// `MLXCEL_JOIN_PROJECTIONS=0` keeps them apart, to measure what it buys.
    pub joins_projections: bool,
    /// Keep a step's freed buffers in MLX's cache for the next step, up to what the warm-up's
    /// prefill measured, instead of giving them back after each prefill step. On CUDA, where
    /// each one given back is a `cudaFree` and the next step's a fresh allocation, this is the
    /// default: on an H100, 8B-like model, three interleaved served runs each way, it served 8
    /// clients 7.6% and 32 clients 18% faster and a cold 4k prompt's first token 25% sooner,
    /// for ~300 MiB more GPU memory after the run
    /// (`bench/results/2026-12-05-gpu-h100-keep-step-buffers-43cacbb/`).
    /// `MLXCEL_GIVE_BACK_TRANSIENT=1` gives them back there; `=0` keeps them on the CPU and
    /// Metal too, where it is unmeasured on Metal and measured no different on the CPU. Every
    /// device gives all of it back when the engine goes idle.
    pub keeps_step_buffers: bool,
    /// Where prefill is padded (CUDA), a chunk of at most 16 tokens over more than 1024 keys
    /// (the new tokens of a prompt whose prefix is cached) runs its attention at 16 query rows,
    /// not 512 (`model::fused_prefill::Pad`). On an H100 such a pass of 7 tokens over ~4.1k
    /// cached keys took 49-80 ms at 512 rows, against 7-8 ms for a one-row decode step
    /// (`bench/results/2026-12-06-gpu-h100-prefill-budget-c725845/`). With this and
    /// [`Placement::gathers_prefill_keys`] such a prompt's first token came 41% sooner on an H100
    /// (0.055 against 0.093 s, mean of six and four runs), the aggregates within the noise
    /// (`bench/results/2026-12-06-gpu-h100-prefill-gather-a560cad/`). The default on CUDA;
    /// `MLXCEL_CUDA_FEW_QUERY_ROWS=0` pads such a chunk to 512 rows, to measure what it buys.
    pub few_query_rows: bool,
    /// Where prefill is padded, its attention runs the fine buckets of shapes (keys to multiples
    /// of 256 up to 1024, then two buckets a doubling; each row count its own shape over short
    /// keys), not the coarse default (`model::fused_prefill::Pad`). Each shape is a cuDNN graph
    /// that every daemon start builds again in its warm-up (0.05-0.7 s each), and the fine
    /// buckets are 35 shapes for an 8K context against 8. `MLXCEL_CUDA_FINE_ATTENTION_SHAPES=1`
    /// runs them, to measure what the coarse ones cost.
    pub fine_attention_shapes: bool,
    /// Queue a prefill pass without waiting for it, its finished prompts' first tokens drawn on
    /// the device (`engine::prefill`), so the host encodes the step's decode while the device
    /// still runs the pass. An experiment kept with its measurement, off unless
    /// `MLXCEL_QUEUED_PREFILL=1`: on an H100, 8B-like model, three interleaved pairs, it served
    /// 8 clients 3% and 32 clients 9% slower (539 / 933 against 556 / 1020 tok/s mean), with no
    /// gain in a 4k prompt's first token
    /// (`bench/results/2026-12-06-gpu-h100-prefill-gather-a560cad/`).
    pub queues_prefill: bool,
    /// Read a prefill chunk's keys gathered into one array where that costs less than its
    /// spans (`paged::PagedChunks`): on a GPU, whose attention joins the spans with a copy per
    /// span per layer, and a prompt over blocks scattered by earlier requests can be hundreds of
    /// spans. Measured with [`Placement::few_query_rows`] (see there). `MLXCEL_PREFILL_GATHER=0`
    /// keeps the spans there, to measure what it buys.
    pub gathers_prefill_keys: bool,
    /// Rotate q and k in one RoPE call over the joined projection's q|k columns (`model::llama`,
    /// where q/k/v are joined and there are no q/k norms): one op a layer fewer in every pass
    /// (one kernel on a GPU, ~4 graph nodes on the CPU), the same numbers. The default;
    /// `MLXCEL_ROPE_QK_APART=1` rotates them apart, to measure what it buys.
    pub ropes_qk_together: bool,
}

/// Whether a step's freed buffers wait in MLX's cache for the next step (see
/// [`Placement::keeps_step_buffers`]): by default on CUDA only; `MLXCEL_GIVE_BACK_TRANSIENT`
/// set to `1` or `0` decides everywhere.
fn keeps_step_buffers(backend: Backend) -> bool {
    let setting = std::env::var("MLXCEL_GIVE_BACK_TRANSIENT").ok();
    keeps_step_buffers_under(setting.as_deref(), backend)
}

/// [`keeps_step_buffers`] for a given value of `MLXCEL_GIVE_BACK_TRANSIENT`.
fn keeps_step_buffers_under(setting: Option<&str>, backend: Backend) -> bool {
    match setting {
        Some("0") => true,
        Some("1") => false,
        _ => backend == Backend::Cuda,
    }
}

/// Whether short prefill chunks keep few query rows where prefill is padded (see
/// [`Placement::few_query_rows`]): yes, unless `MLXCEL_CUDA_FEW_QUERY_ROWS=0`.
fn few_query_rows() -> bool {
    std::env::var("MLXCEL_CUDA_FEW_QUERY_ROWS").as_deref() != Ok("0")
}

/// Whether padded prefill runs the fine attention shapes (see
/// [`Placement::fine_attention_shapes`]): only with `MLXCEL_CUDA_FINE_ATTENTION_SHAPES=1`.
fn fine_attention_shapes() -> bool {
    std::env::var("MLXCEL_CUDA_FINE_ATTENTION_SHAPES").as_deref() == Ok("1")
}

/// Whether prefill passes are queued (see [`Placement::queues_prefill`]): only with
/// `MLXCEL_QUEUED_PREFILL=1`.
fn queues_prefill() -> bool {
    std::env::var("MLXCEL_QUEUED_PREFILL").as_deref() == Ok("1")
}

/// Whether a GPU's prefill gathers scattered keys (see [`Placement::gathers_prefill_keys`]):
/// yes, unless `MLXCEL_PREFILL_GATHER=0`.
fn gathers_prefill_keys() -> bool {
    std::env::var("MLXCEL_PREFILL_GATHER").as_deref() != Ok("0")
}

/// Whether q and k are rotated in one call (see [`Placement::ropes_qk_together`]): yes,
/// unless `MLXCEL_ROPE_QK_APART=1`.
fn ropes_qk_together() -> bool {
    std::env::var("MLXCEL_ROPE_QK_APART").as_deref() != Ok("1")
}

/// Whether to join projections: yes, unless `MLXCEL_JOIN_PROJECTIONS=0`.
fn joins_projections() -> bool {
    std::env::var("MLXCEL_JOIN_PROJECTIONS").as_deref() != Ok("0")
}

impl Placement {
    /// Picks the device `choice` asks for and makes it MLX's default device.
    pub fn choose(choice: DeviceChoice) -> Result<Self, String> {
        let gpu = gpu_backend();
        let backend = match (choice, gpu) {
            (DeviceChoice::Cpu, _) | (DeviceChoice::Auto, None) => Backend::Cpu,
            (_, Some(b)) => b,
            (DeviceChoice::Gpu, None) => {
                return Err(
                    "--device gpu: this MLX build has no GPU backend (neither Metal nor \
                            CUDA, or no device present); use --device auto or cpu"
                        .into(),
                );
            }
        };
        let placement = if backend == Backend::Cpu {
            Placement {
                backend,
                gpu: false,
                dtype: Dtype::Float32,
                keep_quantized: false,
                pads_prefill: false,
                joins_projections: joins_projections(),
                keeps_step_buffers: keeps_step_buffers(backend),
                few_query_rows: false,
                fine_attention_shapes: false,
                queues_prefill: queues_prefill(),
                gathers_prefill_keys: false,
                ropes_qk_together: ropes_qk_together(),
            }
        } else {
            Placement {
                backend,
                gpu: true,
                dtype: Dtype::Float16,
                keep_quantized: true,
                pads_prefill: backend == Backend::Cuda,
                joins_projections: joins_projections(),
                keeps_step_buffers: keeps_step_buffers(backend),
                few_query_rows: backend == Backend::Cuda && few_query_rows(),
                fine_attention_shapes: fine_attention_shapes(),
                queues_prefill: queues_prefill(),
                gathers_prefill_keys: gathers_prefill_keys(),
                ropes_qk_together: ropes_qk_together(),
            }
        };
        Device::set_default(&if placement.gpu {
            Device::gpu()
        } else {
            Device::cpu()
        });
        Ok(placement)
    }

    /// A GPU's formulation (fused kernels; with `padded`, CUDA's padded prefill shapes, else
    /// Metal's exact ones) run on the CPU in f32: MLX's reference implementations of the fused
    /// ops. For tests that check the GPU paths' logic where there is no GPU (CI); slow, never
    /// chosen by the daemon.
    pub fn gpu_formulation_on_cpu(padded: bool) -> Self {
        Device::set_default(&Device::cpu());
        Placement {
            backend: Backend::Cpu,
            gpu: true,
            dtype: Dtype::Float32,
            keep_quantized: false,
            pads_prefill: padded,
            joins_projections: true,
            keeps_step_buffers: false,
            few_query_rows: padded && few_query_rows(),
            fine_attention_shapes: fine_attention_shapes(),
            queues_prefill: false,
            gathers_prefill_keys: true,
            ropes_qk_together: ropes_qk_together(),
        }
    }

    /// A human-readable name ("metal gpu, Float16" / "cpu, Float32").
    pub fn describe(&self) -> String {
        format!("{}, {:?}", self.backend, self.dtype)
    }
}

/// The GPU backend MLX has here, if any.
fn gpu_backend() -> Option<Backend> {
    let ask = |f: unsafe extern "C" fn(*mut bool) -> std::os::raw::c_int| {
        let mut available = false;
        // SAFETY: plain FFI call writing one bool through a valid pointer.
        let status = unsafe { f(&mut available) };
        status == 0 && available
    };
    if ask(mlx_sys::mlx_metal_is_available) {
        Some(Backend::Metal)
    } else if ask(mlx_sys::mlx_cuda_is_available) {
        Some(Backend::Cuda)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_buffers_are_kept_by_default_on_cuda_only_and_the_setting_decides_everywhere() {
        for backend in [Backend::Cpu, Backend::Metal, Backend::Cuda] {
            let default = backend == Backend::Cuda;
            assert_eq!(
                keeps_step_buffers_under(None, backend),
                default,
                "{backend}"
            );
            assert_eq!(
                keeps_step_buffers_under(Some(""), backend),
                default,
                "{backend}"
            );
            assert!(keeps_step_buffers_under(Some("0"), backend), "{backend}");
            assert!(!keeps_step_buffers_under(Some("1"), backend), "{backend}");
        }
    }
}
