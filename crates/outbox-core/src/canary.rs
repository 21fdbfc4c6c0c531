//! The canary's probe event: what a relay with `[canary] every = "…"` writes into its own
//! outbox table and reads back from its destination, and what a consumer-side canary
//! recognises (the inbox crate's `canary` module).
//!
//! A probe is an ordinary outbox event, so it takes the same path as every other event:
//! written in its own transaction, fetched, published, acknowledged. Its aggregate is one
//! relay process's ([`Probe::relay`]), so its probes form one aggregate whose commit order is
//! [`Probe::n`]: a destination that shows probe 7 after probe 8 broke per-aggregate order.
//!
//! Wire format (docs/operations.md, "Canary"): `aggregate_type = "outbox.canary"`,
//! `event_type = "outbox.canary.probe"`, `aggregate_id` the relay's canary name, payload a
//! JSON object `{"relay": "...", "n": 42, "written_at": "2026-11-28T05:00:00.123Z"}`.

use time::OffsetDateTime;

use crate::NewEvent;

/// The `aggregate_type` of every probe. Subscriptions skip it unless a subscription names it
/// exactly in its `aggregate_type` filter.
pub const AGGREGATE_TYPE: &str = "outbox.canary";
/// The `event_type` of every probe.
pub const EVENT_TYPE: &str = "outbox.canary.probe";

/// A probe's payload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Probe {
    /// The relay process that wrote it (also the event's `aggregate_id`).
    pub relay: String,
    /// Its number: 1, 2, 3, … in commit order, per relay process.
    pub n: u64,
    /// When the relay began writing it (RFC 3339, UTC).
    #[serde(with = "time::serde::rfc3339")]
    pub written_at: OffsetDateTime,
}

impl Probe {
    /// The outbox event that carries this probe.
    pub fn event(&self) -> NewEvent {
        // A struct of a string, an integer and a time always serializes.
        let payload = serde_json::to_vec(self).unwrap_or_default();
        NewEvent::new(AGGREGATE_TYPE, self.relay.clone(), EVENT_TYPE, payload)
    }

    /// The probe carried by an event of `aggregate_type` / `event_type` with `payload`;
    /// `None` for every other event (or a malformed probe).
    pub fn parse(aggregate_type: &str, event_type: &str, payload: &[u8]) -> Option<Self> {
        if aggregate_type != AGGREGATE_TYPE || event_type != EVENT_TYPE {
            return None;
        }
        serde_json::from_slice(payload).ok()
    }

    /// Seconds from [`Probe::written_at`] to `seen_at` (0 when the clocks disagree).
    pub fn latency_seconds(&self, seen_at: OffsetDateTime) -> f64 {
        (seen_at - self.written_at).as_seconds_f64().max(0.0)
    }
}

/// Whether a subscription's `aggregate_type` patterns ask for probes: only a pattern that is
/// exactly [`AGGREGATE_TYPE`] does (`*` does not), so adding a canary never sends probes to a
/// consumer that did not ask for them.
pub fn asked_for(aggregate_type_patterns: Option<&[String]>) -> bool {
    aggregate_type_patterns.is_some_and(|ps| ps.iter().any(|p| p == AGGREGATE_TYPE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_round_trips_through_its_event() {
        let probe = Probe {
            relay: "host-1/ab12".into(),
            n: 7,
            // 2026-11-28T05:00:00.123Z
            written_at: OffsetDateTime::from_unix_timestamp_nanos(1_795_842_000_123_000_000)
                .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        };
        let event = probe.event();
        assert_eq!(event.aggregate_type, AGGREGATE_TYPE);
        assert_eq!(event.aggregate_id, "host-1/ab12");
        let text = String::from_utf8(event.payload.to_vec()).unwrap_or_default();
        assert!(
            text.contains("\"written_at\":\"2026-11-28T05:00:00.123Z\""),
            "{text}"
        );
        let back = Probe::parse(&event.aggregate_type, &event.event_type, &event.payload);
        assert_eq!(back, Some(probe));
        assert_eq!(Probe::parse("Order", EVENT_TYPE, &event.payload), None);
    }

    #[test]
    fn only_an_exact_pattern_asks_for_probes() {
        assert!(!asked_for(None));
        assert!(!asked_for(Some(&["*".to_owned()])));
        assert!(!asked_for(Some(&["outbox.*".to_owned()])));
        assert!(asked_for(Some(&[
            "Order".to_owned(),
            "outbox.canary".to_owned()
        ])));
    }
}
