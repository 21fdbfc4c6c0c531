//! The PostgreSQL inbox against a real server: a fresh database per test.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use outbox_core::{Identifier, QualifiedTable};
use outbox_inbox::{InboxError, Outcome, PgInbox};
use outbox_testkit::services::Postgres;
use sqlx::PgPool;
use uuid::Uuid;

async fn setup() -> (PgPool, PgInbox) {
    let pg = Postgres::shared().await.expect("postgres starts");
    let url = pg.fresh_database().await.expect("fresh database");
    let pool = PgPool::connect(&url).await.expect("connects");
    sqlx::query("CREATE TABLE points (customer text PRIMARY KEY, n bigint NOT NULL)")
        .execute(&pool)
        .await
        .expect("points table");
    sqlx::query("INSERT INTO points VALUES ('c1', 0)")
        .execute(&pool)
        .await
        .expect("row");
    let inbox = PgInbox::default();
    inbox.migrate(&pool).await.expect("migrates");
    (pool, inbox)
}

async fn points(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT n FROM points WHERE customer = 'c1'")
        .fetch_one(pool)
        .await
        .expect("points")
}

async fn add_points(
    inbox: &PgInbox,
    pool: &PgPool,
    id: Uuid,
) -> Result<Outcome<()>, InboxError<sqlx::Error>> {
    inbox
        .process(pool, "loyalty", id, |conn| {
            async move {
                sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                    .execute(conn)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
}

#[tokio::test]
async fn a_duplicate_delivery_is_detected_and_its_side_effect_skipped() {
    let (pool, inbox) = setup().await;
    let id = Uuid::now_v7();
    assert_eq!(
        add_points(&inbox, &pool, id).await.expect("first"),
        Outcome::Processed(())
    );
    assert_eq!(
        add_points(&inbox, &pool, id).await.expect("second"),
        Outcome::Duplicate
    );
    assert_eq!(points(&pool).await, 10);
    assert!(inbox.contains(&pool, "loyalty", id).await.expect("query"));
    // Another consumer processes the same event once too.
    assert!(
        inbox
            .begin(&pool, "audit", id)
            .await
            .expect("begin")
            .is_some()
    );
}

#[tokio::test]
async fn a_handler_failure_rolls_back_the_side_effect_and_the_dedup_record() {
    let (pool, inbox) = setup().await;
    let id = Uuid::now_v7();
    let err = inbox
        .process(&pool, "loyalty", id, |conn| {
            async move {
                sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("SELECT 1/0").execute(conn).await?; // the handler fails
                Ok::<(), sqlx::Error>(())
            }
            .boxed()
        })
        .await
        .expect_err("handler fails");
    assert!(matches!(err, InboxError::Handler(_)));
    assert_eq!(points(&pool).await, 0);
    assert!(!inbox.contains(&pool, "loyalty", id).await.expect("query"));
    // The redelivery is processed.
    assert_eq!(
        add_points(&inbox, &pool, id).await.expect("retry"),
        Outcome::Processed(())
    );
    assert_eq!(points(&pool).await, 10);
}

#[tokio::test]
async fn concurrent_duplicate_deliveries_produce_exactly_one_side_effect() {
    let (pool, inbox) = setup().await;
    for _ in 0..20 {
        let id = Uuid::now_v7();
        let processed = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (pool, inbox, processed) = (pool.clone(), inbox.clone(), processed.clone());
                tokio::spawn(async move {
                    if let Outcome::Processed(()) =
                        add_points(&inbox, &pool, id).await.expect("process")
                    {
                        processed.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(processed.load(Ordering::SeqCst), 1);
    }
    assert_eq!(points(&pool).await, 200);
}

#[tokio::test]
async fn a_duplicate_waits_for_the_first_delivery_and_proceeds_if_it_rolled_back() {
    let (pool, inbox) = setup().await;
    let id = Uuid::now_v7();
    let first = inbox
        .begin(&pool, "loyalty", id)
        .await
        .expect("begin")
        .expect("first delivery");
    let second = tokio::spawn({
        let (pool, inbox) = (pool.clone(), inbox.clone());
        async move { add_points(&inbox, &pool, id).await.expect("second") }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !second.is_finished(),
        "the second delivery waits on the key"
    );
    first.rollback().await.expect("rollback");
    assert_eq!(second.await.expect("task"), Outcome::Processed(()));
    assert_eq!(points(&pool).await, 10);
}

#[tokio::test]
async fn purge_deletes_only_ids_older_than_the_cutoff() {
    let (pool, inbox) = setup().await;
    let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
    add_points(&inbox, &pool, old).await.expect("old");
    let cutoff = time::OffsetDateTime::now_utc();
    add_points(&inbox, &pool, new).await.expect("new");
    assert_eq!(inbox.purge_before(&pool, cutoff).await.expect("purge"), 1);
    assert!(!inbox.contains(&pool, "loyalty", old).await.expect("query"));
    assert!(inbox.contains(&pool, "loyalty", new).await.expect("query"));
    assert_eq!(
        inbox
            .purge_older_than(&pool, Duration::from_secs(3600))
            .await
            .expect("purge"),
        0
    );
}

#[tokio::test]
async fn migrate_is_idempotent_and_honours_a_custom_schema_and_table() {
    let (pool, _) = setup().await;
    let inbox = PgInbox::new(QualifiedTable::new(
        Some(Identifier::new("loyalty").expect("valid")),
        Identifier::new("seen").expect("valid"),
    ));
    let first = inbox.migrate(&pool).await.expect("migrates");
    assert_eq!(
        first.applied,
        vec![(1, "processed_events"), (2, "positions")]
    );
    let second = inbox.migrate(&pool).await.expect("again");
    assert!(second.applied.is_empty());
    assert_eq!(second.version, outbox_inbox::SCHEMA_VERSION);
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM loyalty.seen_migrations")
        .fetch_one(&pool)
        .await
        .expect("bookkeeping");
    assert_eq!(n, i64::from(outbox_inbox::SCHEMA_VERSION));
}

/// Through PgBouncer in transaction mode, one server connection shared by eight clients that
/// each deliver every event: each event is processed once (its side effect applied once),
/// positions recorded by the order gate are read back, and purge removes what it says. With
/// named statements, the clients' `sqlx_s_N` would meet each other's statements on the shared
/// server connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_inbox_through_pgbouncer_processes_every_event_once() {
    use outbox_testkit::services::PgBouncer;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    let pg = Postgres::shared().await.expect("postgres starts");
    let direct = pg.fresh_database().await.expect("fresh database");
    let direct_pool = PgPool::connect(&direct).await.expect("connects");
    sqlx::query("CREATE TABLE points (customer text PRIMARY KEY, n bigint NOT NULL)")
        .execute(&direct_pool)
        .await
        .expect("points table");
    sqlx::query("INSERT INTO points VALUES ('c1', 0)")
        .execute(&direct_pool)
        .await
        .expect("row");
    let bouncer = PgBouncer::start(&direct, 1)
        .await
        .expect("pgbouncer starts");
    let options: PgConnectOptions = bouncer.url().parse().expect("url");
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.extra_float_digits(None))
        .await
        .expect("connects through pgbouncer");
    let inbox = PgInbox::default().transaction_pooling(true);
    inbox
        .migrate(&pool)
        .await
        .expect("migrates through pgbouncer");

    let ids: Vec<Uuid> = (0..25).map(|_| Uuid::now_v7()).collect();
    let processed = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (pool, inbox, ids, processed) = (
            pool.clone(),
            inbox.clone(),
            ids.clone(),
            Arc::clone(&processed),
        );
        clients.push(tokio::spawn(async move {
            for (seq, id) in ids.iter().enumerate() {
                let message = outbox_inbox::InboxMessage {
                    id: *id,
                    event_type: "points.added".to_owned(),
                    aggregate_type: "Customer".to_owned(),
                    aggregate_id: "c1".to_owned(),
                    aggregate_seq: Some(seq as u64 + 1),
                    headers: Vec::new(),
                    payload: bytes::Bytes::new(),
                };
                let outcome = inbox
                    .process_message(&pool, "loyalty", &message, |conn| {
                        async move {
                            sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                                .persistent(false)
                                .execute(conn)
                                .await?;
                            Ok::<_, sqlx::Error>(())
                        }
                        .boxed()
                    })
                    .await
                    .expect("processed through pgbouncer");
                if outcome == Outcome::Processed(()) {
                    processed.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for c in clients {
        c.await.expect("client");
    }
    assert_eq!(processed.load(Ordering::SeqCst), ids.len());
    assert_eq!(points(&direct_pool).await, 10 * ids.len() as i64);
    for id in &ids {
        assert!(
            inbox
                .contains(&pool, "loyalty", *id)
                .await
                .expect("contains")
        );
    }
    assert_eq!(
        inbox
            .applied_position(&pool, "loyalty", "Customer", "c1")
            .await
            .expect("position"),
        ids.len() as u64
    );
    let purged = inbox
        .purge_older_than(&pool, Duration::ZERO)
        .await
        .expect("purge through pgbouncer");
    assert_eq!(purged, ids.len() as u64);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM processed_events")
        .fetch_one(&direct_pool)
        .await
        .expect("count");
    assert_eq!(left, 0);
}
