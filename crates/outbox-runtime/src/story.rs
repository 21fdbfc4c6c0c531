//! What `outbox why` and `outbox dead show` tell about one event, as text lines and JSON: one
//! implementation for the command line and the web console (`/ui`), so both say the same.

use outbox_core::admin::{DeliveryModel, EventStory, StoredEventDetail, Verdict, when};
use outbox_core::{Event, Position};
use time::OffsetDateTime;

use crate::SinkConfig;

/// The event as JSON: its fields, with the payload as text (or a note when not UTF-8).
pub fn event_json(detail: &StoredEventDetail) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(detail)?;
    v["payload"] = serde_json::Value::String(payload_text(&detail.payload));
    Ok(v)
}

/// The story as JSON (`outbox why --json`): the verdict, the event, its destination.
pub fn story_json(
    sink: &SinkConfig,
    story: &EventStory,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(story)?;
    v["event"] = event_json(&story.event)?;
    v["destination"] = serde_json::Value::from(destination(sink, &story.event));
    v["cdc"] = serde_json::Value::Bool(story.model == DeliveryModel::Stream);
    Ok(v)
}

/// The payload as text, or `<N bytes, not UTF-8>`.
fn payload_text(payload: &[u8]) -> String {
    match std::str::from_utf8(payload) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("<{} bytes, not UTF-8>", payload.len()),
    }
}

/// `outbox dead show`: the event, its attempts, headers and payload, one line each.
pub fn detail_lines(detail: &StoredEventDetail) -> Vec<String> {
    let s = &detail.summary;
    let mut lines = vec![
        format!("event        {}", s.id),
        format!("aggregate    {}/{}", s.aggregate_type, s.aggregate_id),
        format!("event type   {}", s.event_type),
        format!("state        {} (seq {})", detail.state, detail.seq),
        format!("created      {}", when(s.created_at)),
    ];
    if let Some(t) = s.dead_lettered_at {
        lines.push(format!("dead since   {}", when(t)));
    }
    lines.extend(attempt_lines(detail));
    lines.extend(body_lines(detail));
    lines
}

/// The attempts, one line each; falls back to `last_error` where no history is kept (SQLite,
/// CDC dead letters, failures recorded before schema version 2).
pub fn attempt_lines(detail: &StoredEventDetail) -> Vec<String> {
    let s = &detail.summary;
    let requeued = detail.attempt_errors.iter().any(|a| a.kind == "requeued");
    let mut lines = vec![format!(
        "attempts     {} failed{}",
        s.attempts,
        if requeued {
            " since it was last put back in line"
        } else {
            ""
        }
    )];
    if detail.attempt_errors.is_empty() {
        if s.attempts > 0 || s.reason.is_some() {
            lines.push(format!(
                "last error   {}",
                s.reason.as_deref().unwrap_or("-")
            ));
        }
        return lines;
    }
    if detail
        .attempt_errors
        .first()
        .is_some_and(|a| a.attempt > 1 && a.kind != "requeued")
    {
        lines.push(format!(
            "  (earlier attempts not kept: the last {} entries are)",
            detail.attempt_errors.len()
        ));
    }
    for a in &detail.attempt_errors {
        lines.push(format!(
            "  #{:<3} {}  {:<8} {}",
            a.attempt,
            when(a.at),
            a.kind,
            a.error
        ));
    }
    lines
}

/// Headers and payload.
pub fn body_lines(detail: &StoredEventDetail) -> Vec<String> {
    vec![
        format!("headers      {}", detail.headers),
        format!("payload      {}", payload_text(&detail.payload)),
    ]
}

/// `outbox why`: the event, its attempts, and where it stands at `now` and why.
pub fn story_lines(sink: &SinkConfig, story: &EventStory, now: OffsetDateTime) -> Vec<String> {
    let model = story.model;
    let d = &story.event;
    let s = &d.summary;
    let mut lines = vec![
        format!("event        {}", s.id),
        format!("aggregate    {}/{}", s.aggregate_type, s.aggregate_id),
        format!("event type   {}", s.event_type),
        format!("created      {}", when(s.created_at)),
        format!("state        {} (seq {})", d.state, d.seq),
    ];
    lines.extend(attempt_lines(d));
    lines.extend(body_lines(d));
    let to = destination(sink, d);
    let why = match &story.verdict {
        Verdict::Delivered => format!(
            "delivered at {} to {to} (per the current [sink] config)",
            d.delivered_at.map(when).unwrap_or_else(|| "?".to_owned())
        ),
        Verdict::Dead => format!(
            "dead-lettered at {}: {}. Fix the cause, then `outbox dead retry {}`",
            s.dead_lettered_at
                .map(when)
                .unwrap_or_else(|| "?".to_owned()),
            s.reason.as_deref().unwrap_or("-"),
            s.id
        ),
        Verdict::Backoff { until } => format!(
            "waiting on backoff: attempt {} failed; next attempt at {} (in {:.0}s), then to {to}",
            s.attempts,
            when(*until),
            (*until - now).as_seconds_f64().max(0.0)
        ),
        Verdict::BlockedByEarlier { blocker: b } => {
            let what = match (b.state.as_str(), b.backoff_until) {
                ("dead", _) => format!(
                    "a dead letter ({} failed attempts; last error: {}); `outbox dead retry {}` releases the aggregate",
                    b.attempts,
                    b.last_error.as_deref().unwrap_or("-"),
                    b.id
                ),
                (_, Some(until)) => format!(
                    "retrying: attempt {} failed ({}); next attempt at {}",
                    b.attempts,
                    b.last_error.as_deref().unwrap_or("-"),
                    when(until)
                ),
                _ => "pending, ready: it goes first".to_owned(),
            };
            format!(
                "waiting for an earlier event of {}/{} (per-aggregate order): {} written {}, {what}. `outbox why {}` tells its story",
                s.aggregate_type,
                s.aggregate_id,
                b.id,
                when(b.created_at),
                b.id
            )
        }
        Verdict::Claimed => {
            format!("being published right now: a relay holds its claim (destination {to})")
        }
        Verdict::Ready { .. } if model == DeliveryModel::Lease => format!(
            "ready: nothing holds it; the relay holding the file's lease publishes it next (to {to}). If it stays here, is `outbox relay` running? (`outbox status`)"
        ),
        Verdict::Streamed | Verdict::Ready { .. } if model == DeliveryModel::Stream => format!(
            "CDC mode: delivery is not recorded per row; a running relay streams it when its transaction's commit is decoded (to {to}). `outbox status` shows the slot's lag and who streams from it"
        ),
        Verdict::Streamed => format!("streamed by the CDC relay (to {to})"),
        Verdict::Ready { ahead } => format!(
            "ready: nothing holds it; {ahead} pending event(s) not in backoff are ahead of it in claim order. If it stays here, is a relay running and reaching the broker? (`outbox status`, `outbox doctor`)"
        ),
    };
    lines.push(format!("why          {why}"));
    lines
}

/// The destination the event goes (or went) to, from the sink's template.
pub fn destination(sink: &SinkConfig, d: &StoredEventDetail) -> String {
    let s = &d.summary;
    let event = Event {
        id: s.id,
        position: Position(d.seq),
        aggregate_type: s.aggregate_type.clone(),
        aggregate_id: s.aggregate_id.clone(),
        event_type: s.event_type.clone(),
        payload: Default::default(),
        headers: Vec::new(),
        created_at: s.created_at,
        attempts: 0,
    };
    sink.describe_destination(&event)
}
