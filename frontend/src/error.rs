//! The front end's one error type, and the one place that maps errors to an HTTP status and
//! an OpenAI-shaped body: `{"error": {"message", "type", "param", "code"}}`.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Why a request could not be served.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// A parameter is missing, malformed or out of range (`param` names it).
    #[error("{message}")]
    InvalidParam {
        param: Option<String>,
        message: String,
    },
    /// The body is not JSON, or not the JSON this route takes.
    #[error("{0}")]
    InvalidJson(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The client was too slow sending the body.
    #[error("{0}")]
    RequestTimeout(String),
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("missing or invalid API key: send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// An admin route (cache entries, evict) with a key that is not the admin key.
    #[error(
        "this route lists or evicts every tenant's cache entries: send the admin key \
         (--admin-key / MLXCEL_ADMIN_KEY)"
    )]
    AdminRequired,
    /// A `Host` that is not ours (a DNS-rebinding page): see `--allowed-hosts`.
    #[error(
        "requests for host `{0}` are not served here (a web page may be rebinding its name to \
         this machine); use a loopback name, or add it with --allowed-hosts"
    )]
    MisdirectedHost(String),
    /// A browser request from a page whose origin is not allowed: see `--allowed-origins`.
    #[error("requests from the web page origin `{0}` are refused; allow it with --allowed-origins")]
    ForbiddenOrigin(String),
    /// The prompt does not fit the model's context window (worded as Anthropic's clients
    /// expect: Claude Code compacts its conversation when it reads it).
    #[error(
        "prompt is too long: {tokens} tokens > {} maximum (`{field}` must leave room in the \
         model's context window of {limit} tokens for at least one generated token)",
        limit.saturating_sub(1)
    )]
    ContextOverflow {
        field: &'static str,
        tokens: u64,
        limit: u64,
    },
    #[error("the model `{0}` does not exist")]
    ModelNotFound(String),
    /// A named thing (e.g. a cache entry) does not exist.
    #[error("{0}")]
    NotFound(String),
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    /// The waiting queue is full.
    #[error("too many requests are waiting ({limit}); retry later")]
    QueueFull { limit: usize },
    /// The daemon (or the cache manager, for cache routes) is not reachable.
    #[error("{what} is unavailable: {reason}")]
    Unavailable { what: &'static str, reason: String },
    /// The daemon refused or failed the request.
    #[error("{0}")]
    Generation(String),
}

impl ApiError {
    /// A refused parameter; the message is prefixed with the parameter's name.
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        ApiError::InvalidParam {
            param: Some(param.to_string()),
            message: format!("`{param}` {}", message.into()),
        }
    }

    pub fn daemon_down(reason: impl Into<String>) -> Self {
        ApiError::Unavailable {
            what: "the inference daemon",
            reason: reason.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidParam { .. }
            | ApiError::InvalidJson(_)
            | ApiError::ContextOverflow { .. } => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::MisdirectedHost(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::ForbiddenOrigin(_) | ApiError::AdminRequired => StatusCode::FORBIDDEN,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) | ApiError::RouteNotFound { .. } => {
                StatusCode::NOT_FOUND
            }
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Generation(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable code, also used as a metrics label.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::InvalidParam { .. } => "invalid_parameter",
            ApiError::ContextOverflow { .. } => "context_length_exceeded",
            ApiError::InvalidJson(_) => "invalid_json",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::BodyTooLarge { .. } => "body_too_large",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::Unauthorized => "invalid_api_key",
            ApiError::MisdirectedHost(_) => "misdirected_host",
            ApiError::ForbiddenOrigin(_) => "forbidden_origin",
            ApiError::AdminRequired => "admin_required",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::NotFound(_) | ApiError::RouteNotFound { .. } => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::Unavailable { .. } => "service_unavailable",
            ApiError::Generation(_) => "generation_failed",
        }
    }

    /// The error's type in OpenAI's and Anthropic's bodies.
    pub fn kind(&self) -> &'static str {
        match self.status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::INTERNAL_SERVER_ERROR => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The OpenAI error body.
    pub fn body(&self) -> ErrorBody {
        let param = match self {
            ApiError::InvalidParam { param, .. } => param.clone(),
            ApiError::ContextOverflow { field, .. } => Some(field.to_string()),
            ApiError::ModelNotFound(_) => Some("model".to_string()),
            _ => None,
        };
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: self.kind(),
                param,
                code: Some(self.code()),
            },
        }
    }

    /// How long a client should wait before retrying, for statuses that say "later".
    fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::QueueFull { .. } => Some(Duration::from_secs(1)),
            ApiError::Unavailable { .. } => Some(Duration::from_secs(5)),
            _ => None,
        }
    }
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), code = self.code(), "{self}");
        } else {
            tracing::debug!(status = status.as_u16(), code = self.code(), "{self}");
        }
        let retry = self.retry_after();
        let mut response = (status, Json(self.body())).into_response();
        if let Some(after) = retry {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(after.as_secs().max(1)),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_the_openai_shape_and_its_status() {
        let e = ApiError::param("temperature", "must be between 0 and 2, got 3");
        let v = serde_json::to_value(e.body()).unwrap();
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "invalid_parameter");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let r = ApiError::daemon_down("no socket").into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "5");
    }
}
