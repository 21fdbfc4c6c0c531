//! The MySQL/MariaDB producer against a real MariaDB: `migrate`, `enqueue` in the caller's
//! transaction (exact bytes, headers, rollback), and per-aggregate positions in commit order
//! under concurrent transactions.

use std::time::Duration;

use outbox_core::{Identifier, NewEvent};
use outbox_mysql::{MySqlOutbox, migrate};
use outbox_testkit::services::MariaDb;
use outbox_testkit::wait::eventually;
use sqlx::MySqlPool;
use uuid::Uuid;

async fn fresh() -> anyhow::Result<(MySqlPool, MySqlOutbox)> {
    let url = MariaDb::shared().await?.fresh_database().await?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(20)
        .connect(&url)
        .await?;
    let table = Identifier::new("outbox")?;
    migrate(&pool, &table).await?;
    Ok((pool, MySqlOutbox::new(table)))
}

async fn seq_of(pool: &MySqlPool, id: Uuid) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT seq FROM outbox WHERE id = ?")
        .bind(id.to_string())
        .fetch_one(pool)
        .await?)
}

#[tokio::test]
async fn migrate_is_idempotent_and_records_its_version() -> anyhow::Result<()> {
    let (pool, _) = fresh().await?;
    let again = migrate(&pool, &Identifier::new("outbox")?).await?;
    assert!(again.applied.is_empty(), "{again:?}");
    assert_eq!(again.version, outbox_mysql::SCHEMA_VERSION);
    // Concurrent runs on a fresh table wait for each other and both succeed.
    let table = Identifier::new("other_outbox")?;
    let (a, b) = tokio::join!(migrate(&pool, &table), migrate(&pool, &table));
    assert_eq!(a?.applied.len() + b?.applied.len(), 1, "applied once");
    Ok(())
}

#[tokio::test]
async fn enqueue_writes_exact_bytes_and_headers_and_rolls_back_with_the_caller()
-> anyhow::Result<()> {
    let (pool, outbox) = fresh().await?;
    let payload: &[u8] = b"\x00\xff\r\n{\"total\":1250}";
    let mut event = NewEvent::new("Order", "Zürich-1", "order.placed", payload.to_vec());
    event.headers = vec![("tenant".to_owned(), "acme".to_owned())];
    let mut tx = pool.begin().await?;
    let id = outbox.enqueue(&mut tx, &event).await?;
    tx.commit().await?;
    let (stored, headers, aggregate_id): (Vec<u8>, String, String) =
        sqlx::query_as("SELECT payload, headers, aggregate_id FROM outbox WHERE id = ?")
            .bind(id.to_string())
            .fetch_one(&pool)
            .await?;
    assert_eq!(stored, payload, "payload bytes exactly");
    assert_eq!(aggregate_id, "Zürich-1");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&headers)?,
        serde_json::json!({"tenant": "acme"})
    );
    assert_eq!(seq_of(&pool, id).await?, 1);

    // Rolled back: no row, and the aggregate's position is not used up.
    let mut tx = pool.begin().await?;
    let gone = outbox.enqueue(&mut tx, &event).await?;
    tx.rollback().await?;
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE id = ?")
        .bind(gone.to_string())
        .fetch_one(&pool)
        .await?;
    assert_eq!(count, 0);
    let mut tx = pool.begin().await?;
    let next = outbox.enqueue(&mut tx, &event).await?;
    tx.commit().await?;
    assert_eq!(seq_of(&pool, next).await?, 2, "no gap after a rollback");

    // A producer in another language inserts the four required columns only.
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'Zürich-1', 'order.shipped', 'x')")
        .execute(&pool)
        .await?;
    let (id, seq, headers): (String, i64, String) =
        sqlx::query_as("SELECT id, seq, headers FROM outbox WHERE event_type = 'order.shipped'")
            .fetch_one(&pool)
            .await?;
    let id = Uuid::parse_str(&id)?;
    assert_eq!(
        id.get_version_num(),
        7,
        "a UUIDv7 made by the trigger: {id}"
    );
    assert_eq!((seq, headers.as_str()), (3, "{}"));

    // An empty aggregate id is refused before anything is written.
    let bad = NewEvent::new("Order", "", "order.placed", "x");
    assert!(
        outbox
            .enqueue(&mut *pool.acquire().await?, &bad)
            .await
            .is_err()
    );
    Ok(())
}

