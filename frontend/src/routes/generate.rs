//! `POST /v1/chat/completions` and `POST /v1/completions`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;

use crate::body::JsonBody;
use crate::completion::Completion;
use crate::daemon_link::Session;
use crate::error::ApiError;
use crate::openai::request::{ChatRequest, CompletionRequest};
use crate::respond::{self, Chunker, Kind};
use crate::routes::RequestId;
use crate::state::AppState;
use crate::tenants::{self, Caller};
use crate::validate::{self, ValidRequest};

pub async fn chat(
    State(app): State<AppState>,
    Extension(rid): Extension<RequestId>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let session = app.daemon.session()?;
    let valid = validate::chat(&req, &session.model)?;
    run(
        &app,
        &session,
        &caller,
        valid,
        Kind::Chat,
        format!("chatcmpl-{}", rid.0),
    )
    .await
}

pub async fn completions(
    State(app): State<AppState>,
    Extension(rid): Extension<RequestId>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let session = app.daemon.session()?;
    let valid = validate::completion(&req, &session.model)?;
    run(
        &app,
        &session,
        &caller,
        valid,
        Kind::Completion,
        format!("cmpl-{}", rid.0),
    )
    .await
}

/// Admits `valid` to the queue, sends it (in the caller's tenant), and answers in `kind`'s shape.
async fn run(
    app: &AppState,
    session: &Arc<Session>,
    caller: &Caller,
    valid: ValidRequest,
    kind: Kind,
    id: String,
) -> Result<Response, ApiError> {
    let slot = app.queue.enter()?;
    tracing::debug!(
        prompt_tokens = valid.prompt.len(),
        max_tokens = valid.max_tokens,
        stream = valid.stream,
        "generation admitted"
    );
    let salt = tenants::cache_salt(caller.tenant.as_deref(), valid.cache_salt.as_deref());
    let completion = Completion::start(session, &valid, salt, slot, app.metrics.clone())?;
    let mut chunker = Chunker::new(kind, id, valid.model.clone());
    chunker.include_usage = valid.include_usage;
    chunker.logprobs = valid.logprobs;
    chunker.top_logprobs = valid.top_logprobs;
    if valid.stream {
        Ok(respond::stream(completion, chunker))
    } else {
        respond::collect(completion, chunker).await
    }
}
