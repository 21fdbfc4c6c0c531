//! The console's JSON endpoints under `/ui/api/`. They call the relay's own backend through
//! the same seams the `outbox` command uses ([`DeadLetterStore`], [`Explain`]) and tell the
//! same stories ([`crate::story`]).
//!
//! | endpoint | answers |
//! | --- | --- |
//! | `GET overview?after=MS` | backlog, throughput, p99, the samples taken after `MS`, the sinks |
//! | `GET dead?type=T&aggregate=A&limit=N` | dead letters, oldest first |
//! | `GET events/ID` | one event: `outbox dead show` |
//! | `GET why/ID` | `outbox why` (404 with the notes when no committed event has the id) |
//! | `POST dead/retry` `{"ids": [...]}` | puts dead letters back in line (actions only) |
//! | `POST dead/purge` `{"older_than": "7d", "event_type": null}` | deletes dead letters (actions only) |
//! | `POST reload` `{}` | reloads the configuration file, as SIGHUP does (actions only) |
//!
//! [`DeadLetterStore`]: outbox_core::backend::DeadLetterStore
//! [`Explain`]: outbox_core::backend::Explain

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use outbox_core::SourceError;
use outbox_core::admin::{Explanation, RetrySelection};
use outbox_core::backend::{Backend, DeadLetterStore, Unsupported};
use outbox_core::relay::ErrorChain;
use serde_json::json;
use time::OffsetDateTime;
use uuid::Uuid;

use super::guard::{Refusal, check_action};
use super::{Console, unix_ms};
use crate::story;

/// The most dead letters one list returns.
const MAX_LIST: i64 = 1_000;

/// What a handler answers: JSON, or `{"error": ...}` with a status.
type Answer = Result<Response, Refusal>;

fn backend(console: &Console) -> Result<&Arc<dyn Backend>, Refusal> {
    console.backend.get().ok_or_else(|| {
        Refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the relay is still opening the database".to_owned(),
        )
    })
}

fn dead_letters(console: &Console) -> Result<&dyn DeadLetterStore, Refusal> {
    backend(console)?.dead_letters().map_err(unsupported)
}

fn unsupported(e: Unsupported) -> Refusal {
    Refusal(StatusCode::NOT_IMPLEMENTED, e.to_string())
}

fn failed(e: SourceError) -> Refusal {
    Refusal(StatusCode::BAD_GATEWAY, ErrorChain(&e).to_string())
}

fn event_id(id: &str) -> Result<Uuid, Refusal> {
    Uuid::parse_str(id.trim()).map_err(|_| {
        Refusal(
            StatusCode::BAD_REQUEST,
            format!("`{id}` is not an event id (a UUID)"),
        )
    })
}

fn body<T: serde::de::DeserializeOwned>(bytes: &[u8], expected: &str) -> Result<T, Refusal> {
    serde_json::from_slice(bytes)
        .map_err(|e| Refusal(StatusCode::BAD_REQUEST, format!("expected {expected}: {e}")))
}

/// `overview`'s query.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct OverviewQuery {
    /// Only samples taken after this Unix time (ms); 0 or absent: all.
    #[serde(default)]
    after: i64,
}

/// `GET /ui/api/overview`.
pub(crate) async fn overview(
    State(console): State<Arc<Console>>,
    Query(query): Query<OverviewQuery>,
) -> Response {
    let (samples, latest, window_p99, window_rate, span) = {
        let history = console
            .history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (
            history.since(query.after),
            history.latest().cloned(),
            history.window_p99(),
            history.window_rate(),
            history.span_seconds(),
        )
    };
    let check = console
        .sink_check
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let counters = super::history::Counters::parse(&console.prometheus.render());
    let source = console.backend.get().map(|b| {
        json!({
            "kind": b.kind(),
            "label": b.label(),
            "table": b.table(),
            "database": b.database(),
        })
    });
    let canary = super::lock(&console.canary).as_ref().map(|status| {
        status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    });
    let sink = console.sink();
    let (database_ready, sink_ready) = console.readiness.parts();
    // One sink today; a list, so fan-out sinks and subscriptions slot in without a new shape.
    let sinks = vec![json!({
        "name": check.name.unwrap_or_else(|| sink.kind().to_owned()),
        "kind": sink.kind(),
        "up": counters.sink_up,
        "healthy": check.ok,
        "checked_at": check.at.map(outbox_core::admin::when),
        "error": check.error,
    })];
    Json(json!({
        "now": unix_ms(OffsetDateTime::now_utc()),
        "started": unix_ms(console.started),
        "refresh_ms": console.refresh.as_millis() as u64,
        "ready": { "database": database_ready, "sink": sink_ready },
        "source": source,
        "latest": latest,
        "published": counters.published,
        "window": { "seconds": span, "rate": window_rate, "p99": window_p99 },
        "samples": samples,
        "sinks": sinks,
        "subscriptions": [],
        "canary": canary,
        "actions": console.ui.allow_actions,
        "config": {
            "generation": console.generation.load(std::sync::atomic::Ordering::Relaxed),
            "reloadable": console.reloads.get().is_some(),
        },
    }))
    .into_response()
}

/// `dead`'s query.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct DeadQuery {
    /// Only this event type.
    #[serde(rename = "type")]
    event_type: Option<String>,
    /// Only this aggregate id.
    aggregate: Option<String>,
    /// At most this many (default 100, at most 1,000).
    limit: Option<i64>,
}

