//! `GET /v1/models`, `GET /health`, `GET /metrics`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use mlxcel_ipc::proto::admin::CacheStats;
use mlxcel_ipc::proto::daemon::DaemonHealth;
use serde_json::json;

use crate::error::ApiError;
use crate::metrics::Exposition;
use crate::openai::response::{ModelCard, ModelList};
use crate::respond::now_secs;
use crate::state::AppState;

/// How long `/health` and `/metrics` wait for each process.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn models(State(app): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    let session = app.daemon.session()?;
    Ok(Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: session.model.model_id.clone(),
            object: "model",
            created: now_secs(),
            owned_by: "mlxcel",
            context_length: session.model.context_length,
            sampling_defaults: session.model.sampling_defaults,
        }],
    }))
}

async fn daemon_health(app: &AppState) -> Result<DaemonHealth, String> {
    let session = app.daemon.session().map_err(|e| e.to_string())?;
    session
        .health(PROBE_TIMEOUT)
        .await
        .ok_or_else(|| format!("the daemon did not answer within {PROBE_TIMEOUT:?}"))
}

/// Each process up or down. 200 while requests can be served (the daemon is up; without the
/// cache manager the service runs without prefix reuse), 503 otherwise: `starting`, with the
/// daemon's stage, while it loads its model and warms up.
pub async fn health(State(app): State<AppState>) -> Response {
    let (daemon, cache) = tokio::join!(daemon_health(&app), app.cache.stats());
    let model = app.daemon.session().ok().map(|s| s.model.model_id.clone());
    let starting = app.daemon.starting();
    let daemon_json = match (&daemon, &starting) {
        (Err(_), Some(stage)) => json!({"status": "starting", "stage": stage}),
        _ => match &daemon {
            Ok(h) => json!({
                "status": "up",
                "model": model,
                "cachemgr_connected": h.cachemgr_connected,
                "running": h.running,
                "waiting": h.waiting,
                "refused_block_ids": h.refused_block_ids,
                "pool": h.pool,
            }),
            Err(e) => json!({"status": "down", "error": e}),
        },
    };
    let cache_json = match &cache {
        Ok(s) => json!({
            "status": "up",
            "used_bytes": s.used_bytes,
            "capacity_bytes": s.capacity_bytes,
            "daemon_registered": s.daemon.is_some(),
        }),
        Err(e) => json!({"status": "down", "error": e.to_string()}),
    };
    let status = match (&daemon, &cache) {
        (Ok(_), Ok(_)) => "ok",
        (Ok(_), Err(_)) => "degraded",
        (Err(_), _) if starting.is_some() => "starting",
        _ => "unavailable",
    };
    let code = if daemon.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": status,
        "processes": {
            "frontend": {"status": "up", "pid": std::process::id(), "waiting": app.queue.waiting()},
            "daemon": daemon_json,
            "cachemgr": cache_json,
        }
    });
    (code, Json(body)).into_response()
}

/// Prometheus text: the front end's counters plus figures gathered from the daemon and the
/// cache manager (each with an `_up` gauge saying whether it answered).
pub async fn metrics(State(app): State<AppState>) -> Response {
    let (daemon, cache) = tokio::join!(daemon_health(&app), app.cache.stats());
    let mut out = Exposition::default();
    app.metrics.write(&mut out);
    out.counter(
        "mlxcel_daemon_protocol_violations_total",
        "Events of the daemon that broke the protocol (a token outside the vocabulary, usage \
         that disagrees with what was sent, an event for a request never sent, a garbled frame).",
        app.daemon.protocol_violations(),
    );
    out.gauge(
        "mlxcel_waiting_requests",
        "Requests admitted by the front end and not yet producing tokens.",
        app.queue.waiting() as u64,
    );
    write_daemon(&mut out, daemon.ok());
    write_cache(&mut out, cache.ok());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        out.text(),
    )
        .into_response()
}

