//! OpenAI's wire shapes.

pub mod request;
pub mod response;
