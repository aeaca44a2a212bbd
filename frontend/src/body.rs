//! `JsonBody<T>`: the JSON request body extractor. Unlike axum's `Json`, every refusal is an
//! OpenAI-shaped [`ApiError`]: 415 for a content type that is not JSON, 413 over the size limit,
//! 400 for malformed JSON (with line and column), 400 naming the field for a wrong type.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

/// A JSON body deserialized as `T`.
pub struct JsonBody<T>(pub T);

/// A type a route takes as its body.
pub trait RequestBody: DeserializeOwned {
    /// The route's table of top-level fields ([`crate::fields`]): a field in none is refused.
    const FIELDS: &'static [&'static [crate::fields::Field]];

    /// Reads more from the raw body after `T` itself was parsed (for shared parameter sets).
    fn complete(&mut self, _raw: &[u8]) -> Result<(), ApiError> {
        Ok(())
    }
}

impl<T: RequestBody> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !is_json(content_type) {
            return Err(ApiError::UnsupportedMediaType(format!(
                "the body must be JSON (Content-Type: application/json), got `{}`",
                if content_type.is_empty() {
                    "none"
                } else {
                    content_type
                }
            )));
        }
        let read = Bytes::from_request(req, state);
        let Ok(bytes) = tokio::time::timeout(state.body_timeout, read).await else {
            return Err(ApiError::RequestTimeout(format!(
                "the request body did not arrive within {:?}",
                state.body_timeout
            )));
        };
        let bytes = bytes.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::BodyTooLarge {
                    limit: state.max_body_bytes,
                }
            } else {
                ApiError::InvalidJson(format!(
                    "could not read the body: {}",
                    rejection.body_text()
                ))
            }
        })?;
        let fields: serde_json::Map<String, serde_json::Value> = parse(&bytes)?;
        crate::fields::check(T::FIELDS, &fields)?;
        let mut body: T = parse(&bytes)?;
        body.complete(&bytes)?;
        Ok(JsonBody(body))
    }
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence.to_ascii_lowercase().ends_with("+json")
}

/// Parses `bytes` as `T`, naming the offending field on a type error.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would take a top-level array as a struct's fields in order.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::InvalidJson(
            "the body must be a JSON object".to_string(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data if path != "." => ApiError::InvalidParam {
                message: format!("`{path}`: {inner}"),
                param: Some(path),
            },
            serde_json::error::Category::Data => {
                ApiError::InvalidJson(format!("the body does not match this route: {inner}"))
            }
            _ => ApiError::InvalidJson(format!("the body is not valid JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::InvalidJson(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::request::{ChatRequest, CommonParams, CompletionRequest};

    #[test]
    fn malformed_and_mistyped_bodies_name_the_problem() {
        let e = parse::<ChatRequest>(b"{\"messages\": [").unwrap_err();
        assert!(matches!(e, ApiError::InvalidJson(_)), "{e:?}");
        let e = parse::<CommonParams>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        match e {
            ApiError::InvalidParam { param, .. } => {
                assert_eq!(param.as_deref(), Some("temperature"))
            }
            other => panic!("{other:?}"),
        }
        let e = parse::<ChatRequest>(br#"{"model": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("messages"), "{e}");
        let e = parse::<ChatRequest>(b"[[]]").unwrap_err();
        assert_eq!(e.to_string(), "the body must be a JSON object");
        let deep = format!(
            "{{\"prompt\": {}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let e = parse::<CompletionRequest>(deep.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("recursion limit"), "{e}");
    }

    #[test]
    fn json_content_types_are_recognised() {
        assert!(is_json("application/json"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("application/vnd.api+json"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json(""));
    }
}
