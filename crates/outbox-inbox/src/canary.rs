//! A consumer-side canary: the relay's `[canary]` probes, checked where they arrive.
//!
//! A relay with `[canary] every = "10s"` writes a probe event into its outbox table on that
//! schedule. Where the relay can read its destination back (JetStream, Kafka, Redis Streams,
//! Kinesis, Pub/Sub, a file) it checks the probes itself. Where it cannot (SQS, SNS,
//! RabbitMQ queues, webhooks), the probes still reach the consumers, and a consumer checks
//! them with a [`ProbeWatch`]: how long each took from its commit, whether one is missing
//! (the probes of one relay process are numbered 1, 2, 3, …), whether one came after a later
//! one. Export what it says as your own metrics and alert on them.
//!
//! ```
//! use outbox_inbox::canary::{ProbeWatch, Seen};
//! # fn handle(message: &outbox_inbox::InboxMessage, watch: &mut ProbeWatch) {
//! if let Some(seen) = watch.observe(message, time::OffsetDateTime::now_utc()) {
//!     // A probe, not a business event: record it and skip the handler.
//!     match seen {
//!         Seen::Next { latency_seconds, missing, .. } => { let _ = (latency_seconds, missing); }
//!         Seen::Late { .. } | Seen::Again { .. } => {}
//!     }
//!     return;
//! }
//! # }
//! ```
//!
//! The wire format is in docs/operations.md ("Canary").

use std::collections::HashMap;

pub use outbox_core::canary::{AGGREGATE_TYPE, EVENT_TYPE, Probe};
use time::OffsetDateTime;

use crate::InboxMessage;

/// The probe `message` carries; `None` for every other message.
pub fn probe(message: &InboxMessage) -> Option<Probe> {
    Probe::parse(
        &message.aggregate_type,
        &message.event_type,
        &message.payload,
    )
}

/// What a probe told the consumer.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// The next probe of its relay (or its first): `missing` probes numbered between the
    /// previous one and this have not arrived (lost, or to come out of order).
    Next {
        /// The relay process that wrote it.
        relay: String,
        /// Its number.
        n: u64,
        /// From its writing to `now`.
        latency_seconds: f64,
        /// Probes skipped since the previous one of this relay.
        missing: u64,
    },
    /// A probe numbered below the highest seen of its relay, seen for the first time: it
    /// arrived after a later probe (per-aggregate order broken on the way), or it is one that
    /// was counted missing.
    Late {
        /// The relay process that wrote it.
        relay: String,
        /// Its number.
        n: u64,
        /// The highest number seen before it.
        after: u64,
    },
    /// A probe seen before (at-least-once delivery: a redelivery, not a fault).
    Again {
        /// The relay process that wrote it.
        relay: String,
        /// Its number.
        n: u64,
    },
}

/// The probes a consumer saw, per relay process.
#[derive(Debug, Default)]
pub struct ProbeWatch {
    relays: HashMap<String, Progress>,
}

#[derive(Debug, Default)]
struct Progress {
    highest: u64,
    /// Numbers below `highest` not seen yet (bounded: the oldest are forgotten).
    gaps: Vec<u64>,
}

/// The most numbers kept as missing per relay.
const MAX_GAPS: usize = 10_000;

impl ProbeWatch {
    /// A watch with nothing seen.
    pub fn new() -> Self {
        Self::default()
    }

    /// What `message` says, if it is a probe (`None`: a business event, handle it); `now` is
    /// when it arrived.
    pub fn observe(&mut self, message: &InboxMessage, now: OffsetDateTime) -> Option<Seen> {
        let probe = probe(message)?;
        Some(self.observe_probe(&probe, now))
    }

    /// What `probe` says, arrived at `now`.
    pub fn observe_probe(&mut self, probe: &Probe, now: OffsetDateTime) -> Seen {
        let progress = self.relays.entry(probe.relay.clone()).or_default();
        let relay = probe.relay.clone();
        let n = probe.n;
        if n > progress.highest {
            let missing = n - progress.highest - 1;
            progress.gaps.extend(progress.highest + 1..n);
            if progress.gaps.len() > MAX_GAPS {
                let excess = progress.gaps.len() - MAX_GAPS;
                progress.gaps.drain(..excess);
            }
            progress.highest = n;
            return Seen::Next {
                relay,
                n,
                latency_seconds: probe.latency_seconds(now),
                missing,
            };
        }
        match progress.gaps.iter().position(|g| *g == n) {
            Some(i) => {
                progress.gaps.remove(i);
                Seen::Late {
                    relay,
                    n,
                    after: progress.highest,
                }
            }
            None => Seen::Again { relay, n },
        }
    }

    /// Probes of every relay skipped and not seen since.
    pub fn missing(&self) -> u64 {
        self.relays.values().map(|p| p.gaps.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(relay: &str, n: u64) -> Probe {
        Probe {
            relay: relay.into(),
            n,
            written_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_watch_tells_next_missing_late_and_again() {
        let mut w = ProbeWatch::new();
        let at = OffsetDateTime::UNIX_EPOCH + time::Duration::milliseconds(250);
        assert_eq!(
            w.observe_probe(&probe("r", 1), at),
            Seen::Next {
                relay: "r".into(),
                n: 1,
                latency_seconds: 0.25,
                missing: 0
            }
        );
        assert!(matches!(
            w.observe_probe(&probe("r", 4), at),
            Seen::Next { missing: 2, .. }
        ));
        assert_eq!(w.missing(), 2);
        assert_eq!(
            w.observe_probe(&probe("r", 3), at),
            Seen::Late {
                relay: "r".into(),
                n: 3,
                after: 4
            }
        );
        assert_eq!(w.missing(), 1);
        assert!(matches!(
            w.observe_probe(&probe("r", 3), at),
            Seen::Again { n: 3, .. }
        ));
        // Another relay's probes are their own sequence.
        assert!(matches!(
            w.observe_probe(&probe("other", 1), at),
            Seen::Next { missing: 0, .. }
        ));
    }

    #[test]
    fn only_probes_are_recognised() {
        let event = probe("r", 1).event();
        let message = InboxMessage {
            id: uuid::Uuid::new_v4(),
            event_type: event.event_type.clone(),
            aggregate_type: event.aggregate_type.clone(),
            aggregate_id: event.aggregate_id.clone(),
            aggregate_seq: None,
            headers: Vec::new(),
            payload: event.payload.clone(),
        };
        assert_eq!(super::probe(&message), Some(probe("r", 1)));
        let business = InboxMessage {
            aggregate_type: "Order".into(),
            ..message
        };
        assert_eq!(super::probe(&business), None);
        assert!(
            ProbeWatch::new()
                .observe(&business, OffsetDateTime::UNIX_EPOCH)
                .is_none()
        );
    }
}
