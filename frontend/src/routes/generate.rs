//! `POST /v1/chat/completions` and `POST /v1/completions`, and what every generating route
//! shares: admission, validation off the async workers, the cache-miss check, the answer.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::response::Response;

use crate::answer::{Answer, Collected};
use crate::body::JsonBody;
use crate::completion::Completion;
use crate::daemon_link::Session;
use crate::error::ApiError;
use crate::openai::chunks::{Chunker, Kind};
use crate::openai::request::{ChatRequest, CompletionRequest};
use crate::queue::QueueSlot;
use crate::respond::{self, Idle};
use crate::routes::HttpRequestId;
use crate::state::AppState;
use crate::tenants::{self, Caller};
use crate::text::ModelText;
use crate::validate::{self, ValidRequest};

pub async fn chat(
    State(app): State<AppState>,
    Extension(rid): Extension<HttpRequestId>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ChatRequest>,
) -> Result<Response, ApiError> {
    let inline = app.text.reasoning_inline;
    let (session, slot, valid) = admit(&app, move |model| {
        crate::openai::chat::validate(&req, model, inline)
    })
    .await?;
    let answer = start(&app, &session, &caller, slot, &valid, "call")?;
    let mut chunker = Chunker::new(
        Kind::Chat,
        format!("chatcmpl-{}", rid.0),
        valid.model.clone(),
    );
    openai_answer(answer, &mut chunker, &valid).await
}

pub async fn completions(
    State(app): State<AppState>,
    Extension(rid): Extension<HttpRequestId>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Response, ApiError> {
    let (session, slot, valid) =
        admit(&app, move |model| validate::completion(&req, model)).await?;
    let answer = start(&app, &session, &caller, slot, &valid, "call")?;
    let mut chunker = Chunker::new(
        Kind::Completion,
        format!("cmpl-{}", rid.0),
        valid.model.clone(),
    );
    openai_answer(answer, &mut chunker, &valid).await
}

async fn openai_answer(
    answer: Answer,
    chunker: &mut Chunker,
    valid: &ValidRequest,
) -> Result<Response, ApiError> {
    chunker.include_usage = valid.include_usage;
    chunker.logprobs = valid.logprobs;
    chunker.top_logprobs = valid.top_logprobs;
    if valid.stream {
        Ok(respond::stream(answer, chunker.clone(), Idle::Comment))
    } else {
        Ok(chunker.body(Collected::of(answer).await?))
    }
}

/// Takes a place in the queue and validates the request with `check` (templating and
/// tokenizing take milliseconds to seconds for a body of megabytes: they run on the blocking
/// pool, after admission, so a large body never stalls the async workers and a full queue
/// refuses it before any of that work).
pub async fn admit(
    app: &AppState,
    check: impl FnOnce(&ModelText) -> Result<ValidRequest, ApiError> + Send + 'static,
) -> Result<(Arc<Session>, QueueSlot, ValidRequest), ApiError> {
    let session = app.daemon.session()?;
    let slot = app.queue.enter()?;
    let model = session.model.clone();
    let valid = tokio::task::spawn_blocking(move || check(&model))
        .await
        .unwrap_or_else(|e| Err(ApiError::Generation(format!("validation failed: {e}"))))?;
    Ok((session, slot, valid))
}

/// Sends `valid` (admitted as `slot`, in the caller's tenant); its tool calls get ids
/// starting with `id_prefix`.
pub fn start(
    app: &AppState,
    session: &Arc<Session>,
    caller: &Caller,
    slot: QueueSlot,
    valid: &ValidRequest,
    id_prefix: &'static str,
) -> Result<Answer, ApiError> {
    tracing::debug!(
        prompt_tokens = valid.prompt.len(),
        max_tokens = valid.max_tokens,
        stream = valid.stream,
        constrained = valid.grammar.is_some(),
        "generation admitted"
    );
    let salt = tenants::cache_salt(caller.tenant.as_deref(), valid.cache_salt.as_deref());
    if let Some(d) = app.recall.diverges(salt.as_deref(), &valid.prompt) {
        app.metrics.missed("rerendered_answer");
        tracing::info!(
            kept = d.kept,
            answer_tokens = d.answer,
            "this prompt continues an earlier answer but renders it differently from the tokens \
             generated: the cache reuses only the first {} of its {} tokens",
            d.kept,
            d.answer
        );
    }
    let completion = Completion::start(
        session,
        valid,
        salt,
        slot,
        app.metrics.clone(),
        Some(app.recall.clone()),
    )?;
    Ok(Answer::new(completion, valid.reply.parser(id_prefix)))
}
