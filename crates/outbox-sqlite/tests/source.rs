//! The polling source's contract, driven directly with a moved clock: what `fetch` returns,
//! what `settle` records, and the relay lease.

mod common;

use std::time::Duration;

use common::{TestDb, n_of};
use outbox_core::{DeadLetterPolicy, Event, Ordering, Outcome, Settlement, Source};
use outbox_sqlite::{OnDelivered, SqliteInspector, SqlitePollSource};
use time::OffsetDateTime;

fn source(db: &TestDb, dead_letter: DeadLetterPolicy) -> SqlitePollSource {
    SqlitePollSource::new(
        db.pool.clone(),
        &db.config,
        Ordering::PerAggregate,
        dead_letter,
    )
}

fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_900_000_000).expect("valid time")
}

fn micros(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000).expect("in range")
}

fn keys(events: &[Event]) -> Vec<(String, u64)> {
    events
        .iter()
        .map(|e| (e.aggregate_id.clone(), n_of(e)))
        .collect()
}

fn settle_all(events: &[Event], outcome: impl Fn(&Event) -> Outcome) -> Vec<Settlement> {
    events
        .iter()
        .map(|e| Settlement {
            position: e.position,
            outcome: outcome(e),
        })
        .collect()
}

#[tokio::test]
async fn a_transient_failure_schedules_the_next_attempt_and_holds_its_aggregate() {
    let db = TestDb::new().await;
    db.commit_events(&[("o_1", 1), ("o_1", 2), ("o_2", 1)])
        .await;
    let mut s = source(&db, DeadLetterPolicy::HoldAggregate);

    let batch = s.fetch(10, t0()).await.expect("fetch").events;
    assert_eq!(
        keys(&batch),
        vec![("o_1".into(), 1), ("o_1".into(), 2), ("o_2".into(), 1)]
    );
    let retry_at = t0() + Duration::from_secs(10);
    let settlements = vec![
        Settlement {
            position: batch[0].position,
            outcome: Outcome::Retry {
                not_before: retry_at,
                error: "broker busy".into(),
            },
        },
        Settlement {
            position: batch[1].position,
            outcome: Outcome::Released,
        },
        Settlement {
            position: batch[2].position,
            outcome: Outcome::Delivered,
        },
    ];
    s.settle(&settlements, t0()).await.expect("settle");

    let (state, attempts, next, error) = db.row(batch[0].position.0).await;
    assert_eq!(
        (state.as_str(), attempts, next, error.as_deref()),
        ("pending", 1, micros(retry_at), Some("broker busy"))
    );
    assert_eq!(
        db.row(batch[1].position.0).await.1,
        0,
        "released is untouched"
    );
    assert_eq!(db.row(batch[2].position.0).await.0, "delivered");

    // During the backoff, neither o_1 event comes back: the second waits behind the first.
    let during = s
        .fetch(10, retry_at - Duration::from_millis(1))
        .await
        .expect("fetch");
    assert!(during.events.is_empty(), "{:?}", keys(&during.events));
    let after = s.fetch(10, retry_at).await.expect("fetch").events;
    assert_eq!(keys(&after), vec![("o_1".into(), 1), ("o_1".into(), 2)]);
    assert_eq!(after[0].attempts, 1);
}

#[tokio::test]
async fn a_dead_letter_holds_its_aggregate_unless_the_policy_skips_it() {
    let db = TestDb::new().await;
    db.commit_events(&[("o_1", 1), ("o_1", 2), ("o_2", 1)])
        .await;
    let mut hold = source(&db, DeadLetterPolicy::HoldAggregate);
    let batch = hold.fetch(10, t0()).await.expect("fetch").events;
    let settlements = settle_all(&batch, |e| match (e.aggregate_id.as_str(), n_of(e)) {
        ("o_1", 1) => Outcome::DeadLetter {
            reason: "poison".into(),
        },
        ("o_1", _) => Outcome::Released,
        _ => Outcome::Delivered,
    });
    hold.settle(&settlements, t0()).await.expect("settle");
    let (state, attempts, _, error) = db.row(batch[0].position.0).await;
    assert_eq!(
        (state.as_str(), attempts, error.as_deref()),
        ("dead", 1, Some("poison"))
    );

    let later = t0() + Duration::from_secs(3600);
    assert!(
        hold.fetch(10, later)
            .await
            .expect("fetch")
            .events
            .is_empty()
    );
    hold.release_lease().await.expect("release");

    let mut skip = source(&db, DeadLetterPolicy::Skip);
    let after = skip.fetch(10, later).await.expect("fetch").events;
    assert_eq!(keys(&after), vec![("o_1".into(), 2)]);
}

