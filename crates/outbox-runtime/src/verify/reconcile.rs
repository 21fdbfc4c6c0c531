//! The comparison itself: the table's delivered events against the messages read back. Pure
//! (no I/O), so every rule is tested here without a broker.
//!
//! Rules, per message id:
//! - delivered per the table and not read back: **lost**, unless the destination no longer
//!   holds what was sent there before the event (its oldest retained message is younger):
//!   then **expired at the destination**;
//! - read back and not delivered per the table: found in the table but outside the window
//!   (ignored), not yet marked delivered (in flight), dead-lettered after reaching the
//!   broker (reported), deleted from the table (rows deleted on delivery, or older than the
//!   retention window), or else a **phantom**;
//! - read back more than once: **duplicates** (copies beyond the first);
//! - per lane and aggregate, the first copy of each event in lane order: `aggregate_seq`
//!   must increase; where a message has none, the table's commit order must hold. A later
//!   event ahead of an earlier one is an **order break**, reported with the earlier event
//!   (the one that arrived late).

use std::collections::{HashMap, HashSet};

use outbox_core::verify::{Basis, Ledger, LedgerEvent, ReadOutcome, RowState, StoredRow, Window};
use time::OffsetDateTime;
use uuid::Uuid;

use super::report::{OrderBreak, Tally};

/// What the reconciler needs besides the two readings.
pub(crate) struct Context<'a> {
    /// The window.
    pub(crate) window: Window,
    /// Rows delivered before this time may have been deleted from the table by retention.
    pub(crate) table_horizon: Option<OffsetDateTime>,
    /// Whether the relay promises per-aggregate order (`relay.ordering` is not `none`).
    pub(crate) order_promised: bool,
    /// The destination an event was sent to.
    pub(crate) destination_of: &'a dyn Fn(&LedgerEvent) -> String,
    /// Ids listed per finding.
    pub(crate) max_ids: usize,
}

/// The ids read back that the window's delivered events do not explain: the table is asked
/// about these.
pub(crate) fn unexplained_ids(ledger: &Ledger, read: &ReadOutcome) -> Vec<Uuid> {
    let expected: HashSet<Uuid> = ledger.delivered.iter().map(|e| e.id).collect();
    let mut seen = HashSet::new();
    read.messages
        .iter()
        .filter_map(|m| m.identity.id)
        .filter(|id| !expected.contains(id) && seen.insert(*id))
        .collect()
}

/// Why a message read back is not one of the window's delivered events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unexpected {
    OutsideWindow,
    InFlight,
    Dead,
    DeletedFromTable,
    Phantom,
}

