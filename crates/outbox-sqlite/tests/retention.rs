//! SQLite retention: only delivered rows past the window go, in bounded batches.

mod common;

use std::ops::ControlFlow;
use std::time::Duration;

use common::TestDb;
use outbox_sqlite::SqliteRetention;
use time::OffsetDateTime;

const DAY_US: i64 = 86_400_000_000;

#[tokio::test]
async fn retention_deletes_only_delivered_rows_past_the_window() -> anyhow::Result<()> {
    let db = TestDb::new().await;
    let now = OffsetDateTime::now_utc();
    let now_us = i64::try_from(now.unix_timestamp_nanos() / 1000)?;
    // 25 delivered two days ago, 3 delivered an hour ago, 4 pending and 2 dead from long ago.
    for (n, state, delivered_at, dead_at) in [
        (25, "delivered", Some(now_us - 2 * DAY_US), None),
        (3, "delivered", Some(now_us - 3_600_000_000), None),
        (4, "pending", None, None),
        (2, "dead", None, Some(now_us - 30 * DAY_US)),
    ] {
        for i in 0..n {
            sqlx::query(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at,
                                     state, delivered_at, dead_lettered_at)
                 VALUES ('Order', ?1, 'order.placed', X'7B7D', ?2, ?3, ?4, ?5)",
            )
            .bind(format!("{state}-{i}"))
            .bind(now_us - 40 * DAY_US)
            .bind(state)
            .bind(delivered_at)
            .bind(dead_at)
            .execute(&db.pool)
            .await?;
        }
    }
    let retention = SqliteRetention::new(db.pool.clone(), &db.config.table);
    let keep = Duration::from_secs(86_400);
    let (would, oldest) = retention.preview(now, keep).await?;
    anyhow::ensure!(would == 25, "preview: {would}");
    anyhow::ensure!(oldest.is_some());
    let mut progress = Vec::new();
    let report = retention
        .run(now, keep, 10, Duration::ZERO, &mut |n| {
            progress.push(n);
            ControlFlow::Continue(())
        })
        .await?;
    anyhow::ensure!(report.deleted == 25 && report.batches == 3, "{report:?}");
    anyhow::ensure!(progress == [10, 20], "{progress:?}");
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM outbox GROUP BY state ORDER BY state")
            .fetch_all(&db.pool)
            .await?;
    anyhow::ensure!(
        left == [
            ("dead".to_owned(), 2),
            ("delivered".to_owned(), 3),
            ("pending".to_owned(), 4)
        ],
        "{left:?}"
    );
    Ok(())
}