#[tokio::test]
async fn without_ordering_a_retrying_event_holds_nothing_back() {
    let db = TestDb::new().await;
    db.commit_events(&[("o_1", 1), ("o_1", 2)]).await;
    let mut s = SqlitePollSource::new(
        db.pool.clone(),
        &db.config,
        Ordering::None,
        DeadLetterPolicy::HoldAggregate,
    );
    let batch = s.fetch(10, t0()).await.expect("fetch").events;
    let settlements = settle_all(&batch, |e| match n_of(e) {
        1 => Outcome::Retry {
            not_before: t0() + Duration::from_secs(60),
            error: "busy".into(),
        },
        _ => Outcome::Released,
    });
    s.settle(&settlements, t0()).await.expect("settle");
    let next = s.fetch(10, t0()).await.expect("fetch").events;
    assert_eq!(keys(&next), vec![("o_1".into(), 2)]);
}

#[tokio::test]
async fn settling_twice_changes_nothing_and_a_full_batch_says_more() {
    let db = TestDb::new().await;
    db.commit_events(&[("o_1", 1), ("o_2", 1), ("o_3", 1)])
        .await;
    let mut s = source(&db, DeadLetterPolicy::HoldAggregate);
    let first = s.fetch(2, t0()).await.expect("fetch");
    assert!(first.more);
    assert_eq!(first.events.len(), 2);
    let delivered = settle_all(&first.events, |_| Outcome::Delivered);
    s.settle(&delivered, t0()).await.expect("settle");
    s.settle(&delivered, t0()).await.expect("settle again");
    // A late failure report for an already delivered event does not revive it.
    let late = settle_all(&first.events, |_| Outcome::DeadLetter {
        reason: "late".into(),
    });
    s.settle(&late, t0()).await.expect("late settle");
    assert_eq!(db.count("delivered").await, 2);
    assert_eq!(db.count("dead").await, 0);

    let rest = s.fetch(2, t0()).await.expect("fetch");
    assert!(!rest.more);
    assert_eq!(keys(&rest.events), vec![("o_3".into(), 1)]);
}

#[tokio::test]
async fn on_delivered_delete_removes_the_row_and_the_backlog_counts_the_rest() {
    let mut db = TestDb::new().await;
    db.config.on_delivered = OnDelivered::Delete;
    db.commit_events(&[("o_1", 1), ("o_2", 1), ("o_3", 1)])
        .await;
    let mut s = source(&db, DeadLetterPolicy::HoldAggregate);
    let batch = s.fetch(10, t0()).await.expect("fetch").events;
    let settlements = settle_all(&batch, |e| match e.aggregate_id.as_str() {
        "o_1" => Outcome::Delivered,
        "o_2" => Outcome::Retry {
            not_before: OffsetDateTime::now_utc() + Duration::from_secs(60),
            error: "busy".into(),
        },
        _ => Outcome::DeadLetter {
            reason: "poison".into(),
        },
    });
    s.settle(&settlements, t0()).await.expect("settle");
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(total, 2, "the delivered row is gone");

    let backlog = SqliteInspector::new(db.pool.clone(), &db.config)
        .backlog_at(OffsetDateTime::now_utc())
        .await
        .expect("backlog");
    assert_eq!((backlog.pending, backlog.retrying, backlog.dead), (1, 1, 1));
    assert_eq!(backlog.delivered_last_minute, None);
}