/// Compares; `known` holds the table's answer about [`unexplained_ids`].
pub(crate) fn reconcile(
    ledger: &Ledger,
    read: &ReadOutcome,
    known: &HashMap<Uuid, StoredRow>,
    cx: &Context<'_>,
) -> Tally {
    let mut tally = Tally::new(cx.max_ids);
    let expected: HashMap<Uuid, &LedgerEvent> =
        ledger.delivered.iter().map(|e| (e.id, e)).collect();

    // Copies per id, and the earliest broker time of each unexplained id.
    let mut copies: HashMap<Uuid, u32> = HashMap::with_capacity(read.messages.len());
    let mut first_stored: HashMap<Uuid, Option<OffsetDateTime>> = HashMap::new();
    for m in &read.messages {
        let Some(id) = m.identity.id else {
            tally.without_id += 1;
            continue;
        };
        *copies.entry(id).or_insert(0) += 1;
        if !expected.contains_key(&id) {
            let at = first_stored.entry(id).or_insert(m.stored_at);
            if let (Some(a), Some(b)) = (*at, m.stored_at) {
                *at = Some(a.min(b));
            }
        }
    }

    // Delivered per the table: found, lost or expired.
    for event in &ledger.delivered {
        if copies.contains_key(&event.id) {
            tally.matched += 1;
            continue;
        }
        let sent_at = event.delivered_at.unwrap_or(event.created_at);
        let destination = (cx.destination_of)(event);
        let expired = read.trimmed.iter().any(|t| {
            t.destination.as_deref().is_none_or(|d| d == destination) && sent_at < t.retained_from
        });
        if expired {
            tally.expired_at_destination.add(event.id);
        } else {
            tally.lost.add(event.id);
        }
    }

    // Read back but not delivered in the window.
    let mut classes: HashMap<Uuid, Unexpected> = HashMap::with_capacity(first_stored.len());
    let mut ids: Vec<(Uuid, Option<OffsetDateTime>)> = first_stored.into_iter().collect();
    // Stable report order: as the broker stored them, then by id.
    ids.sort_by_key(|a| (a.1, a.0));
    for (id, stored_at) in ids {
        let class = match known.get(&id) {
            Some(row) if row.state == RowState::Dead => Unexpected::Dead,
            Some(row) if row.created_at < cx.window.since || row.created_at >= cx.window.until => {
                Unexpected::OutsideWindow
            }
            Some(_) => Unexpected::InFlight,
            None if stored_at.is_some_and(|t| t < cx.window.since) => Unexpected::OutsideWindow,
            None if ledger.basis == Basis::Deleted => Unexpected::DeletedFromTable,
            None if cx
                .table_horizon
                .is_some_and(|h| stored_at.is_some_and(|t| t < h)) =>
            {
                Unexpected::DeletedFromTable
            }
            None => Unexpected::Phantom,
        };
        match class {
            Unexpected::OutsideWindow => tally.outside_window += 1,
            Unexpected::InFlight => tally.in_flight += 1,
            Unexpected::Dead => tally.dead_at_destination.add(id),
            Unexpected::DeletedFromTable => tally.deleted_from_table.add(id),
            Unexpected::Phantom => tally.phantom.add(id),
        }
        classes.insert(id, class);
    }

    // Duplicates: copies beyond the first, of the events the window is about.
    let mut duplicated: Vec<(Uuid, u32)> = copies
        .iter()
        .filter(|(id, n)| **n > 1 && classes.get(id) != Some(&Unexpected::OutsideWindow))
        .map(|(id, n)| (*id, *n))
        .collect();
    duplicated.sort_unstable();
    for (id, n) in duplicated {
        tally.duplicates.add_many(id, u64::from(n - 1));
    }

    if cx.order_promised {
        order_breaks(ledger, read, known, &expected, &mut tally);
    }
    tally
}

/// The last event seen of one aggregate in one lane, by one ordering key.
#[derive(Clone, Copy)]
struct Last {
    key: i64,
    id: Uuid,
}

/// Per lane and aggregate (type, id): the last event by `aggregate_seq` and the last by
/// table position.
type LastSeen = HashMap<(u32, String, String), (Option<Last>, Option<Last>)>;

