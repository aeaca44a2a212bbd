//! `GET /v1/cache/stats`, `GET /v1/cache/entries`, `POST /v1/cache/evict`: the cache manager's
//! admin answers as JSON (raw integers in base units, the same fields `mlxcelctl --json` prints).

use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use mlxcel_ipc::proto::admin::{AdminReply, AdminRequest, EvictSelector};
use mlxcel_ipc::size::parse_size;
use serde::Deserialize;
use serde_json::json;

use crate::body::{JsonBody, RequestBody};
use crate::error::ApiError;
use crate::state::AppState;

/// The most entries one listing returns.
const MAX_ENTRIES: u32 = 10_000;

pub async fn stats(State(app): State<AppState>) -> Result<Response, ApiError> {
    Ok(Json(app.cache.stats().await?).into_response())
}

#[derive(Debug, Deserialize)]
pub struct EntriesQuery {
    limit: Option<String>,
}

pub async fn entries(
    State(app): State<AppState>,
    Query(q): Query<EntriesQuery>,
) -> Result<Response, ApiError> {
    let limit = match q.limit.as_deref() {
        None => 100,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=MAX_ENTRIES).contains(&n) => n,
            _ => {
                return Err(ApiError::param(
                    "limit",
                    format!("must be a whole number from 1 to {MAX_ENTRIES}, got `{text}`"),
                ));
            }
        },
    };
    match app.cache.request(&AdminRequest::Entries { limit }).await? {
        AdminReply::Entries(list) => {
            Ok(Json(json!({"object": "list", "data": list})).into_response())
        }
        other => Err(ApiError::Generation(format!("unexpected reply {other:?}"))),
    }
}

/// `POST /v1/cache/evict` body: exactly one selector, as in `mlxcelctl cache evict`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvictBody {
    /// An entry id from `/v1/cache/entries`.
    entry: Option<String>,
    /// Blocks idle longer than this (`"10m"`, `"90s"`).
    older_than: Option<String>,
    /// Evict least recently used blocks down to this size (`1073741824` or `"1GiB"`).
    to_bytes: Option<serde_json::Value>,
    /// Everything unpinned.
    #[serde(default)]
    all: bool,
}

impl EvictBody {
    /// The selector this body names (exactly one must be given).
    pub fn selector(&self) -> Result<EvictSelector, ApiError> {
        let given = usize::from(self.entry.is_some())
            + usize::from(self.older_than.is_some())
            + usize::from(self.to_bytes.is_some())
            + usize::from(self.all);
        if given != 1 {
            return Err(ApiError::InvalidParam {
                param: None,
                message: "give exactly one of `entry`, `older_than`, `to_bytes`, `all: true`"
                    .into(),
            });
        }
        if let Some(id) = &self.entry {
            return Ok(EvictSelector::Entry(id.clone()));
        }
        if let Some(age) = &self.older_than {
            let d: Duration = humantime::parse_duration(age).map_err(|e| {
                ApiError::param(
                    "older_than",
                    format!("must be a duration like 10m, got `{age}`: {e}"),
                )
            })?;
            return Ok(EvictSelector::OlderThanMs(
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            ));
        }
        if let Some(v) = &self.to_bytes {
            let bytes = match v {
                serde_json::Value::Number(n) => n.as_u64(),
                serde_json::Value::String(s) => parse_size(s).ok(),
                _ => None,
            }
            .ok_or_else(|| {
                ApiError::param(
                    "to_bytes",
                    format!("must be a size like 1073741824 or \"1GiB\", got `{v}`"),
                )
            })?;
            return Ok(EvictSelector::ToBytes(bytes));
        }
        Ok(EvictSelector::All)
    }
}

/// `POST /v1/cache/evict`'s fields.
const EVICT_FIELDS: &[crate::fields::Field] = &[
    crate::fields::Field {
        name: "entry",
        treatment: crate::fields::Treatment::Honoured,
    },
    crate::fields::Field {
        name: "older_than",
        treatment: crate::fields::Treatment::Honoured,
    },
    crate::fields::Field {
        name: "to_bytes",
        treatment: crate::fields::Treatment::Honoured,
    },
    crate::fields::Field {
        name: "all",
        treatment: crate::fields::Treatment::Honoured,
    },
];

impl RequestBody for EvictBody {
    const FIELDS: &'static [&'static [crate::fields::Field]] = &[EVICT_FIELDS];
}

pub async fn evict(
    State(app): State<AppState>,
    JsonBody(body): JsonBody<EvictBody>,
) -> Result<Response, ApiError> {
    let selector = body.selector()?;
    match app.cache.request(&AdminRequest::Evict(selector)).await? {
        AdminReply::Evicted(report) => Ok(Json(report).into_response()),
        other => Err(ApiError::Generation(format!("unexpected reply {other:?}"))),
    }
}