/// A transaction that wrote an event for an aggregate holds its position until it ends: a
/// second transaction for the same aggregate waits, and takes the next position after the
/// first commits (or the same one after it rolls back) — commit order, not insert order.
#[tokio::test]
async fn a_second_transaction_for_the_aggregate_waits_and_follows_in_commit_order()
-> anyhow::Result<()> {
    let (pool, outbox) = fresh().await?;
    for first_commits in [true, false] {
        let aggregate = format!("o_{first_commits}");
        let event = NewEvent::new("Order", aggregate.as_str(), "order.step", "x");
        let mut first = pool.begin().await?;
        let first_id = outbox.enqueue(&mut first, &event).await?;
        let second = {
            let (pool, outbox, event) = (pool.clone(), outbox.clone(), event.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await?;
                // The business write first would not matter: the head row is what waits.
                let id = outbox.enqueue(&mut tx, &event).await?;
                tx.commit().await?;
                anyhow::Ok(id)
            })
        };
        // The second insert is in the trigger's upsert of the head row, which cannot finish
        // while the first transaction holds that row.
        eventually(Duration::from_secs(30), || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE 'INSERT INTO `outbox_aggregate_heads`%'",
            )
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 1)
        })
        .await?;
        assert!(!second.is_finished(), "the second transaction waits");
        if first_commits {
            first.commit().await?;
        } else {
            first.rollback().await?;
        }
        let second_id = second.await??;
        if first_commits {
            assert_eq!(seq_of(&pool, first_id).await?, 1);
            assert_eq!(seq_of(&pool, second_id).await?, 2);
        } else {
            assert_eq!(
                seq_of(&pool, second_id).await?,
                1,
                "the rolled-back position is reused"
            );
        }
    }
    Ok(())
}

/// Many concurrent transactions over a few aggregates: every aggregate's positions are
/// exactly 1..=n, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_producers_get_contiguous_positions_per_aggregate() -> anyhow::Result<()> {
    let (pool, outbox) = fresh().await?;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        tasks.push(tokio::spawn(async move {
            let mut committed = 0;
            for i in 0..25 {
                let aggregate = format!("a_{}", (t + i) % 3);
                let mut tx = pool.begin().await?;
                outbox
                    .enqueue(
                        &mut tx,
                        &NewEvent::new("Account", aggregate, "changed", "x"),
                    )
                    .await?;
                tokio::task::yield_now().await;
                if i % 5 == 4 {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                    committed += 1;
                }
            }
            anyhow::Ok(committed)
        }));
    }
    let mut committed = 0;
    for t in tasks {
        committed += t.await??;
    }
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT aggregate_id, COUNT(*), COUNT(DISTINCT seq), MAX(seq) FROM outbox GROUP BY aggregate_id",
    )
    .fetch_all(&pool)
    .await?;
    let total: i64 = rows.iter().map(|r| r.1).sum();
    assert_eq!(
        total, committed,
        "every committed event, no rolled-back one"
    );
    for (aggregate, count, distinct, max) in rows {
        assert_eq!(
            (distinct, max),
            (count, count),
            "positions of {aggregate} are 1..={count}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn enqueue_batch_writes_every_event_in_order_with_consecutive_positions() -> anyhow::Result<()>
{
    let (pool, outbox) = fresh().await?;
    // More than one statement's worth, over three aggregates.
    let events: Vec<NewEvent> = (0..outbox_mysql::BATCH_ROWS + 7)
        .map(|i| {
            NewEvent::new(
                "Order",
                format!("o-{}", i % 3),
                "order.changed",
                format!("{i}\0\u{ff}").into_bytes(),
            )
        })
        .collect();
    let mut tx = pool.begin().await?;
    let ids = outbox.enqueue_batch(&mut tx, &events).await?;
    tx.commit().await?;
    assert_eq!(ids.len(), events.len());
    let rows: Vec<(String, String, i64, Vec<u8>)> =
        sqlx::query_as("SELECT id, aggregate_id, seq, payload FROM outbox ORDER BY position")
            .fetch_all(&pool)
            .await?;
    assert_eq!(rows.len(), events.len());
    let mut next = std::collections::HashMap::new();
    for ((row, id), event) in rows.iter().zip(&ids).zip(&events) {
        assert_eq!(row.0, id.to_string(), "ids in order");
        assert_eq!(row.3, event.payload.to_vec(), "payload bytes exact");
        let n = next.entry(row.1.clone()).or_insert(0_i64);
        *n += 1;
        assert_eq!(row.2, *n, "aggregate {} numbered 1, 2, 3, ...", row.1);
    }
    Ok(())
}
