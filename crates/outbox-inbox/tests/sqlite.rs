//! The SQLite inbox against a real database file (WAL, busy timeout), one file per test.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use outbox_inbox::{InboxError, Outcome, SqliteInbox};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use uuid::Uuid;

async fn setup() -> (tempfile::TempDir, SqlitePool, SqliteInbox) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("inbox.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("opens");
    sqlx::query("CREATE TABLE points (customer TEXT PRIMARY KEY, n INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .expect("points table");
    sqlx::query("INSERT INTO points VALUES ('c1', 0)")
        .execute(&pool)
        .await
        .expect("row");
    let inbox = SqliteInbox::default();
    inbox.migrate(&pool).await.expect("migrates");
    (dir, pool, inbox)
}

async fn points(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT n FROM points WHERE customer = 'c1'")
        .fetch_one(pool)
        .await
        .expect("points")
}

async fn add_points(
    inbox: &SqliteInbox,
    pool: &SqlitePool,
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
    let (_dir, pool, inbox) = setup().await;
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
}

#[tokio::test]
async fn a_handler_failure_rolls_back_the_side_effect_and_the_dedup_record() {
    let (_dir, pool, inbox) = setup().await;
    let id = Uuid::now_v7();
    let err = inbox
        .process(&pool, "loyalty", id, |conn| {
            async move {
                sqlx::query("UPDATE points SET n = n + 10 WHERE customer = 'c1'")
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("INSERT INTO no_such_table VALUES (1)")
                    .execute(conn)
                    .await?;
                Ok::<(), sqlx::Error>(())
            }
            .boxed()
        })
        .await
        .expect_err("handler fails");
    assert!(matches!(err, InboxError::Handler(_)));
    assert_eq!(points(&pool).await, 0);
    assert!(!inbox.contains(&pool, "loyalty", id).await.expect("query"));
}

#[tokio::test]
async fn concurrent_duplicate_deliveries_produce_exactly_one_side_effect() {
    let (_dir, pool, inbox) = setup().await;
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
async fn purge_deletes_only_ids_older_than_the_cutoff() {
    let (_dir, pool, inbox) = setup().await;
    let (old, new) = (Uuid::now_v7(), Uuid::now_v7());
    add_points(&inbox, &pool, old).await.expect("old");
    tokio::time::sleep(Duration::from_millis(2)).await;
    let cutoff = time::OffsetDateTime::now_utc();
    add_points(&inbox, &pool, new).await.expect("new");
    assert_eq!(inbox.purge_before(&pool, cutoff).await.expect("purge"), 1);
    assert!(!inbox.contains(&pool, "loyalty", old).await.expect("query"));
    assert!(inbox.contains(&pool, "loyalty", new).await.expect("query"));
}

#[tokio::test]
async fn migrate_is_idempotent() {
    let (_dir, pool, inbox) = setup().await;
    let again = inbox.migrate(&pool).await.expect("again");
    assert!(again.applied.is_empty());
    assert_eq!(again.version, outbox_inbox::SCHEMA_VERSION);
}
