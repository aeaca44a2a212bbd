//! OpenAI's chat completions and completions: wire shapes, the conversion of a chat request,
//! and answers as chunks or bodies.
//!
//! - [`request`], [`response`]: the bodies as OpenAI clients send and read them.
//! - [`chat`]: a chat request → a conversation → a valid request.
//! - [`chunks`]: an answer as chat or completions chunks, or one body.

pub mod chat;
pub mod chunks;
pub mod request;
pub mod response;