fn order_breaks(
    ledger: &Ledger,
    read: &ReadOutcome,
    known: &HashMap<Uuid, StoredRow>,
    expected: &HashMap<Uuid, &LedgerEvent>,
    tally: &mut Tally,
) {
    let _ = ledger;
    let mut first_copy: HashSet<(u32, Uuid)> = HashSet::with_capacity(read.messages.len());
    let mut last: LastSeen = HashMap::new();
    let lane_name = |lane: u32| {
        read.lanes
            .get(lane as usize)
            .map_or_else(|| format!("lane {lane}"), |l| l.name.clone())
    };
    for m in &read.messages {
        let Some(id) = m.identity.id else { continue };
        if !first_copy.insert((m.lane, id)) {
            continue;
        }
        let from_table = expected.get(&id);
        let aggregate = match (&m.identity.aggregate_type, &m.identity.aggregate_id) {
            (Some(t), Some(a)) => (t.clone(), a.clone()),
            _ => match from_table {
                Some(e) => (e.aggregate_type.clone(), e.aggregate_id.clone()),
                None => continue,
            },
        };
        let position = from_table
            .map(|e| e.position)
            .or_else(|| known.get(&id).map(|r| r.position));
        let (by_seq, by_position) = last
            .entry((m.lane, aggregate.0.clone(), aggregate.1.clone()))
            .or_insert((None, None));
        let (slot, key, by) = match (m.identity.aggregate_seq, position) {
            (Some(seq), _) => (
                by_seq,
                i64::try_from(seq).unwrap_or(i64::MAX),
                "aggregate_seq",
            ),
            (None, Some(p)) => (by_position, p, "table order"),
            (None, None) => continue,
        };
        match *slot {
            Some(prev) if key <= prev.key => {
                tally.order_breaks.add(id);
                if tally.breaks.len() < tally.max_ids {
                    tally.breaks.push(OrderBreak {
                        id,
                        after: prev.id,
                        aggregate_type: aggregate.0,
                        aggregate_id: aggregate.1,
                        lane: lane_name(m.lane),
                        by,
                        position: key,
                        after_position: prev.key,
                    });
                }
            }
            _ => *slot = Some(Last { key, id }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::verify::{Identity, Lane, ReadMessage, Trimmed};
    use time::Duration;

    fn t(s: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::seconds(1_000_000 + s)
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn event(n: u128, aggregate: &str, position: i64) -> LedgerEvent {
        LedgerEvent {
            id: id(n),
            aggregate_type: "Order".into(),
            aggregate_id: aggregate.into(),
            event_type: "e".into(),
            position,
            created_at: t(position),
            delivered_at: Some(t(position)),
        }
    }

    fn message(n: u128, aggregate: &str, seq: Option<u64>, at: i64) -> ReadMessage {
        ReadMessage {
            identity: Identity {
                id: Some(id(n)),
                aggregate_type: Some("Order".into()),
                aggregate_id: Some(aggregate.into()),
                aggregate_seq: seq,
            },
            lane: 0,
            offset: 0,
            stored_at: Some(t(at)),
        }
    }

    fn ledger(events: Vec<LedgerEvent>) -> Ledger {
        Ledger {
            basis: Basis::Marked,
            delivered: events,
            undelivered: 0,
            dead: 0,
            notes: vec![],
        }
    }

    fn read(messages: Vec<ReadMessage>) -> ReadOutcome {
        ReadOutcome {
            lanes: vec![Lane {
                name: "stream".into(),
                messages: messages.len() as u64,
            }],
            messages,
            ..ReadOutcome::default()
        }
    }

    fn run(ledger: &Ledger, read: &ReadOutcome, known: &[StoredRow]) -> Tally {
        let known = known.iter().map(|r| (r.id, r.clone())).collect();
        let destination = |_: &LedgerEvent| "outbox.event.Order".to_owned();
        let cx = Context {
            window: Window {
                since: t(0),
                until: t(1000),
            },
            table_horizon: None,
            order_promised: true,
            destination_of: &destination,
            max_ids: 10,
        };
        reconcile(ledger, read, &known, &cx)
    }

    #[test]
    fn a_clean_run_finds_nothing() {
        let l = ledger(vec![event(1, "a", 1), event(2, "a", 2), event(3, "b", 3)]);
        let r = read(vec![
            message(1, "a", Some(1), 1),
            message(3, "b", Some(1), 3),
            message(2, "a", Some(2), 2),
        ]);
        let tally = run(&l, &r, &[]);
        assert_eq!(tally.matched, 3);
        assert!(tally.is_clean(), "{tally:?}");
    }

    #[test]
    fn lost_phantom_duplicate_and_order_break_are_each_named() {
        let l = ledger(vec![
            event(1, "a", 1),
            event(2, "a", 2),
            event(3, "b", 3),
            event(4, "b", 4),
        ]);
        let r = read(vec![
            message(1, "a", Some(1), 1),
            message(1, "a", Some(1), 1),
            message(4, "b", Some(2), 4),
            message(3, "b", Some(1), 4),
            message(99, "c", Some(1), 5),
        ]);
        let tally = run(&l, &r, &[]);
        assert_eq!(tally.lost.ids, vec![id(2)]);
        assert_eq!(tally.phantom.ids, vec![id(99)]);
        assert_eq!(
            (tally.duplicates.count, tally.duplicates.ids.clone()),
            (1, vec![id(1)])
        );
        assert_eq!(tally.order_breaks.ids, vec![id(3)]);
        assert_eq!(tally.breaks[0].after, id(4));
    }

    #[test]
    fn without_aggregate_seq_the_table_order_decides() {
        let l = ledger(vec![event(1, "a", 1), event(2, "a", 2)]);
        let r = read(vec![message(2, "a", None, 2), message(1, "a", None, 2)]);
        let tally = run(&l, &r, &[]);
        assert_eq!(tally.order_breaks.ids, vec![id(1)]);
        assert_eq!(tally.breaks[0].by, "table order");
    }

    #[test]
    fn a_redelivery_after_later_events_is_a_duplicate_not_an_order_break() {
        let l = ledger(vec![event(1, "a", 1), event(2, "a", 2)]);
        let r = read(vec![
            message(1, "a", Some(1), 1),
            message(2, "a", Some(2), 2),
            message(1, "a", Some(1), 3),
        ]);
        let tally = run(&l, &r, &[]);
        assert_eq!(tally.duplicates.count, 1);
        assert_eq!(tally.order_breaks.count, 0);
        assert!(tally.is_clean());
    }

    #[test]
    fn ids_the_table_has_outside_the_window_or_in_flight_are_not_phantoms() {
        let l = ledger(vec![event(1, "a", 1)]);
        let r = read(vec![
            message(7, "x", None, 1),
            message(1, "a", None, 1),
            message(8, "y", None, 2),
            message(9, "z", None, 3),
        ]);
        let row = |n: u128, state: RowState, created: i64| StoredRow {
            id: id(n),
            state,
            position: 0,
            created_at: t(created),
        };
        let tally = run(
            &l,
            &r,
            &[
                row(7, RowState::Delivered, -10),
                row(8, RowState::Undelivered, 5),
                row(9, RowState::Dead, 5),
            ],
        );
        assert_eq!(tally.outside_window, 1);
        assert_eq!(tally.in_flight, 1);
        assert_eq!(tally.dead_at_destination.ids, vec![id(9)]);
        assert!(tally.is_clean());
    }

    #[test]
    fn what_either_side_deleted_is_counted_apart_from_lost_and_phantom() {
        let l = ledger(vec![event(1, "a", 1), event(2, "a", 20)]);
        let mut r = read(vec![message(2, "a", None, 20), message(50, "q", None, 5)]);
        r.trimmed.push(Trimmed {
            destination: Some("outbox.event.Order".into()),
            retained_from: t(10),
            detail: "first entry".into(),
        });
        let known = HashMap::new();
        let destination = |_: &LedgerEvent| "outbox.event.Order".to_owned();
        let cx = Context {
            window: Window {
                since: t(0),
                until: t(1000),
            },
            table_horizon: Some(t(8)),
            order_promised: true,
            destination_of: &destination,
            max_ids: 10,
        };
        let tally = reconcile(&l, &r, &known, &cx);
        assert_eq!(tally.expired_at_destination.ids, vec![id(1)]);
        assert_eq!(tally.deleted_from_table.ids, vec![id(50)]);
        assert!(tally.is_clean());
    }

    #[test]
    fn rows_deleted_on_delivery_are_not_phantoms() {
        let mut l = ledger(vec![]);
        l.basis = Basis::Deleted;
        let r = read(vec![message(5, "a", Some(1), 3)]);
        let tally = run(&l, &r, &[]);
        assert_eq!(tally.deleted_from_table.count, 1);
        assert_eq!(tally.phantom.count, 0);
    }

    #[test]
    fn id_lists_are_capped_but_counts_are_not() {
        let l = ledger((1..=30).map(|n| event(n, "a", n as i64)).collect());
        let tally = run(&l, &read(vec![]), &[]);
        assert_eq!(tally.lost.count, 30);
        assert_eq!(tally.lost.ids.len(), 10);
    }
}
