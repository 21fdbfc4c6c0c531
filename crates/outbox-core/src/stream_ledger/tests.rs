//! Unit tests of the ledger: the confirmation rule, ordering, spilled transactions, resets.

use super::*;
use std::time::Duration;

use crate::Ordering;
use crate::spill::SpilledTxn;

/// An event of aggregate `T`/`agg` as a change stream hands it to the ledger (position 0:
/// the ledger numbers it); also the change stream's tests' event.
pub(crate) fn event(agg: &str) -> Event {
    Event {
        id: uuid::Uuid::now_v7(),
        position: Position(0),
        aggregate_type: "T".into(),
        aggregate_id: agg.into(),
        event_type: "e".into(),
        payload: bytes::Bytes::new(),
        headers: vec![],
        created_at: OffsetDateTime::UNIX_EPOCH,
        attempts: 0,
    }
}

fn ev(agg: &str) -> (Event, ()) {
    (event(agg), ())
}

fn settle_delivered(l: &mut Ledger<()>, position: i64) -> Option<u64> {
    let e = l.take_in_flight(position).expect("in flight");
    l.finish(&e)
}

#[test]
fn the_slot_is_confirmed_only_over_a_fully_settled_prefix_of_transactions() {
    let now = OffsetDateTime::now_utc();
    let mut l = Ledger::<()>::new(100);
    assert_eq!(l.commit(vec![ev("a"), ev("b")], 200), None);
    assert_eq!(l.commit(vec![ev("c")], 300), None);
    assert_eq!(
        l.commit(vec![], 400),
        None,
        "an empty transaction waits behind others"
    );
    let batch = l.take(10, now, Ordering::PerAggregate);
    assert_eq!(
        batch.iter().map(|e| e.position.0).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    // The second transaction is settled first: nothing moves.
    assert_eq!(settle_delivered(&mut l, 3), None);
    assert_eq!(settle_delivered(&mut l, 1), None);
    // Event 2 is retried: the first transaction stays open, so does everything after it.
    let mut two = l.take_in_flight(2).expect("in flight");
    two.event.attempts += 1;
    two.not_before = Some(now + Duration::from_secs(60));
    l.requeue(two);
    assert_eq!(l.confirmed(), 100);
    assert!(l.take(10, now, Ordering::PerAggregate).is_empty());
    let later = now + Duration::from_secs(61);
    assert_eq!(l.take(10, later, Ordering::PerAggregate).len(), 1);
    assert_eq!(settle_delivered(&mut l, 2), Some(400));
    assert_eq!(l.open_transactions(), 0);
    assert_eq!(l.idle_confirm(450), Some(450));
    assert_eq!(l.idle_confirm(420), None);
}

#[test]
fn an_event_waiting_on_backoff_holds_its_aggregate_or_everything_with_total_order() {
    let now = OffsetDateTime::now_utc();
    let mut l = Ledger::<()>::new(0);
    l.commit(vec![ev("a"), ev("b"), ev("a"), ev("c")], 10);
    let first = l.take(1, now, Ordering::PerAggregate);
    let mut a1 = l.take_in_flight(first[0].position.0).expect("in flight");
    a1.not_before = Some(now + Duration::from_secs(5));
    a1.event.attempts = 1;
    l.requeue(a1);
    assert_eq!(l.selectable(10, now, Ordering::PerAggregate), vec![2, 4]);
    assert_eq!(l.selectable(10, now, Ordering::Total), Vec::<i64>::new());
    assert_eq!(l.selectable(10, now, Ordering::None), vec![2, 3, 4]);
    assert_eq!(l.retrying(), 1);
    assert_eq!(l.next_due(now), Some(now + Duration::from_secs(5)));
}

fn spilled(events: Vec<(Event, ())>) -> SpilledTxn<(Event, ())> {
    let settings = std::sync::Arc::new(crate::spill::SpillSettings {
        after_events: 3,
        ..Default::default()
    });
    let mut buffer = crate::spill::TxnBuffer::new(settings, None);
    for e in events {
        buffer.push(e).expect("push");
    }
    match buffer.take().expect("take") {
        crate::spill::Buffered::Spilled(s) => s,
        crate::spill::Buffered::Memory(_) => panic!("not spilled"),
    }
}

#[test]
fn a_spilled_transaction_loads_in_bounded_batches_and_confirms_only_once_all_settled() {
    let now = OffsetDateTime::now_utc();
    let mut l = Ledger::<()>::new(0);
    l.commit(vec![ev("a")], 10);
    let big: Vec<_> = (0..10).map(|i| ev(&format!("b{i}"))).collect();
    let ids: Vec<_> = big.iter().map(|(e, _)| e.id).collect();
    l.commit_spilled(spilled(big), 20);
    assert!(l.draining());
    assert_eq!(
        l.spilled(),
        Spilled {
            transactions: 1,
            events: 10
        }
    );
    let mut seen = Vec::new();
    while l.unsettled() > 0 || l.draining() {
        l.refill(4).expect("refill");
        assert!(l.unsettled() <= 4, "bounded: {}", l.unsettled());
        for e in l.take(2, now, Ordering::Total) {
            seen.push(e.id);
            settle_delivered(&mut l, e.position.0);
        }
        if l.draining() {
            assert_eq!(l.confirmed(), 10, "not confirmed while loading");
        }
    }
    assert_eq!(
        seen[1..],
        ids[..],
        "commit order, then the spilled one in order"
    );
    assert_eq!(l.confirmed(), 20);
    assert_eq!(l.open_transactions(), 0);
}

#[test]
fn transactions_committed_while_one_loads_wait_behind_it_in_commit_order() {
    let now = OffsetDateTime::now_utc();
    let mut l = Ledger::<()>::new(0);
    let batch =
        |n: usize, tag: &str| -> Vec<_> { (0..n).map(|i| ev(&format!("{tag}{i}"))).collect() };
    let ids = |events: &[(Event, ())]| events.iter().map(|(e, _)| e.id).collect::<Vec<_>>();
    let (a, b, c, d) = (batch(7, "a"), batch(2, "b"), batch(5, "c"), batch(1, "d"));
    let expected: Vec<_> = [ids(&a), ids(&b), ids(&c), ids(&d)].concat();
    l.commit_spilled(spilled(a), 10);
    assert_eq!(l.commit(b, 20), None);
    l.commit_spilled(spilled(c), 30);
    l.commit(d, 40);
    assert_eq!(l.unsettled(), 3, "the waiting events in memory count");
    let mut seen = Vec::new();
    while l.unsettled() > 0 || l.draining() {
        l.refill(4).expect("refill");
        for e in l.take(3, now, Ordering::Total) {
            seen.push(e.id);
            settle_delivered(&mut l, e.position.0);
        }
    }
    assert_eq!(seen, expected);
    assert_eq!(l.confirmed(), 40);
    assert_eq!(
        l.spilled(),
        Spilled {
            transactions: 2,
            events: 12
        }
    );
}

#[test]
fn a_reset_drops_a_spilled_transaction_being_loaded() {
    let mut l = Ledger::<()>::new(0);
    l.commit_spilled(spilled((0..5).map(|_| ev("a")).collect()), 10);
    l.refill(2).expect("refill");
    l.reset(0);
    assert!(!l.draining());
    assert_eq!(l.unsettled(), 0);
    assert_eq!(l.confirmed(), 0);
}

#[test]
fn a_reset_forgets_the_unconfirmed_tail_but_never_reuses_positions() {
    let now = OffsetDateTime::now_utc();
    let mut l = Ledger::<()>::new(0);
    l.commit(vec![ev("a"), ev("b")], 10);
    let _ = l.take(1, now, Ordering::None);
    l.reset(5);
    assert_eq!(l.unsettled(), 0);
    assert_eq!(l.confirmed(), 5);
    assert!(
        l.take_in_flight(1).is_none(),
        "a stale settlement finds nothing"
    );
    l.commit(vec![ev("a")], 10);
    assert_eq!(l.take(1, now, Ordering::None)[0].position, Position(3));
}
