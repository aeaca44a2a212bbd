//! Errors in Anthropic's shape on the Messages routes:
//! `{"type": "error", "error": {"type", "message"}, "request_id"}`, with the error types
//! Anthropic's SDKs map to their exception classes.

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{Value, json};

use crate::error::ApiError;

/// The largest error body reshaped (ours are a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 << 10;

/// Anthropic's error type for an HTTP status.
fn kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500.. => "api_error",
        _ => "invalid_request_error",
    }
}

/// `error` as an Anthropic error body.
pub fn body(error: &ApiError, request_id: Option<&str>) -> Value {
    json!({
        "type": "error",
        "error": {"type": kind(error.status()), "message": error.to_string()},
        "request_id": request_id,
    })
}

/// Reshapes the OpenAI-shaped error bodies of everything under it (body parsing, keys,
/// validation, generation) into Anthropic's.
pub async fn reshape(req: Request, next: Next) -> Response {
    let request_id = req
        .extensions()
        .get::<crate::routes::HttpRequestId>()
        .map(|r| r.0.clone());
    let response = next.run(req).await;
    let status = response.status();
    if !status.is_client_error() && !status.is_server_error() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match to_bytes(body, MAX_ERROR_BODY).await {
        Ok(b) => b,
        Err(_) => return Response::from_parts(parts, Body::empty()),
    };
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let reshaped = json!({
        "type": "error",
        "error": {"type": kind(status), "message": message},
        "request_id": request_id,
    });
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    if let Some(id) = request_id.and_then(|id| HeaderValue::from_str(&id).ok()) {
        parts.headers.insert("request-id", id);
    }
    Response::from_parts(parts, Body::from(reshaped.to_string()))
}
