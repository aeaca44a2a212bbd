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
use crate::queue::QueueSlot;
use crate::respond::{self, Chunker, Kind};
use crate::routes::HttpRequestId;
use crate::state::AppState;
use crate::tenants::{self, Caller};
use crate::validate::{self, ValidRequest};

pub async fn chat(
    State(app): State<AppState>,
    Extension(rid): Extension<HttpRequestId>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let session = app.daemon.session()?;
    let slot = app.queue.enter()?;
    let model = session.model.clone();
    let valid = off_the_workers(move || validate::chat(&req, &model)).await?;
    run(
        &app,
        &session,
        &caller,
        slot,
        valid,
        Kind::Chat,
        format!("chatcmpl-{}", rid.0),
    )
    .await
}

pub async fn completions(
    State(app): State<AppState>,
    Extension(rid): Extension<HttpRequestId>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let session = app.daemon.session()?;
    let slot = app.queue.enter()?;
    let model = session.model.clone();
    let valid = off_the_workers(move || validate::completion(&req, &model)).await?;
    run(
        &app,
        &session,
        &caller,
        slot,
        valid,
        Kind::Completion,
        format!("cmpl-{}", rid.0),
    )
    .await
}

/// Sends `valid` (admitted as `slot`, in the caller's tenant) and answers in `kind`'s shape.
async fn run(
    app: &AppState,
    session: &Arc<Session>,
    caller: &Caller,
    slot: QueueSlot,
    valid: ValidRequest,
    kind: Kind,
    id: String,
) -> Result<Response, ApiError> {
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

/// Runs templating and tokenizing (milliseconds to seconds for a body of megabytes) on the
/// blocking pool, after admission: a large body never stalls the async workers that serve
/// every other connection, and a full queue refuses it before any of that work.
async fn off_the_workers(
    work: impl FnOnce() -> Result<ValidRequest, ApiError> + Send + 'static,
) -> Result<ValidRequest, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(ApiError::Generation(format!("validation failed: {e}"))))
}