#[tokio::test]
async fn two_sources_on_one_file_never_both_return_events_within_one_lease_period() {
    let mut db = TestDb::new().await;
    db.config.lease_ttl = Duration::from_secs(5);
    db.commit_events(&[("o_1", 1), ("o_2", 1)]).await;
    let mut a = source(&db, DeadLetterPolicy::HoldAggregate);
    let mut b = source(&db, DeadLetterPolicy::HoldAggregate);
    let inspector = SqliteInspector::new(db.pool.clone(), &db.config);

    // A works (fetches and releases its batches untouched, so events stay pending) for 10s,
    // then hangs; B polls every second throughout.
    let a_stops = 10;
    let mut b_first = None;
    for k in 0..30 {
        let now = t0() + Duration::from_secs(k);
        let a_got = if k < a_stops {
            let got = a.fetch(10, now).await.expect("fetch a").events;
            let released = settle_all(&got, |_| Outcome::Released);
            a.settle(&released, now).await.expect("settle a");
            !got.is_empty()
        } else {
            false
        };
        let b_got = !b.fetch(10, now).await.expect("fetch b").events.is_empty();
        assert!(!(a_got && b_got), "both sources returned events at {k}s");
        if k < a_stops {
            assert!(a_got, "the holder got nothing at {k}s");
        }
        if b_got && b_first.is_none() {
            b_first = Some(k);
        }
    }
    // A last renewed at 9s; its lease ran to 14s.
    assert_eq!(b_first, Some(a_stops - 1 + 5));
    let lease = inspector.relay_lease().await.expect("lease").expect("held");
    assert_eq!(lease.holder, b.holder());

    // A wakes up: it is now the standby.
    let now = t0() + Duration::from_secs(30);
    assert!(a.fetch(10, now).await.expect("fetch a").events.is_empty());
    assert!(!a.holds_lease());
}

#[tokio::test]
async fn a_holder_that_lost_its_lease_records_only_its_deliveries() {
    let mut db = TestDb::new().await;
    db.config.lease_ttl = Duration::from_secs(5);
    db.commit_events(&[("o_1", 1), ("o_2", 1)]).await;
    let mut a = source(&db, DeadLetterPolicy::HoldAggregate);
    let mut b = source(&db, DeadLetterPolicy::HoldAggregate);

    let batch = a.fetch(10, t0()).await.expect("fetch a").events;
    // A stalls while publishing; B takes over after the lease expired.
    let late = t0() + Duration::from_secs(6);
    assert_eq!(b.fetch(10, late).await.expect("fetch b").events.len(), 2);
    let settlements = settle_all(&batch, |e| match e.aggregate_id.as_str() {
        "o_1" => Outcome::Delivered,
        _ => Outcome::DeadLetter {
            reason: "poison".into(),
        },
    });
    a.settle(&settlements, late).await.expect("settle a");
    assert!(!a.holds_lease());
    assert_eq!(db.row(batch[0].position.0).await.0, "delivered");
    let (state, attempts, _, _) = db.row(batch[1].position.0).await;
    assert_eq!(
        (state.as_str(), attempts),
        ("pending", 0),
        "left to the new holder"
    );
    assert!(b.holds_lease());
}