fn non_empty(s: Option<&String>) -> Option<&str> {
    s.map(|s| s.trim()).filter(|s| !s.is_empty())
}

/// `GET /ui/api/dead`.
pub(crate) async fn dead_list(
    State(console): State<Arc<Console>>,
    Query(query): Query<DeadQuery>,
) -> Answer {
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_LIST);
    let list = dead_letters(&console)?
        .list(
            non_empty(query.event_type.as_ref()),
            non_empty(query.aggregate.as_ref()),
            limit,
        )
        .await
        .map_err(failed)?;
    Ok(Json(json!({ "dead_letters": list, "limit": limit })).into_response())
}

/// `GET /ui/api/events/{id}`: what `outbox dead show` prints.
pub(crate) async fn event(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Answer {
    let id = event_id(&id)?;
    let detail = dead_letters(&console)?
        .show(id)
        .await
        .map_err(failed)?
        .ok_or_else(|| Refusal(StatusCode::NOT_FOUND, format!("no event with id {id}")))?;
    Ok(Json(json!({
        "lines": story::detail_lines(&detail),
        "event": story::event_json(&detail).unwrap_or_default(),
    }))
    .into_response())
}

/// `GET /ui/api/why/{id}`: what `outbox why` prints.
pub(crate) async fn why(State(console): State<Arc<Console>>, Path(id): Path<String>) -> Answer {
    let id = event_id(&id)?;
    let explain = backend(&console)?.explain().map_err(unsupported)?;
    let now = OffsetDateTime::now_utc();
    Ok(match explain.explain(id, now).await.map_err(failed)? {
        Explanation::Found(found) => Json(json!({
            "found": true,
            "lines": story::story_lines(&console.sink(), &found, now),
            "story": story::story_json(&console.sink(), &found).unwrap_or_default(),
        }))
        .into_response(),
        Explanation::NotFound { message, notes } => (
            StatusCode::NOT_FOUND,
            Json(json!({ "found": false, "error": message, "notes": notes })),
        )
            .into_response(),
    })
}

/// `POST /ui/api/dead/retry`'s body.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    /// The dead letters to put back in line.
    ids: Vec<Uuid>,
}

/// `POST /ui/api/dead/retry`: `outbox dead retry ID...`.
pub(crate) async fn retry(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    // The checks come first: a refused request never reaches the database.
    check_action(&console, &headers)?;
    let RetryBody { ids } = body(&bytes, r#"{"ids": ["EVENT-ID", ...]}"#)?;
    if ids.is_empty() {
        return Err(Refusal(
            StatusCode::BAD_REQUEST,
            "no ids to retry".to_owned(),
        ));
    }
    let retried = dead_letters(&console)?
        .retry(&RetrySelection::Ids(ids.clone()))
        .await
        .map_err(failed)?;
    let not_dead: Vec<Uuid> = ids.into_iter().filter(|id| !retried.contains(id)).collect();
    tracing::info!(count = retried.len(), ids = ?retried, "dead letters put back in line from the console");
    Ok(Json(json!({ "retried": retried, "not_dead": not_dead })).into_response())
}

/// `POST /ui/api/dead/purge`'s body.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    /// Dead-lettered longer ago than this (`7d`, `12h`, `0s` = all).
    older_than: String,
    /// Only this event type.
    #[serde(default)]
    event_type: Option<String>,
}

/// `POST /ui/api/dead/purge`: `outbox dead purge --older-than D [--type T] --yes`.
pub(crate) async fn purge(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    check_action(&console, &headers)?;
    let PurgeBody {
        older_than,
        event_type,
    } = body(&bytes, r#"{"older_than": "7d", "event_type": null}"#)?;
    let older = humantime::parse_duration(older_than.trim()).map_err(|e| {
        Refusal(
            StatusCode::BAD_REQUEST,
            format!("older_than: `{older_than}`: {e}"),
        )
    })?;
    let before = OffsetDateTime::now_utc() - older;
    let purged = dead_letters(&console)?
        .purge(before, non_empty(event_type.as_ref()))
        .await
        .map_err(failed)?;
    tracing::info!(count = purged.len(), "dead letters purged from the console");
    Ok(Json(json!({ "purged": purged.len(), "ids": purged })).into_response())
}

/// `POST /ui/api/reload`: reads the configuration file again, as SIGHUP does; answers once
/// the new configuration runs (`generation`, `changes` with secrets as `***`), or 422 with
/// the reason it was refused (the running configuration stays).
pub(crate) async fn reload(State(console): State<Arc<Console>>, headers: HeaderMap) -> Answer {
    check_action(&console, &headers)?;
    let reloads = console.reloads.get().ok_or_else(|| {
        Refusal(
            StatusCode::NOT_IMPLEMENTED,
            "this relay was not started from a configuration file it can read again".to_owned(),
        )
    })?;
    tracing::info!("configuration reload requested from the console");
    match reloads.request().await {
        Ok(outcome) => Ok(Json(json!({
            "generation": outcome.generation,
            "changes": outcome.changes,
        }))
        .into_response()),
        Err(e) => Err(Refusal(StatusCode::UNPROCESSABLE_ENTITY, e)),
    }
}
