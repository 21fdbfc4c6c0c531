//! Unit tests of the shared change-stream machinery: settling, dead-letter sorting, the claim.

use time::OffsetDateTime;
use uuid::Uuid;

use super::{ChangeStream, StreamClaim, StreamMeta};
use crate::source::{Outcome, Settlement};
use crate::{DeadLetterPolicy, Event, Ordering, Position};

/// Whether an event is a put-back dead letter.
#[derive(Debug, Clone, Copy)]
struct PutBack(bool);

impl StreamMeta for PutBack {
    fn put_back(&self) -> bool {
        self.0
    }
}

fn ev(agg: &str, put_back: bool) -> (Event, PutBack) {
    (crate::stream_ledger::tests::event(agg), PutBack(put_back))
}

fn settled(position: i64, outcome: Outcome) -> Settlement {
    Settlement {
        position: Position(position),
        outcome,
    }
}

fn stream(policy: DeadLetterPolicy) -> ChangeStream<PutBack> {
    let mut cs = ChangeStream::new(Ordering::PerAggregate, policy);
    cs.ledger.reset(100);
    cs
}

#[test]
fn settling_confirms_delivered_and_dead_events_and_queues_retries_again() {
    let now = OffsetDateTime::now_utc();
    let mut cs = stream(DeadLetterPolicy::HoldAggregate);
    cs.ledger.commit(vec![ev("a", true), ev("b", false)], 200);
    cs.ledger.commit(vec![ev("c", false)], 300);
    let ids: Vec<Uuid> = cs
        .ledger
        .take(10, now, cs.ordering)
        .iter()
        .map(|e| e.id)
        .collect();
    let batch = [
        settled(1, Outcome::Delivered),
        settled(
            2,
            Outcome::DeadLetter {
                reason: "bad".into(),
            },
        ),
        settled(
            3,
            Outcome::Retry {
                not_before: now,
                error: "down".into(),
            },
        ),
    ];
    let dead = cs.dead_letters(&batch);
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].0.event.id, dead[0].1), (ids[1], 1));
    assert_eq!(
        cs.apply(&batch),
        vec![ids[0]],
        "the delivered put-back event"
    );
    assert_eq!(
        cs.ledger.confirmed(),
        200,
        "the retried event holds its transaction"
    );
    assert!(cs.dead.contains(&("T".to_owned(), "b".to_owned())));
    let again = cs.ledger.queued_at(3).expect("queued again");
    assert_eq!(again.event.attempts, 1);
}

#[test]
fn events_behind_a_dead_letter_are_dropped_when_dead_and_parked_when_held() {
    let mut cs = stream(DeadLetterPolicy::HoldAggregate);
    cs.ledger
        .commit(vec![ev("a", false), ev("a", false), ev("b", false)], 200);
    let dead_id = cs.ledger.queued_at(1).expect("queued").event.id;
    cs.dead.insert(("T".to_owned(), "a".to_owned()));
    let groups = cs.suspect_groups();
    assert_eq!(groups, vec![(("T".to_owned(), "a".to_owned()), vec![1, 2])]);
    let (key, positions) = groups.into_iter().next().expect("one group");
    let park = cs.behind_dead(&key, positions, &[dead_id]);
    assert!(cs.ledger.queued_at(1).is_none(), "already dead: dropped");
    assert_eq!(park.len(), 1);
    assert!(park[0].2.contains(&dead_id.to_string()), "{}", park[0].2);
    cs.settle_parked(&key, &park, |_| true);
    assert!(cs.ledger.queued_at(2).is_none(), "parked");
    assert_eq!(
        cs.ledger.confirmed(),
        100,
        "event b still holds the transaction"
    );
}

#[test]
fn without_hold_the_events_of_a_dead_aggregate_go_checked() {
    let mut cs = stream(DeadLetterPolicy::Skip);
    cs.ledger.commit(vec![ev("a", false)], 200);
    let key = ("T".to_owned(), "a".to_owned());
    cs.dead.insert(key.clone());
    let park = cs.behind_dead(&key, vec![1], &[Uuid::now_v7()]);
    assert!(park.is_empty());
    assert!(cs.ledger.queued_at(1).is_some_and(|e| e.checked));
    assert!(cs.suspect_groups().is_empty());
}

#[test]
fn a_standby_says_so_once_and_tries_again_after_the_retry_interval() {
    let mut claim = StreamClaim::default();
    assert!(claim.due());
    assert!(!claim.due(), "the next try is a retry interval away");
    assert!(claim.stand_by());
    assert!(!claim.stand_by(), "said once");
    assert!(claim.took(), "took over after standing by");
    assert!(!claim.took());
    claim.retry_now();
    assert!(claim.due());
}
