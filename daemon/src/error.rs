//! The engine's errors, in two kinds: the request's fault ([`EngineError::Request`], a full
//! pool for one request: a 400 at the front end) and ours (a model file, MLX, the tokenizer, an
//! internal failure: a 500). [`EngineError::wire`] is the one place that tells them apart.

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
