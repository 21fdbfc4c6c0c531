//! Full relay runs: `outbox_core::Relay` over `SqlitePollSource` into a recording sink, with
//! producers committing on another connection while the relay runs.

mod common;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use common::{RecordingSink, Script, TestDb, event, n_of, wait_until};
use outbox_core::{Backoff, DeadLetterPolicy, Ordering, Relay, RelayConfig, RelayReport};
use outbox_sqlite::{SqliteInspector, SqliteOutbox, SqlitePollSource};
use sqlx::SqlitePool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(20);

fn relay_config() -> RelayConfig {
    RelayConfig {
        batch_size: NonZeroUsize::new(50).expect("nonzero"),
        backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: 0.0,
        },
        workers: NonZeroUsize::new(1).expect("nonzero"),
        ..RelayConfig::default()
    }
}

fn start(
    db: &TestDb,
    pool: SqlitePool,
    sink: Arc<RecordingSink>,
    dead_letter: DeadLetterPolicy,
) -> (CancellationToken, JoinHandle<RelayReport>) {
    let source = SqlitePollSource::new(pool, &db.config, Ordering::PerAggregate, dead_letter);
    let relay = Relay::new(relay_config(), sink);
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let handle = tokio::spawn(async move {
        relay
            .run(vec![source], token)
            .await
            .expect("relay run without fatal error")
    });
    (shutdown, handle)
}

/// Commits `per_aggregate` events for each aggregate, interleaved, one transaction each,
/// through `pool`.
async fn produce(pool: &SqlitePool, aggregates: &[&str], per_aggregate: u32) {
    let outbox = SqliteOutbox::default();
    for n in 1..=per_aggregate {
        for a in aggregates {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
            outbox
                .enqueue(&mut *tx, &event(a, n))
                .await
                .expect("enqueue");
            tx.commit().await.expect("commit");
        }
    }
}

/// The payload numbers each aggregate's events reached the sink with, in order.
fn sequences(sink: &RecordingSink) -> HashMap<String, Vec<u64>> {
    let mut out: HashMap<String, Vec<u64>> = HashMap::new();
    for e in sink.published() {
        out.entry(e.aggregate_id.clone())
            .or_default()
            .push(n_of(&e));
    }
    out
}

async fn drained(inspector: &SqliteInspector) -> bool {
    use outbox_core::Inspect;
    inspector.backlog().await.expect("backlog").pending == 0
}

#[tokio::test]
async fn every_committed_event_is_delivered_once_in_per_aggregate_order() {
    let db = TestDb::new().await;
    let sink = RecordingSink::new([]);
    let (shutdown, relay) = start(
        &db,
        db.pool.clone(),
        Arc::clone(&sink),
        DeadLetterPolicy::HoldAggregate,
    );

    // Producers write on their own pool while the relay runs.
    let writer = db.other_pool().await;
    let aggregates = ["o_1", "o_2", "o_3", "o_4", "o_5"];
    produce(&writer, &aggregates, 40).await;

    let inspector = SqliteInspector::new(db.pool.clone(), &db.config);
    assert!(
        wait_until(LIMIT, || async {
            sink.published().len() >= 200 && drained(&inspector).await
        })
        .await,
        "not drained: {} published",
        sink.published().len()
    );
    shutdown.cancel();
    let report = relay.await.expect("join");

    let expected: Vec<u64> = (1..=40).collect();
    let seqs = sequences(&sink);
    for a in aggregates {
        assert_eq!(seqs.get(a), Some(&expected), "aggregate {a}");
    }
    assert_eq!(report.delivered, 200);
    assert_eq!(db.count("delivered").await, 200);
}

