//! What the checks publish: a fresh [`Target`] per check and events as a source would hand
//! them over.

use bytes::Bytes;
use outbox_core::{Destination, Event, Position};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{SinkHarness, Target};

/// A fresh scope and the target for `events` under `template` (`{scope}` is replaced, and
/// every `.` becomes the harness' [separator](SinkHarness::separator)).
pub(super) fn target<H: SinkHarness>(
    h: &H,
    template: &str,
    events: &[Event],
) -> anyhow::Result<Target> {
    let scope = format!("t{}", &Uuid::now_v7().simple().to_string()[20..]);
    let template = template
        .replace('.', &h.separator().to_string())
        .replace("{scope}", &scope);
    let template = Destination::parse(&template)?;
    let mut destinations: Vec<String> = Vec::new();
    for e in events {
        let d = template.render(e);
        if !destinations.contains(&d) {
            destinations.push(d);
        }
    }
    Ok(Target {
        scope,
        template,
        destinations,
    })
}

/// An event as a source would hand it over.
pub(super) fn event(aggregate_type: &str, aggregate_id: &str, payload: impl Into<Bytes>) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(0),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: format!("{}.placed", aggregate_type.to_ascii_lowercase()),
        payload: payload.into(),
        headers: Vec::new(),
        created_at: OffsetDateTime::now_utc(),
        attempts: 0,
    }
}
