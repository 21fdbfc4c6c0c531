//! Delivery positions: the `aggregate_seq` header that lets a consumer apply each aggregate's
//! events in order even when its broker redelivers out of order (a consumer crash, two
//! consumer instances on one durable, a retry).
//!
//! A polling source keeps, per aggregate, the highest position it ever handed out (its
//! *head*, in a table next to the outbox), reads the heads with each claim, and numbers the
//! claimed events of an aggregate `head + 1, head + 2, …` in batch order ([`assign`]). The
//! relay publishes an aggregate's events of a batch one wave at a time and stops at the first
//! that is not delivered, so the published positions are always a contiguous run. When the
//! batch settles, the head moves to the highest position that was *used*: delivered, or
//! dead-lettered (a dead letter may have reached the broker before its last attempt failed;
//! its position is never handed to another event). An event that is retried or released
//! leaves the head alone and gets the same position again next time (the same event, so a
//! consumer sees the same number twice, which is a duplicate). The head moves in the same
//! transaction that records the outcomes, so a crash cannot separate the two.
//!
//! A consumer that has applied position `n` of an aggregate applies `n + 1` next and holds
//! anything higher until the gap fills (`outbox-inbox` does this).

use std::collections::HashMap;

use crate::message::header;
use crate::source::{Outcome, Settlement};
use crate::{Event, Position};

/// The positions given to one claimed batch, kept until it settles.
#[derive(Debug, Default)]
pub struct AssignedPositions {
    /// Event position in the source → (index in `aggregates`, delivery position).
    by_event: HashMap<Position, (usize, i64)>,
    /// The aggregates of the batch, each once.
    aggregates: Vec<(String, String)>,
}

/// Numbers `events` (one batch, in source order) per aggregate from their heads:
/// `heads[i]` is the head of `events[i]`'s aggregate as read with the claim (0 when it has
/// none). Each event gets an [`AGGREGATE_SEQ`](header::AGGREGATE_SEQ) header.
///
/// # Panics
/// When `heads` and `events` differ in length (a bug in the calling source).
pub fn assign(events: &mut [Event], heads: &[i64]) -> AssignedPositions {
    assert_eq!(events.len(), heads.len(), "one head per event");
    let mut last: HashMap<(&str, &str), (usize, i64)> = HashMap::new();
    let mut by_event = HashMap::with_capacity(events.len());
    let mut aggregates = Vec::new();
    let mut numbered = Vec::with_capacity(events.len());
    for (event, head) in events.iter().zip(heads) {
        let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
        let slot = last.entry(key).or_insert_with(|| {
            aggregates.push((key.0.to_owned(), key.1.to_owned()));
            (aggregates.len() - 1, *head)
        });
        slot.1 += 1;
        by_event.insert(event.position, *slot);
        numbered.push(slot.1);
    }
    for (event, n) in events.iter_mut().zip(numbered) {
        event
            .headers
            .push((header::AGGREGATE_SEQ.to_owned(), n.to_string()));
    }
    AssignedPositions {
        by_event,
        aggregates,
    }
}

impl AssignedPositions {
    /// The new head of every aggregate whose head moves with `settlements`: the highest
    /// position among its delivered events and, when `dead_recorded`, its dead-lettered ones.
    /// Returned as (aggregate_type, aggregate_id, head).
    pub fn advanced(
        &self,
        settlements: &[Settlement],
        dead_recorded: bool,
    ) -> Vec<(String, String, i64)> {
        let mut highest: HashMap<usize, i64> = HashMap::new();
        for s in settlements {
            let used = match s.outcome {
                Outcome::Delivered => true,
                Outcome::DeadLetter { .. } => dead_recorded,
                Outcome::Retry { .. } | Outcome::Released => false,
            };
            if let (true, Some(&(agg, n))) = (used, self.by_event.get(&s.position)) {
                let h = highest.entry(agg).or_insert(n);
                *h = (*h).max(n);
            }
        }
        let mut out: Vec<_> = highest
            .into_iter()
            .map(|(agg, n)| {
                let (t, id) = &self.aggregates[agg];
                (t.clone(), id.clone(), n)
            })
            .collect();
        out.sort_unstable();
        out
    }
}

/// The `aggregate_seq` header of a message's headers, when present and a positive number.
pub fn parse(value: &str) -> Option<u64> {
    value.parse::<u64>().ok().filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(agg: &str, pos: i64) -> Event {
        Event {
            id: uuid::Uuid::from_u128(pos as u128),
            position: Position(pos),
            aggregate_type: "A".into(),
            aggregate_id: agg.into(),
            event_type: "e".into(),
            payload: bytes::Bytes::new(),
            headers: vec![],
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    fn seq_of(e: &Event) -> &str {
        &e.headers
            .iter()
            .find(|(n, _)| n == header::AGGREGATE_SEQ)
            .expect("numbered")
            .1
    }

    fn settle(pos: i64, outcome: Outcome) -> Settlement {
        Settlement {
            position: Position(pos),
            outcome,
        }
    }

    #[test]
    fn events_are_numbered_per_aggregate_from_its_head() {
        let mut batch = vec![ev("x", 1), ev("y", 2), ev("x", 3), ev("x", 4)];
        let assigned = assign(&mut batch, &[7, 0, 7, 7]);
        let seqs: Vec<&str> = batch.iter().map(seq_of).collect();
        assert_eq!(seqs, ["8", "1", "9", "10"]);
        let dead = Outcome::DeadLetter { reason: "r".into() };
        let retry = Outcome::Retry {
            not_before: time::OffsetDateTime::UNIX_EPOCH,
            error: "e".into(),
        };
        let settlements = [
            settle(1, Outcome::Delivered),
            settle(2, retry),
            settle(3, dead),
            settle(4, Outcome::Released),
        ];
        assert_eq!(
            assigned.advanced(&settlements, true),
            vec![("A".to_owned(), "x".to_owned(), 9)],
            "a dead letter uses its position; a retry or a release does not"
        );
        assert_eq!(
            assigned.advanced(&settlements, false),
            vec![("A".to_owned(), "x".to_owned(), 8)],
            "a dead letter that was not recorded does not move the head"
        );
    }

    #[test]
    fn only_positive_numbers_parse() {
        assert_eq!(parse("12"), Some(12));
        assert_eq!(parse("0"), None);
        assert_eq!(parse("-1"), None);
        assert_eq!(parse("x"), None);
    }
}