fn write_daemon(out: &mut Exposition, health: Option<DaemonHealth>) {
    out.gauge(
        "mlxcel_daemon_up",
        "1 when the daemon answered this scrape.",
        u64::from(health.is_some()),
    );
    let Some(h) = health else { return };
    let p = h.pool;
    let gauges = [
        (
            "mlxcel_pool_blocks",
            "KV blocks in the daemon's pool.",
            u64::from(p.total_blocks),
        ),
        (
            "mlxcel_pool_free_blocks",
            "KV blocks on the pool's free list.",
            u64::from(p.free_blocks),
        ),
        (
            "mlxcel_pool_cache_blocks",
            "Pool blocks the daemon holds for the prefix cache.",
            u64::from(p.cache_blocks),
        ),
        (
            "mlxcel_pool_block_bytes",
            "Real bytes of one KV block.",
            p.block_bytes,
        ),
        (
            "mlxcel_pool_bytes",
            "Bytes of the pool's resident slabs as MLX measures its arrays.",
            p.pool_bytes_measured,
        ),
        (
            "mlxcel_kv_resident_cache_bytes",
            "Resident KV bytes held for the prefix cache.",
            p.kv_resident_split()[0],
        ),
        (
            "mlxcel_kv_resident_running_bytes",
            "Resident KV bytes held only by running requests.",
            p.kv_resident_split()[1],
        ),
        (
            "mlxcel_kv_resident_free_bytes",
            "Resident KV bytes free but not yet given back (blocks of a slab still in use).",
            p.kv_resident_split()[2],
        ),
        (
            "mlxcel_kv_measured_bytes",
            "KV bytes by an independent measure: MLX's active memory minus the weights.",
            p.kv_measured_bytes(),
        ),
        (
            "mlxcel_weights_bytes",
            "Bytes of the model's weights as MLX measured them after loading.",
            p.weights_bytes,
        ),
        (
            "mlxcel_daemon_resident_bytes",
            "The daemon's resident set (phys_footprint on macOS).",
            p.process_resident_bytes,
        ),
        (
            "mlxcel_running_sequences",
            "Sequences the engine is running.",
            u64::from(h.running),
        ),
        (
            "mlxcel_queued_sequences",
            "Sequences waiting in the engine.",
            u64::from(h.waiting),
        ),
        (
            "mlxcel_daemon_cachemgr_connected",
            "1 when the daemon is registered with the cache manager.",
            u64::from(h.cachemgr_connected),
        ),
    ];
    for (name, help, value) in gauges {
        out.gauge(name, help, value);
    }
    let st = h.steps;
    let seconds = |us: u64| us as f64 / 1e6;
    out.labelled_seconds(
        "mlxcel_engine_seconds_total",
        "Engine time by phase of a step: prefill chunks, the batched decode forward (model), \
         sampling, and the rest (admission, retiring, publishing).",
        "phase",
        &[
            ("prefill", seconds(st.prefill_us)),
            ("model", seconds(st.model_us)),
            ("sampling", seconds(st.sampling_us)),
            ("other", seconds(st.other_us)),
        ],
    );
    let counts = [
        (
            "mlxcel_prefill_tokens_total",
            "Prompt tokens computed (not read from the cache).",
            st.prefill_tokens,
        ),
        (
            "mlxcel_prefill_passes_total",
            "Prefill forward passes (each computes the chunks of every sequence a step prefills).",
            st.prefill_passes,
        ),
        (
            "mlxcel_prefill_chunks_total",
            "Prompt chunks computed (chunks / passes = mean chunks per pass).",
            st.prefill_chunks,
        ),
        (
            "mlxcel_decode_steps_total",
            "Batched decode steps.",
            st.decode_steps,
        ),
        (
            "mlxcel_decode_rows_total",
            "Sequences summed over the decode steps (rows / steps = mean batch).",
            st.decode_rows,
        ),
        (
            "mlxcel_grammar_masks_total",
            "Next-token masks computed for constrained requests (a grammar or JSON schema).",
            st.masks,
        ),
    ];
    for (name, help, value) in counts {
        out.counter(name, help, value);
    }
    out.labelled_seconds(
        "mlxcel_grammar_mask_seconds_total",
        "Time computing next-token masks for constrained requests (beside the forward pass).",
        "phase",
        &[("mask", seconds(st.mask_us))],
    );
    out.counter(
        "mlxcel_preemptions_total",
        "Sequences preempted because the pool was full.",
        h.preemptions,
    );
    out.counter(
        "mlxcel_daemon_refused_block_ids_total",
        "Block ids from the cache manager the daemon refused (not held under the hash claimed).",
        h.refused_block_ids,
    );
}

