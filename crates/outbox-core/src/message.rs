//! The message contract shared by every sink: which headers a message carries.
//!
//! Per the contract (`docs/contract.md`, "The message on the broker") every message carries
//! `id`, `event_type`, `aggregate_type` and `aggregate_id`, then the row's own headers. The
//! contract headers come first and win: a row header with one of those names is not sent
//! twice.

use crate::Event;

/// Names of the headers every message carries.
pub mod header {
    /// The event id (UUID text): the consumer's deduplication key.
    pub const ID: &str = "id";
    /// The event type.
    pub const EVENT_TYPE: &str = "event_type";
    /// The aggregate type.
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// The aggregate id.
    pub const AGGREGATE_ID: &str = "aggregate_id";
    /// The event's delivery position within its aggregate: 1, 2, 3, … with no gaps, set by
    /// the polling relay when ordering is on (see [`crate::aggregate_seq`]). A producer's own
    /// header of this name is dropped when the row is read.
    pub const AGGREGATE_SEQ: &str = "aggregate_seq";
}

const CONTRACT: [&str; 4] = [
    header::ID,
    header::EVENT_TYPE,
    header::AGGREGATE_TYPE,
    header::AGGREGATE_ID,
];

/// Calls `f(name, value)` for every header of `event`'s message: the four contract headers,
/// then the row's own headers except any that reuse a contract name.
pub fn for_each_header(event: &Event, mut f: impl FnMut(&str, &str)) {
    let id = event
        .id
        .hyphenated()
        .encode_lower(&mut uuid::Uuid::encode_buffer())
        .to_owned();
    f(header::ID, &id);
    f(header::EVENT_TYPE, &event.event_type);
    f(header::AGGREGATE_TYPE, &event.aggregate_type);
    f(header::AGGREGATE_ID, &event.aggregate_id);
    for (name, value) in &event.headers {
        if !CONTRACT.contains(&name.as_str()) {
            f(name, value);
        }
    }
}

/// The headers of `event`'s message as owned pairs (for sinks that need ownership).
pub fn headers(event: &Event) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(4 + event.headers.len());
    for_each_header(event, |n, v| out.push((n.to_owned(), v.to_owned())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Position;

    #[test]
    fn contract_headers_come_first_and_cannot_be_overridden() {
        let event = Event {
            id: uuid::Uuid::from_u128(1),
            position: Position(1),
            aggregate_type: "Order".into(),
            aggregate_id: "o_1".into(),
            event_type: "order.placed".into(),
            payload: bytes::Bytes::new(),
            headers: vec![
                ("id".into(), "spoofed".into()),
                ("tenant".into(), "acme".into()),
            ],
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        };
        assert_eq!(
            headers(&event),
            vec![
                (
                    "id".to_owned(),
                    "00000000-0000-0000-0000-000000000001".to_owned()
                ),
                ("event_type".to_owned(), "order.placed".to_owned()),
                ("aggregate_type".to_owned(), "Order".to_owned()),
                ("aggregate_id".to_owned(), "o_1".to_owned()),
                ("tenant".to_owned(), "acme".to_owned()),
            ]
        );
    }
}
