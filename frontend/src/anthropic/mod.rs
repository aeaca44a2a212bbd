//! `POST /v1/messages` and `POST /v1/messages/count_tokens`, Anthropic's Messages API: what
//! Claude Code and the `anthropic` SDKs send, converted into a conversation, and the answer as
//! a message or as Anthropic's stream events. Errors take Anthropic's shape on these routes.
//!
//! - [`request`]: the body, tool choice, thinking, output format; [`blocks`]: content blocks
//!   and `cache_control` breakpoints.
//! - [`output`]: the message, its usage (cache reads and writes), the stream events.
//! - [`errors`]: errors in Anthropic's shape.

pub mod blocks;
pub mod errors;
pub mod output;
pub mod request;
