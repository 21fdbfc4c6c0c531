//! The events the checks write ([`event`]) and how they read what the broker saw: first
//! deliveries, each aggregate's order, delivery positions (`aggregate_seq`).

use std::collections::HashMap;

use anyhow::ensure;
use outbox_core::{Event, NewEvent};
use uuid::Uuid;

/// Event `n` of `aggregate` (type `Order`), with `n` in its payload and an `n` header.
pub(super) fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new(
        "Order",
        aggregate,
        "order.changed",
        format!("{{\"aggregate\":\"{aggregate}\",\"n\":{n}}}"),
    )
    .with_header("n", n.to_string())
}

/// Each aggregate's event ids, in the order of `events`.
pub(super) fn order_by_aggregate(events: &[Event]) -> HashMap<(String, String), Vec<Uuid>> {
    let mut out: HashMap<(String, String), Vec<Uuid>> = HashMap::new();
    for e in events {
        out.entry((e.aggregate_type.clone(), e.aggregate_id.clone()))
            .or_default()
            .push(e.id);
    }
    out
}

/// Removes repeated ids, keeping the first occurrence (a redelivery of an event that was
/// already published is allowed: at-least-once).
pub(super) fn first_deliveries(events: &[Event]) -> Vec<Event> {
    let mut seen = std::collections::HashSet::new();
    events
        .iter()
        .filter(|e| seen.insert(e.id))
        .cloned()
        .collect()
}

/// The `aggregate_seq` header of a published event.
pub(super) fn position_of(e: &Event) -> Option<u64> {
    e.headers
        .iter()
        .find(|(n, _)| n == outbox_core::message::header::AGGREGATE_SEQ)
        .and_then(|(_, v)| v.parse().ok())
}

/// In `events` (first deliveries, in publish order), each aggregate's positions are 1, 2, 3, …
pub(super) fn positions_count_up_per_aggregate(events: &[Event]) -> anyhow::Result<()> {
    let mut seen: HashMap<(&str, &str), Vec<Option<u64>>> = HashMap::new();
    for e in events {
        seen.entry((&e.aggregate_type, &e.aggregate_id))
            .or_default()
            .push(position_of(e));
    }
    for ((t, id), got) in seen {
        let expected: Vec<Option<u64>> = (1..=got.len() as u64).map(Some).collect();
        ensure!(
            got == expected,
            "aggregate {t}/{id}: delivery positions {got:?}, expected {expected:?}"
        );
    }
    Ok(())
}
