//! The mlxcel inference engine: models on MLX through `mlx-rs` (Metal on macOS, the CPU backend
//! on Linux), the tokenizer the front end will use, and single-sequence generation.
//!
//! # Layout
//! The layering of vLLM v1's core: [`server`] (socket I/O only) → [`engine`] (the engine
//! thread: [`engine::scheduler`], pure and tested without MLX; its step; the cache link, which
//! is the cache side of each request and the trust boundary on the manager's ids) → [`pool`] and
//! [`paged`] (blocks, refcounts, block tables) → [`model`] (forward passes) and [`sampler`].
//! - [`cache_client`]: the connection to the cache manager (register, acquire, donate, orders).
//! - [`engine`]: the engine thread: the scheduler, requests, the cache side of each request.
//! - [`error`]: [`EngineError`], the request's fault (400) apart from ours (500).
//! - [`device`]: a GPU (Metal, CUDA) where MLX has one, else the CPU; the dtype for each.
//! - [`model`]: configuration, weights (GGUF), and the Llama-family forward pass.
//! - [`kv`]: the [`kv::KvStore`] interface attention reads K/V through, and a dense store.
//! - [`pool`]: the paged KV pool (block tensors, free list, refcounts).
//! - [`paged`]: a sequence's block table and its [`kv::KvStore`] over the pool.
//! - [`tokenizer`]: a `tokenizers::Tokenizer` built from GGUF metadata, plus the chat template,
//!   special tokens and context length.
//! - [`server`]: the daemon's socket for front ends.
//! - [`sampler`]: greedy and sampled decoding with penalties and a seeded RNG.
//! - [`sampling_defaults`]: what a request gets for the sampling parameters it omits.
//! - [`generate`]: the generation loop for one sequence.
//! - [`export`]: a GGUF model written as an MLX / Hugging Face directory (for peer servers).

pub mod batch_draw;
pub mod cache_client;
pub mod device;
pub mod device_memory;
pub mod engine;
pub mod export;
pub mod generate;
pub mod host_memory;
pub mod jit_cache;
pub mod kernel_modules;
pub mod kv;
pub mod model;
pub mod paged;
pub mod pool;
pub mod sampler;
pub mod sampling_defaults;
pub mod server;
pub mod tokenizer;
pub mod warm_workers;

pub use loader::{Loaded, load, load_on, load_placed};
mod loader;

pub mod error;
pub use error::{EngineError, Result};
