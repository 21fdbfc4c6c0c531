//! The producer: events exist exactly when the caller's transaction commits, and a writer on
//! another connection and the relay's source share the file.

mod common;

use common::{TestDb, event, n_of};
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, Source};
use outbox_sqlite::{EnqueueError, SqliteOutbox, SqlitePollSource, enqueue, enqueue_batch};
use time::OffsetDateTime;
use uuid::Uuid;

fn source(db: &TestDb) -> SqlitePollSource {
    SqlitePollSource::new(
        db.pool.clone(),
        &db.config,
        Ordering::PerAggregate,
        DeadLetterPolicy::HoldAggregate,
    )
}

#[tokio::test]
async fn an_event_enqueued_in_a_rolled_back_transaction_leaves_nothing() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .execute(&db.pool)
        .await
        .expect("orders table");

    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    sqlx::query("INSERT INTO orders (id) VALUES ('o_1')")
        .execute(&mut *tx)
        .await
        .expect("order");
    enqueue(&mut *tx, &event("o_1", 1)).await.expect("enqueue");
    enqueue_batch(&mut tx, &[event("o_1", 2), event("o_1", 3)])
        .await
        .expect("enqueue batch");
    tx.rollback().await.expect("rollback");

    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 0);
    let fetched = source(&db)
        .fetch(10, OffsetDateTime::now_utc())
        .await
        .expect("fetch");
    assert!(fetched.events.is_empty());
}

#[tokio::test]
async fn a_batch_keeps_its_order_and_ids_and_commits_with_the_caller() {
    let db = TestDb::new().await;
    let given = Uuid::now_v7();
    let events = vec![
        event("o_1", 1).with_id(given).with_header("tenant", "acme"),
        event("o_2", 1),
        event("o_1", 2),
    ];
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    let ids = enqueue_batch(&mut tx, &events).await.expect("batch");
    tx.commit().await.expect("commit");
    assert_eq!(ids.len(), 3);
    assert_eq!(ids[0], given);

    let fetched = source(&db)
        .fetch(10, OffsetDateTime::now_utc())
        .await
        .expect("fetch");
    let got: Vec<(Uuid, String, u64)> = fetched
        .events
        .iter()
        .map(|e| (e.id, e.aggregate_id.clone(), n_of(e)))
        .collect();
    assert_eq!(
        got,
        vec![
            (ids[0], "o_1".to_owned(), 1),
            (ids[1], "o_2".to_owned(), 1),
            (ids[2], "o_1".to_owned(), 2)
        ]
    );
    assert_eq!(
        fetched.events[0].headers,
        vec![
            ("tenant".to_owned(), "acme".to_owned()),
            ("aggregate_seq".to_owned(), "1".to_owned())
        ],
        "the row's headers, then the delivery position the relay adds"
    );
}

#[tokio::test]
async fn invalid_events_and_duplicate_ids_are_refused() {
    let db = TestDb::new().await;
    let outbox = SqliteOutbox::default();
    let err = outbox
        .enqueue(&db.pool, &NewEvent::new("Order", "", "order.placed", "{}"))
        .await
        .expect_err("empty aggregate id");
    assert!(matches!(err, EnqueueError::Invalid(_)), "{err}");

    let id = Uuid::now_v7();
    outbox
        .enqueue(&db.pool, &event("o_1", 1).with_id(id))
        .await
        .expect("first");
    let err = outbox
        .enqueue(&db.pool, &event("o_1", 2).with_id(id))
        .await
        .expect_err("same id twice");
    assert!(matches!(err, EnqueueError::Database(_)), "{err}");
    // A failed batch leaves none of its events behind.
    let err = outbox
        .enqueue_batch(&db.pool, &[event("o_2", 1), event("o_2", 2).with_id(id)])
        .await
        .expect_err("batch with a duplicate id");
    assert!(matches!(err, EnqueueError::Database(_)), "{err}");
    assert_eq!(db.count("pending").await, 1);
}

#[tokio::test]
async fn a_writer_on_another_connection_and_the_source_share_the_file() {
    let db = TestDb::new().await;
    let writer = db.other_pool().await;
    let outbox = SqliteOutbox::default();
    let mut source = source(&db);

    // The first fetch takes the relay lease (a short write).
    let now = OffsetDateTime::now_utc();
    assert!(
        source
            .fetch(10, now)
            .await
            .expect("fetch")
            .events
            .is_empty()
    );
    // Hold a write transaction open on the writer's pool while the source reads: in WAL mode
    // the reader is not blocked, and sees only committed rows.
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    outbox
        .enqueue(&mut *tx, &event("o_1", 1))
        .await
        .expect("enqueue");
    assert!(
        source
            .fetch(10, now)
            .await
            .expect("fetch")
            .events
            .is_empty()
    );
    tx.commit().await.expect("commit");

    let fetched = source.fetch(10, now).await.expect("fetch");
    assert_eq!(fetched.events.len(), 1);
    // ...and the source's settle (a write) waits for the writer's lock rather than failing.
    let mut tx = writer.begin_with("BEGIN IMMEDIATE").await.expect("begin");
    outbox
        .enqueue(&mut *tx, &event("o_1", 2))
        .await
        .expect("enqueue");
    let settle = tokio::spawn(async move {
        let settlements: Vec<_> = fetched
            .events
            .iter()
            .map(|e| outbox_core::Settlement {
                position: e.position,
                outcome: outbox_core::Outcome::Delivered,
            })
            .collect();
        source.settle(&settlements, now).await.map(|()| source)
    });
    // Give the settle a moment to run into the lock (the test holds either way).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    tx.commit().await.expect("commit");
    let mut source = settle.await.expect("join").expect("settle");

    assert_eq!(db.count("delivered").await, 1);
    let next = source.fetch(10, now).await.expect("fetch");
    assert_eq!(next.events.iter().map(n_of).collect::<Vec<_>>(), vec![2]);
}
