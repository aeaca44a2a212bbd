//! The conversations that follow the handshake.
//!
//! - [`cache`]: daemon ↔ cache manager (register, acquire/unlease, donate, release, inventory).
//! - [`admin`]: operators and the front end ↔ cache manager (stats, entries, evict, capacity).
//! - [`daemon`]: front end ↔ daemon (generate, cancel, info, health; streamed tokens).
//!
//! Every server-to-client enum has an `Error` variant carrying a [`WireError`], so a bad frame
//! always gets a reply the client can decode.

pub mod admin;
pub mod cache;
pub mod daemon;

use serde::{Deserialize, Serialize};

/// Stable machine-readable error codes (also used as metric labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The frame's payload did not decode as a message of this conversation.
    BadFrame,
    /// The frame's length prefix was over the limit (the connection is closed after this).
    FrameTooLarge,
    /// The request was well-formed but not valid now (e.g. acquire before register).
    BadRequest,
    /// A daemon tried to register while another one is registered.
    AlreadyRegistered,
    /// The geometry could not be used.
    BadGeometry,
    /// The selector named nothing that exists.
    NotFound,
    /// The server is shutting down.
    ShuttingDown,
    /// The server is starting (loading its model, warming up) and serves nothing yet.
    Starting,
    /// The server failed for a reason of its own (not the request's); the message says which.
    Internal,
}

impl ErrorCode {
    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "bad_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::AlreadyRegistered => "already_registered",
            ErrorCode::BadGeometry => "bad_geometry",
            ErrorCode::NotFound => "not_found",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Starting => "starting",
            ErrorCode::Internal => "internal",
        }
    }
}

/// An error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} ({})", code.as_str())]
pub struct WireError {
    /// What kind of error.
    pub code: ErrorCode,
    /// What went wrong, for a person.
    pub message: String,
}

impl WireError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}
