//! The mlxcel inference engine: models on MLX through `mlx-rs` (Metal on macOS, the CPU backend
//! on Linux), the tokenizer the front end will use, and single-sequence generation.
//!
//! # Layout
//! - [`cache_client`]: the connection to the cache manager (register, acquire, donate, orders).
//! - [`engine`]: the engine thread: pool, scheduler, requests, the cache side of each request.
//! - [`device`]: Metal GPU where available, else CPU; the compute dtype for each.
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

pub mod cache_client;
pub mod device;
pub mod engine;
pub mod export;
pub mod generate;
pub mod kv;
pub mod model;
pub mod paged;
pub mod pool;
pub mod sampler;
pub mod sampling_defaults;
pub mod server;
pub mod tokenizer;

pub use loader::{Loaded, load};
mod loader;

/// Engine errors.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A model file could not be used.
    #[error("{path}: {reason}")]
    Model { path: String, reason: String },
    /// MLX reported an error.
    #[error("mlx: {0}")]
    Mlx(#[from] mlx_rs::error::Exception),
    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The KV pool has no room for the tokens of a step right now.
    #[error(
        "the KV pool is full: {needed_tokens} tokens need room and {free_blocks} blocks are free"
    )]
    PoolExhausted {
        needed_tokens: usize,
        free_blocks: u32,
    },
    /// A request asked for something the model cannot do.
    #[error("{0}")]
    Request(String),
    /// The engine failed for a reason of its own, not the request's.
    #[error("internal error: {0}")]
    Internal(String),
}

impl EngineError {
    /// How a request that failed with this error is reported: the request's fault
    /// (`BadRequest`, a 400 at the front end) or the server's (`Internal`, a 500).
    pub fn wire(&self) -> mlxcel_ipc::proto::WireError {
        use mlxcel_ipc::proto::{ErrorCode, WireError};
        let code = match self {
            EngineError::Request(_) | EngineError::PoolExhausted { .. } => ErrorCode::BadRequest,
            EngineError::Model { .. }
            | EngineError::Mlx(_)
            | EngineError::Tokenizer(_)
            | EngineError::Internal(_) => ErrorCode::Internal,
        };
        WireError::new(code, self.to_string())
    }
}

/// Result with [`EngineError`].
pub type Result<T> = std::result::Result<T, EngineError>;

#[cfg(test)]
mod tests {
    use super::EngineError;
    use mlxcel_ipc::proto::ErrorCode;

    #[test]
    fn request_faults_are_bad_requests_and_engine_faults_are_internal() {
        let code = |e: EngineError| e.wire().code;
        assert_eq!(
            code(EngineError::Request("x".into())),
            ErrorCode::BadRequest
        );
        let full = EngineError::PoolExhausted {
            needed_tokens: 9,
            free_blocks: 0,
        };
        assert_eq!(code(full), ErrorCode::BadRequest);
        assert_eq!(code(EngineError::Internal("x".into())), ErrorCode::Internal);
        assert_eq!(
            code(EngineError::Tokenizer("x".into())),
            ErrorCode::Internal
        );
        let e = EngineError::Internal("the decode step failed: mlx: boom".into());
        assert_eq!(
            e.wire().message,
            "internal error: the decode step failed: mlx: boom"
        );
    }
}
