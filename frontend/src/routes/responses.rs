//! `POST /v1/responses`.

use axum::Extension;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use super::generate::{admit, start};
use crate::answer::Collected;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::respond::{self, Idle};
use crate::responses::output::{Echo, ResponseOut};
use crate::responses::request::{self, ResponsesRequest};
use crate::state::AppState;
use crate::tenants::Caller;

pub async fn create(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let inline = app.text.reasoning_inline;
    let mut echo = Echo {
        model: String::new(),
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        tools: req.tools.clone().unwrap_or_default(),
        tool_choice: req.tool_choice.clone().unwrap_or(Value::from("auto")),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        text: json!({"format": req.text.as_ref().and_then(|t| t.format.as_ref()).map_or(
            json!({"type": "text"}),
            |f| json!({"type": f.kind, "name": f.name, "schema": f.schema, "strict": f.strict}),
        )}),
        reasoning_effort: req.reasoning.as_ref().and_then(|r| r.effort.clone()),
        metadata: req.metadata.clone().unwrap_or(json!({})),
    };
    let (session, slot, valid) =
        admit(&app, move |model| request::validate(&req, model, inline)).await?;
    echo.model = valid.model.clone();
    let answer = start(&app, &session, &caller, slot, &valid, "call")?;
    let out = ResponseOut::new(echo);
    if valid.stream {
        Ok(respond::stream(answer, out, Idle::Comment))
    } else {
        Ok(out.body(Collected::of(answer).await?))
    }
}