#[tokio::test]
async fn a_poison_event_is_dead_lettered_while_other_aggregates_flow() {
    let db = TestDb::new().await;
    let sink = RecordingSink::new([("poison", Script::Reject)]);
    let (shutdown, relay) = start(
        &db,
        db.pool.clone(),
        Arc::clone(&sink),
        DeadLetterPolicy::HoldAggregate,
    );
    produce(&db.pool, &["o_1", "poison", "o_2"], 5).await;

    let inspector = SqliteInspector::new(db.pool.clone(), &db.config);
    assert!(
        wait_until(LIMIT, || async { sink.published().len() >= 10 }).await,
        "healthy aggregates were not delivered"
    );
    assert!(
        wait_until(LIMIT, || async { db.count("dead").await == 1 }).await,
        "the poison event was not dead-lettered"
    );
    shutdown.cancel();
    let report = relay.await.expect("join");

    let seqs = sequences(&sink);
    assert_eq!(seqs.get("o_1"), Some(&vec![1, 2, 3, 4, 5]));
    assert_eq!(seqs.get("o_2"), Some(&vec![1, 2, 3, 4, 5]));
    assert_eq!(seqs.get("poison"), None);
    assert_eq!(report.dead_lettered, 1);
    // The dead letter holds the rest of its aggregate back (hold-aggregate), kept pending.
    use outbox_core::Inspect;
    let backlog = inspector.backlog().await.expect("backlog");
    assert_eq!((backlog.dead, backlog.pending), (1, 4));
    assert_eq!(sink.failures(), vec![("poison".to_owned(), 0)]);
}

#[tokio::test]
async fn transient_failures_are_retried_with_backoff_then_delivered_in_order() {
    let db = TestDb::new().await;
    let sink = RecordingSink::new([("flaky", Script::FailTimes(2))]);
    let (shutdown, relay) = start(
        &db,
        db.pool.clone(),
        Arc::clone(&sink),
        DeadLetterPolicy::HoldAggregate,
    );
    produce(&db.pool, &["flaky", "o_1"], 3).await;

    let inspector = SqliteInspector::new(db.pool.clone(), &db.config);
    assert!(
        wait_until(LIMIT, || async {
            sink.published().len() >= 6 && drained(&inspector).await
        })
        .await,
        "not drained: {} published",
        sink.published().len()
    );
    shutdown.cancel();
    let report = relay.await.expect("join");

    let seqs = sequences(&sink);
    assert_eq!(seqs.get("flaky"), Some(&vec![1, 2, 3]));
    assert_eq!(seqs.get("o_1"), Some(&vec![1, 2, 3]));
    // The first flaky event failed twice, with its attempts counted between tries.
    assert_eq!(
        sink.failures(),
        vec![("flaky".to_owned(), 0), ("flaky".to_owned(), 1)]
    );
    assert_eq!(report.retried, 2);
    let attempts: i64 = sqlx::query_scalar(
        "SELECT attempts FROM outbox WHERE aggregate_id = 'flaky' ORDER BY seq LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .expect("attempts");
    assert_eq!(attempts, 2);
}

#[tokio::test]
async fn a_second_relay_on_the_same_file_stands_by_and_takes_over_when_the_first_stops() {
    let db = TestDb::new().await;
    let first_sink = RecordingSink::new([]);
    let second_sink = RecordingSink::new([]);
    let (first_stop, first) = start(
        &db,
        db.pool.clone(),
        Arc::clone(&first_sink),
        DeadLetterPolicy::HoldAggregate,
    );
    // Let the first relay take the lease before the second starts.
    assert!(
        wait_until(LIMIT, || async {
            let inspector = SqliteInspector::new(db.pool.clone(), &db.config);
            inspector.relay_lease().await.expect("lease").is_some()
        })
        .await
    );
    let (second_stop, second) = start(
        &db,
        db.other_pool().await,
        Arc::clone(&second_sink),
        DeadLetterPolicy::HoldAggregate,
    );

    produce(&db.pool, &["o_1", "o_2"], 10).await;
    let inspector = SqliteInspector::new(db.pool.clone(), &db.config);
    assert!(wait_until(LIMIT, || async { drained(&inspector).await }).await);
    assert_eq!(first_sink.published().len(), 20);
    assert!(second_sink.published().is_empty(), "the standby published");

    // The first relay stops and releases its lease; the standby takes over.
    first_stop.cancel();
    first.await.expect("join first");
    produce(&db.pool, &["o_1", "o_2"], 5).await;
    assert!(
        wait_until(LIMIT, || async {
            second_sink.published().len() >= 10 && drained(&inspector).await
        })
        .await,
        "the standby did not take over"
    );
    second_stop.cancel();
    second.await.expect("join second");
    assert_eq!(first_sink.published().len(), 20, "no event published twice");
    let seqs = sequences(&second_sink);
    assert_eq!(seqs.get("o_1"), Some(&vec![1, 2, 3, 4, 5]));
}
