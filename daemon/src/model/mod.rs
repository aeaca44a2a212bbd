//! Models: configuration, weights, loading, and the forward pass.
//!
//! - [`config`]: [`ModelConfig`], the architecture and geometry.
//! - [`weights`]: named tensors and [`weights::Linear`] (dense or quantized).
//! - [`gguf`]: loading a GGUF file (weights, configuration, tokenizer metadata);
//!   [`gguf_check`]: its structure checked in Rust first (MLX's reader trusts the file).
//! - [`safetensors`]: loading an MLX / Hugging Face directory.
//! - [`fast_exp`]: `exp` for the CPU backend (softmax, SiLU), compiled from fast ops.
//! - [`rotary`]: RoPE for the CPU backend, from angles computed once per forward pass.
//! - [`joined`]: q/k/v and gate/up joined into one matmul each at load (GPU).
//! - [`skinny`]: the decode step's matmul on the CPU (few rows, no `sgemm` packing);
//!   [`skinny_cuda`]: on CUDA (2–16 rows, a custom kernel instead of a cuBLAS call).
//! - [`rope_cuda`]: a decode step's RoPE and K/V packing in one kernel on CUDA (opt-in).
//! - [`span_attention`]: attention on the CPU read straight from the K/V spans.
//! - [`llama`]: the Llama-family transformer (Llama, Mistral, SmolLM2; Qwen2 biases; Qwen3 norms).

mod attention;
pub mod attention_cuda;
pub mod config;
mod cuda_kernel;
mod fast_exp;
mod fused_prefill;
pub mod gguf;
pub mod gguf_check;
mod joined;
pub mod llama;
pub mod rope_cuda;
mod rotary;
pub mod safetensors;
mod skinny;
pub mod skinny_cuda;
mod span_attention;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use llama::Model;
