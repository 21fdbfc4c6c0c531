//! What the canary knows about its probes, and what a read of the destination tells about
//! them: arrival (with its latency), a break of order, a duplicate, a probe overdue. No I/O:
//! the loop in `mod.rs` feeds it.

use std::collections::VecDeque;
use std::time::Duration;

use outbox_core::verify::{LedgerEvent, ReadMessage};
use time::OffsetDateTime;
use uuid::Uuid;

/// Probes remembered after they arrived or were counted lost (to recognise late arrivals,
/// duplicates and breaks of order); the oldest settled ones are forgotten first.
const REMEMBERED: usize = 1_024;

/// How far before the oldest probe in flight the destination is read: a broker whose clock
/// is a little behind the relay's stores the probe "before" its commit.
pub(crate) const READ_MARGIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    InFlight,
    Arrived,
    Lost,
}

#[derive(Debug, Clone)]
struct Issued {
    id: Uuid,
    n: u64,
    committed_at: OffsetDateTime,
    state: State,
}

/// What one read showed about one probe.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Observation {
    /// Probe `n` reached the destination `latency_seconds` after its commit.
    Arrived {
        id: Uuid,
        n: u64,
        latency_seconds: f64,
    },
    /// Probe `n` arrived after probe `after`, which was committed later.
    OutOfOrder { id: Uuid, n: u64, after: u64 },
    /// Probe `n`, counted lost, arrived after all.
    ArrivedAfterLost { id: Uuid, n: u64 },
}

/// The probes of one destination.
#[derive(Debug)]
pub(crate) struct Tracker {
    relay: String,
    issued: VecDeque<Issued>,
    highest_arrived: Option<u64>,
}

impl Tracker {
    /// A tracker for the probes of relay `relay` (their aggregate id).
    pub(crate) fn new(relay: impl Into<String>) -> Self {
        Self {
            relay: relay.into(),
            issued: VecDeque::new(),
            highest_arrived: None,
        }
    }

    /// Probe `n`, with event id `id`, was committed at `committed_at`.
    pub(crate) fn issued(&mut self, id: Uuid, n: u64, committed_at: OffsetDateTime) {
        self.issued.push_back(Issued {
            id,
            n,
            committed_at,
            state: State::InFlight,
        });
        while self.issued.len() > REMEMBERED {
            match self.issued.iter().position(|p| p.state != State::InFlight) {
                Some(i) => {
                    self.issued.remove(i);
                }
                None => break,
            }
        }
    }

    /// Probes written and not seen yet (nor counted lost).
    pub(crate) fn in_flight(&self) -> usize {
        self.issued
            .iter()
            .filter(|p| p.state == State::InFlight)
            .count()
    }

    /// Where a read must start to see every probe in flight; `None` when none is.
    pub(crate) fn read_from(&self) -> Option<OffsetDateTime> {
        self.issued
            .iter()
            .filter(|p| p.state == State::InFlight)
            .map(|p| p.committed_at)
            .min()
            .map(|t| t - READ_MARGIN)
    }

    /// The probes in flight as the table holds them (what a read-back is told to expect:
    /// a destination template with placeholders is rendered from them).
    pub(crate) fn expected(&self) -> Vec<LedgerEvent> {
        self.issued
            .iter()
            .filter(|p| p.state == State::InFlight)
            .map(|p| LedgerEvent {
                id: p.id,
                aggregate_type: outbox_core::canary::AGGREGATE_TYPE.to_owned(),
                aggregate_id: self.relay.clone(),
                event_type: outbox_core::canary::EVENT_TYPE.to_owned(),
                position: i64::try_from(p.n).unwrap_or(i64::MAX),
                created_at: p.committed_at,
                delivered_at: None,
            })
            .collect()
    }

    /// What `messages` (a read, lane by lane, each lane in its order) show about the probes;
    /// `now` is when the read ended (the arrival time of a message without a stored time
    /// later than its commit). Messages of other events and repeated probes are passed over.
    pub(crate) fn observe(
        &mut self,
        messages: &[ReadMessage],
        now: OffsetDateTime,
    ) -> Vec<Observation> {
        let mut out = Vec::new();
        for message in messages {
            let Some(id) = message.identity.id else {
                continue;
            };
            let Some(probe) = self.issued.iter_mut().find(|p| p.id == id) else {
                continue;
            };
            let n = probe.n;
            match probe.state {
                State::Arrived => continue,
                State::InFlight => {
                    // The broker's stored time when it is after the commit; otherwise it
                    // is not an arrival time (the file sink gives the event's `created_at`)
                    // or the clocks disagree, and the read that found the probe stands in.
                    let seen = message
                        .stored_at
                        .filter(|t| *t > probe.committed_at)
                        .unwrap_or(now);
                    out.push(Observation::Arrived {
                        id,
                        n,
                        latency_seconds: (seen - probe.committed_at).as_seconds_f64().max(0.0),
                    });
                }
                State::Lost => out.push(Observation::ArrivedAfterLost { id, n }),
            }
            probe.state = State::Arrived;
            match self.highest_arrived {
                Some(after) if after > n => out.push(Observation::OutOfOrder { id, n, after }),
                _ => self.highest_arrived = Some(n),
            }
        }
        out
    }

