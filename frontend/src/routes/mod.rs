//! The router: routes, the host/origin gate, the API-key check (`Authorization: Bearer`, or
//! Anthropic's `x-api-key`), request ids, response counting, and OpenAI-shaped answers for
//! unknown routes and wrong methods. One file per group of routes: [`generate`] (chat and
//! completions, and what every generating route shares), [`responses`], [`messages`]
//! (Anthropic's, with errors in Anthropic's shape), `cache`, `ops`.

mod cache;
pub mod generate;
mod messages;
mod ops;
mod responses;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

pub use cache::EvictBody;

use crate::error::ApiError;
use crate::state::AppState;
use crate::tenants::Caller;

/// The HTTP request's id (`x-request-id`, the client's when it is sane, else one of ours), as
/// logs and responses name it; not the daemon's `RequestId`.
#[derive(Debug, Clone)]
pub struct HttpRequestId(pub String);

const REQUEST_ID: &str = "x-request-id";

/// Builds the application.
pub fn router(state: AppState) -> Router {
    let admin = Router::new()
        .route("/v1/cache/entries", get(cache::entries))
        .route("/v1/cache/evict", post(cache::evict))
        .route_layer(middleware::from_fn(require_admin));
    let anthropic = Router::new()
        .route("/v1/messages", post(messages::create))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key))
        .route_layer(middleware::from_fn(crate::anthropic::errors::reshape));
    let guarded = Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/models", get(ops::models))
        .route("/metrics", get(ops::metrics))
        .route("/v1/cache/stats", get(cache::stats))
        .merge(admin)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .merge(guarded)
        .merge(anthropic)
        .route("/health", get(ops::health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), gate))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            request_context,
        ))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::RouteNotFound {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
}

/// Refuses requests for another host (421) and browser requests from other origins (403),
/// on every route, before anything else runs (see [`crate::gate`]).
async fn gate(State(app): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(refusal) = refusal(&app.gate, req.headers()) {
        return refusal.into_response();
    }
    next.run(req).await
}

fn refusal(gate: &crate::gate::Gate, headers: &axum::http::HeaderMap) -> Option<ApiError> {
    let text = |name| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let host = text(header::HOST);
    if !gate.host_ok(host) {
        return Some(ApiError::MisdirectedHost(
            host.unwrap_or_default().to_string(),
        ));
    }
    let origin = text(header::ORIGIN);
    if !gate.origin_ok(origin) {
        return Some(ApiError::ForbiddenOrigin(
            origin.unwrap_or_default().to_string(),
        ));
    }
    None
}

/// Refuses requests without one of the configured bearer tokens, and tells the handlers who
/// sent the others ([`Caller`]: the tenant, whether admin).
async fn require_key(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    // Anthropic's clients send `x-api-key` (SDKs before 2.0, Claude Code's ANTHROPIC_API_KEY).
    let sent = req
        .headers()
        .get("x-api-key")
        .or_else(|| req.headers().get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v));
    let Some(caller) = app.keys.identify(sent) else {
        return ApiError::Unauthorized.into_response();
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// Refuses the admin routes to callers without the admin key (see [`crate::tenants`]).
async fn require_admin(req: Request, next: Next) -> Response {
    if !req.extensions().get::<Caller>().is_some_and(|c| c.admin) {
        return ApiError::AdminRequired.into_response();
    }
    next.run(req).await
}

/// Assigns the request id (echoed in `x-request-id`), logs the request at debug level (never
/// its body), and counts the response by route and status.
async fn request_context(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "{:x}{:06x}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            )
        });
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let method = req.method().clone();
    req.extensions_mut().insert(HttpRequestId(id.clone()));
    let started = Instant::now();
    let span = tracing::info_span!("request", request_id = %id);
    let mut response = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    let status = response.status().as_u16();
    app.metrics.response(&route, status);
    span.in_scope(|| {
        tracing::debug!(%method, %route, status, elapsed_ms = started.elapsed().as_millis() as u64, "answered")
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, v);
    }
    response
}