fn write_cache(out: &mut Exposition, stats: Option<CacheStats>) {
    out.gauge(
        "mlxcel_cachemgr_up",
        "1 when the cache manager answered this scrape.",
        u64::from(stats.is_some()),
    );
    let Some(s) = stats else { return };
    let gauges = [
        (
            "mlxcel_cache_capacity_bytes",
            "The cap on used + releasing bytes.",
            s.capacity_bytes,
        ),
        (
            "mlxcel_cache_used_bytes",
            "Bytes of blocks the cache retains.",
            s.used_bytes,
        ),
        (
            "mlxcel_cache_pinned_bytes",
            "Retained bytes pinned by leases.",
            s.pinned_bytes,
        ),
        (
            "mlxcel_cache_releasing_bytes",
            "Evicted bytes the daemon has not yet released.",
            s.releasing_bytes,
        ),
        (
            "mlxcel_cache_reserved_bytes",
            "Bytes reserved for waiting donations.",
            s.reserved_bytes,
        ),
        ("mlxcel_cache_blocks", "Blocks the cache retains.", s.blocks),
        ("mlxcel_cache_entries", "Cached prefix chains.", s.entries),
        (
            "mlxcel_cache_active_leases",
            "Leases currently held.",
            s.active_leases,
        ),
        (
            "mlxcel_cache_drift_bytes",
            "Ledger vs daemon inventory difference at the last reconciliation.",
            s.drift_bytes,
        ),
    ];
    for (name, help, value) in gauges {
        out.gauge(name, help, value);
    }
    let counters = [
        (
            "mlxcel_cache_prefix_hits_total",
            "Acquires that matched at least one block.",
            s.prefix_hits,
        ),
        (
            "mlxcel_cache_prefix_misses_total",
            "Acquires that matched nothing.",
            s.prefix_misses,
        ),
        (
            "mlxcel_cache_hit_tokens_total",
            "Prompt tokens served from the cache.",
            s.hit_tokens,
        ),
        (
            "mlxcel_cache_miss_tokens_total",
            "Prompt tokens of full blocks not found in the cache.",
            s.miss_tokens,
        ),
        (
            "mlxcel_cache_inserted_blocks_total",
            "Blocks that entered the cache.",
            s.inserted_blocks,
        ),
        (
            "mlxcel_cache_expired_leases_total",
            "Leases dropped by timeout.",
            s.expired_leases,
        ),
        (
            "mlxcel_cache_release_retries_total",
            "Releases sent again after no acknowledgement.",
            s.release_retries,
        ),
    ];
    for (name, help, value) in counters {
        out.counter(name, help, value);
    }
    let e = s.evicted_blocks;
    out.labelled(
        "mlxcel_cache_evicted_blocks_total",
        "Evicted blocks by reason.",
        "reason",
        &[
            ("capacity", e.capacity),
            ("ttl", e.ttl),
            ("max_blocks", e.max_blocks),
            ("manual", e.manual),
            ("pressure", e.pressure),
            ("daemon_lost", e.daemon_lost),
            ("drift", e.drift),
        ],
    );
    let r = s.rejected_blocks;
    out.labelled(
        "mlxcel_cache_rejected_blocks_total",
        "Donated blocks refused by reason.",
        "reason",
        &[
            ("capacity", r.capacity),
            ("max_blocks", r.max_blocks),
            ("release_timeout", r.release_timeout),
            ("invalid_block", r.invalid_block),
        ],
    )
}
