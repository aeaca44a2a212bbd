//! The mlxcel inference engine: models on MLX through `mlx-rs` (Metal on macOS, the CPU backend
//! or CUDA on Linux), a paged KV pool governed by the cache manager, continuous batching.
//!
//! # Layout
//! The layering of vLLM v1's engine core: [`server`] (socket I/O only) → [`engine`] (the engine
//! thread's loop: read commands, plan, execute, answer) → [`scheduler`] (admission, prefill
//! budget, decode rows, preemption and every block allocation: one [`scheduler::StepPlan`] per
//! step; pure, tested with fakes) → [`runner`] (executes a plan: forward passes and sampling) →
//! [`model`] (architectures and loaders) over a [`backend`] (the operations of a device,
//! chosen once at load). K/V lives in the [`pool`]; [`paged`] gives a pass its sequences'
//! K/V through the [`kv`] traits the model writes and reads.
//! - [`backend`]: the CPU's, a GPU's plain-MLX and (CUDA builds) CUDA's operations.
//! - [`batch_draw`]: next tokens drawn on the device for a whole batch.
//! - [`cache_client`]: the connection to the cache manager (register, acquire, donate, orders).
//! - [`device`]: which device runs the model ([`device::Placement`]); [`device_memory`] and
//!   [`host_memory`]: how much memory it has, and giving freed memory back.
//! - [`engine`]: the engine thread: requests' lives, the cache side of each, the warm-up.
//! - [`error`]: [`EngineError`], the request's fault (400) apart from ours (500).
//! - [`export`]: a GGUF model written as an MLX / Hugging Face directory (for peer servers).
//! - [`generate`]: the generation loop for one sequence (tests and benchmarks).
//! - [`jit_cache`]: the directory MLX keeps compiled kernels in, shared between daemons.
//! - [`kv`]: the interfaces attention reads K/V through, and a dense store.
//! - `loader` ([`load`], [`load_on`], [`load_placed`]): opening a model path (a GGUF file or a
//!   model directory) onto a device.
//! - [`model`]: configuration, weights (GGUF, safetensors), architectures.
//! - [`paged`]: a pass's view of the pool over its sequences' block tables.
//! - [`pool`]: the paged KV pool (slabs, free list, refcounts, gathers, table reads).
//! - [`runner`]: executes a step's plan and samples.
//! - [`sampler`]: greedy and sampled decoding with penalties and a seeded RNG;
//!   [`sampling_defaults`]: what a request gets for the parameters it omits.
//! - [`scheduler`]: waiting and running requests, the step plan, block tables.
//! - [`sequence`]: one request's state on the engine.
//! - [`server`]: the daemon's socket for front ends.
//! - [`tokenizer`]: a `tokenizers::Tokenizer` built from GGUF metadata, plus the chat template,
//!   special tokens and context length.
//! - [`warm_workers`]: copies of the daemon that build a first start's kernels in parallel.

pub mod backend;
pub mod batch_draw;
pub mod cache_client;
pub mod device;
pub mod device_memory;
pub mod engine;
pub mod export;
pub mod generate;
pub mod host_memory;
pub mod jit_cache;
pub mod kv;
pub mod model;
pub mod paged;
pub mod pool;
pub mod runner;
pub mod sampler;
pub mod sampling_defaults;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod tokenizer;
pub mod warm_workers;

pub use loader::{Loaded, load, load_on, load_placed};
mod loader;

pub mod error;
pub use error::{EngineError, Result};