    /// Probes in flight committed more than `lost_after` before `now`: (id, n).
    pub(crate) fn overdue(&self, now: OffsetDateTime, lost_after: Duration) -> Vec<(Uuid, u64)> {
        self.issued
            .iter()
            .filter(|p| {
                p.state == State::InFlight && (now - p.committed_at).unsigned_abs() >= lost_after
            })
            .map(|p| (p.id, p.n))
            .collect()
    }

    /// Counts probe `id` lost: it is no longer waited for.
    pub(crate) fn lost(&mut self, id: Uuid) {
        if let Some(p) = self.issued.iter_mut().find(|p| p.id == id) {
            p.state = State::Lost;
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::verify::Identity;

    use super::*;

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_795_842_000 + seconds)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    fn message(id: Uuid, stored_at: Option<OffsetDateTime>) -> ReadMessage {
        ReadMessage {
            identity: Identity {
                id: Some(id),
                ..Identity::default()
            },
            lane: 0,
            offset: 0,
            stored_at,
        }
    }

    fn ids(count: usize) -> Vec<Uuid> {
        (0..count).map(|_| Uuid::new_v4()).collect()
    }

    #[test]
    fn an_arrival_carries_its_latency_from_the_brokers_time_or_the_read() {
        let id = ids(2);
        let mut t = Tracker::new("r");
        t.issued(id[0], 1, at(0));
        t.issued(id[1], 2, at(10));
        assert_eq!(t.in_flight(), 2);
        assert_eq!(t.read_from(), Some(at(0) - READ_MARGIN));
        let got = t.observe(&[message(id[0], Some(at(2)))], at(30));
        assert_eq!(
            got,
            vec![Observation::Arrived {
                id: id[0],
                n: 1,
                latency_seconds: 2.0
            }]
        );
        let got = t.observe(&[message(id[0], None), message(id[1], Some(at(9)))], at(13));
        assert_eq!(
            got,
            vec![Observation::Arrived {
                id: id[1],
                n: 2,
                latency_seconds: 3.0
            }],
            "the repeat of probe 1 is passed over; a stored time before the commit is not an arrival"
        );
        assert_eq!(t.in_flight(), 0);
        assert_eq!(t.read_from(), None);
    }

    #[test]
    fn a_probe_arriving_after_a_later_one_is_an_order_break() {
        let id = ids(3);
        let mut t = Tracker::new("r");
        for (i, id) in id.iter().enumerate() {
            t.issued(*id, i as u64 + 1, at(i as i64));
        }
        // Probe 3 shows up first, then 1 and 2 in a later read.
        let first = t.observe(&[message(id[2], None)], at(5));
        assert!(matches!(first[..], [Observation::Arrived { n: 3, .. }]));
        let second = t.observe(&[message(id[0], None), message(id[1], None)], at(6));
        let breaks: Vec<(u64, u64)> = second
            .iter()
            .filter_map(|o| match o {
                Observation::OutOfOrder { n, after, .. } => Some((*n, *after)),
                _ => None,
            })
            .collect();
        assert_eq!(breaks, vec![(1, 3), (2, 3)]);
    }

    #[test]
    fn in_order_arrivals_in_one_read_are_no_break() {
        let id = ids(3);
        let mut t = Tracker::new("r");
        for (i, id) in id.iter().enumerate() {
            t.issued(*id, i as u64 + 1, at(i as i64));
        }
        let got = t.observe(
            &[
                message(id[0], None),
                message(Uuid::new_v4(), None),
                message(id[1], None),
                message(id[2], None),
            ],
            at(9),
        );
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|o| matches!(o, Observation::Arrived { .. })));
    }

    #[test]
    fn overdue_probes_are_lost_and_a_late_arrival_is_told_apart() {
        let id = ids(2);
        let mut t = Tracker::new("r");
        t.issued(id[0], 1, at(0));
        t.issued(id[1], 2, at(50));
        let lost_after = Duration::from_secs(60);
        assert!(t.overdue(at(59), lost_after).is_empty());
        assert_eq!(t.overdue(at(61), lost_after), vec![(id[0], 1)]);
        t.lost(id[0]);
        assert_eq!(t.in_flight(), 1);
        assert_eq!(t.read_from(), Some(at(50) - READ_MARGIN));
        let got = t.observe(&[message(id[0], None)], at(70));
        assert_eq!(got, vec![Observation::ArrivedAfterLost { id: id[0], n: 1 }]);
        assert_eq!(t.expected().len(), 1);
        assert_eq!(t.expected()[0].aggregate_id, "r");
    }

    #[test]
    fn memory_is_bounded_by_forgetting_settled_probes_first() {
        let mut t = Tracker::new("r");
        let first = Uuid::new_v4();
        t.issued(first, 1, at(0));
        for n in 2..=(REMEMBERED as u64 + 10) {
            let id = Uuid::new_v4();
            t.issued(id, n, at(n as i64));
            t.observe(&[message(id, None)], at(n as i64));
        }
        assert!(t.issued.len() <= REMEMBERED);
        assert_eq!(t.in_flight(), 1, "the probe still in flight is kept");
        assert_eq!(t.overdue(at(100_000), Duration::from_secs(1))[0].0, first);
    }
}
