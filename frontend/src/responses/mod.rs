//! `POST /v1/responses`, OpenAI's Responses API, stateless: the request's input items become
//! a conversation (messages, function calls and their outputs, reasoning), the answer comes
//! back as output items, in one body or as the Responses stream events. Nothing is stored, so
//! `previous_response_id` is refused: send the whole conversation in `input`.
//!
//! - [`request`]: the body and its conversion.
//! - [`output`]: the response object, its output items and the stream events.

pub mod output;
pub mod request;