#[tokio::test]
async fn a_released_or_dropped_lease_lets_a_standby_take_over_at_once() {
    let db = TestDb::new().await;
    db.commit_events(&[("o_1", 1)]).await;
    let mut a = source(&db, DeadLetterPolicy::HoldAggregate);
    let mut b = source(&db, DeadLetterPolicy::HoldAggregate);
    let now = t0();

    assert_eq!(a.fetch(10, now).await.expect("fetch a").events.len(), 1);
    assert!(b.fetch(10, now).await.expect("fetch b").events.is_empty());
    a.release_lease().await.expect("release");
    assert_eq!(b.fetch(10, now).await.expect("fetch b").events.len(), 1);

    // Dropping the holder releases its lease in the background.
    let mut c = source(&db, DeadLetterPolicy::HoldAggregate);
    assert!(c.fetch(10, now).await.expect("fetch c").events.is_empty());
    drop(b);
    let mut took_over = false;
    for _ in 0..200 {
        if !c.fetch(10, now).await.expect("fetch c").events.is_empty() {
            took_over = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        took_over,
        "the standby never saw the dropped holder's lease released"
    );
}

#[tokio::test]
async fn a_write_lock_held_past_busy_timeout_is_unavailable_and_records_nothing() {
    let mut db = TestDb::new().await;
    db.config.busy_timeout = Duration::from_millis(100);
    db.commit_events(&[("o_1", 1)]).await;
    let mut s = source(&db, DeadLetterPolicy::HoldAggregate);
    let batch = s.fetch(10, t0()).await.expect("fetch").events;
    let delivered = settle_all(&batch, |_| Outcome::Delivered);

    let other = db.other_pool().await;
    let blocker = other
        .begin_with("BEGIN IMMEDIATE")
        .await
        .expect("take the write lock");
    let err = s.settle(&delivered, t0()).await.expect_err("lock held");
    assert_eq!(
        err.kind(),
        outbox_core::SourceErrorKind::Unavailable,
        "{err}"
    );
    assert_eq!(db.count("pending").await, 1, "nothing recorded");
    blocker.rollback().await.expect("release the lock");

    s.settle(&delivered, t0())
        .await
        .expect("settle once the lock is free");
    assert_eq!(db.count("delivered").await, 1);
}

#[tokio::test]
async fn a_database_that_was_never_migrated_is_a_fatal_error_that_says_what_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = outbox_sqlite::SqliteConfig::new(dir.path().join("empty.db"));
    let pool = outbox_sqlite::connect(&config).await.expect("open");
    let mut s = SqlitePollSource::new(
        pool,
        &config,
        Ordering::PerAggregate,
        DeadLetterPolicy::Skip,
    );
    let err = s.fetch(10, t0()).await.expect_err("no outbox table");
    assert_eq!(err.kind(), outbox_core::SourceErrorKind::Fatal, "{err}");
    assert!(
        err.to_string().contains("run `outbox migrate` first"),
        "{err}"
    );
}

#[tokio::test]
async fn a_source_restarted_under_the_same_holder_id_resumes_at_once() {
    let db = TestDb::new().await;
    db.commit_events(&[("o_1", 1)]).await;
    let mut a = source(&db, DeadLetterPolicy::HoldAggregate).with_holder("relay-a");
    let batch = a.fetch(10, t0()).await.expect("fetch").events;
    assert_eq!(batch.len(), 1);
    // Crash mid-batch: no settle, no release.
    std::mem::forget(a);

    let mut stranger = source(&db, DeadLetterPolicy::HoldAggregate);
    assert!(
        stranger
            .fetch(10, t0())
            .await
            .expect("fetch")
            .events
            .is_empty()
    );
    let mut restarted = source(&db, DeadLetterPolicy::HoldAggregate).with_holder("relay-a");
    let again = restarted.fetch(10, t0()).await.expect("fetch").events;
    assert_eq!(again, batch, "the unsettled batch is delivered again");
}

/// `outbox relay` drops its source as `main` returns, when nothing would run a spawned task.
#[test]
fn a_source_dropped_outside_any_runtime_still_releases_its_lease() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (db, holder) = runtime.block_on(async {
        let db = TestDb::new().await;
        db.commit_events(&[("o_1", 1)]).await;
        let mut s = source(&db, DeadLetterPolicy::HoldAggregate);
        assert_eq!(s.fetch(10, t0()).await.expect("fetch").events.len(), 1);
        let holder = s.holder().to_owned();
        // Leave the runtime with the source still alive...
        (db, (holder, s))
    });
    let (holder, s) = holder;
    drop(runtime);
    // ...and drop it with no runtime at all.
    drop(s);

    let runtime = tokio::runtime::Runtime::new().expect("second runtime");
    runtime.block_on(async {
        let pool = outbox_sqlite::connect(&db.config).await.expect("reopen");
        let lease = SqliteInspector::new(pool, &db.config)
            .relay_lease()
            .await
            .expect("read lease");
        assert_eq!(lease, None, "lease of {holder} still held");
    });
}
