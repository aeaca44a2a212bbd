//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic's Messages API).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use super::generate::{admit, start};
use crate::answer::Collected;
use crate::anthropic::output::MessageOut;
use crate::anthropic::request::{self, CountTokensRequest, MessagesRequest};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::respond::{self, Idle};
use crate::state::AppState;
use crate::tenants::Caller;

pub async fn create(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<MessagesRequest>,
) -> Result<Response, ApiError> {
    let opts = app.text;
    let model_name = req.model.clone();
    let (session, slot, valid) =
        admit(&app, move |model| request::validate(&req, model, opts)).await?;
    let hour = valid.pins.iter().any(|p| p.ttl_secs >= 3600);
    let out = MessageOut::new(model_name, valid.prompt.len(), hour);
    let answer = start(&app, &session, &caller, slot, &valid, "toolu")?;
    if valid.stream {
        Ok(respond::stream(
            answer,
            out,
            Idle::Event("ping", "{\"type\": \"ping\"}"),
        ))
    } else {
        Ok(out.body(Collected::of(answer).await?))
    }
}

pub async fn count_tokens(
    State(app): State<AppState>,
    JsonBody(CountTokensRequest(req)): JsonBody<CountTokensRequest>,
) -> Result<Response, ApiError> {
    let session = app.daemon.session()?;
    let model = session.model.clone();
    let opts = app.text;
    let n = tokio::task::spawn_blocking(move || request::count(&req, &model, opts))
        .await
        .unwrap_or_else(|e| Err(ApiError::Generation(format!("counting failed: {e}"))))?;
    Ok(Json(json!({"input_tokens": n})).into_response())
}
