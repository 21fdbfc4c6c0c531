//! The relay's start-up `ANALYZE`: a table filled before autovacuum's first pass has no
//! planner statistics (reltuples = -1) until someone analyzes it.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use anyhow::ensure;
use outbox_postgres::{OnDelivered, PgPollSource};
use support::PgHarness;

async fn reltuples(h: &PgHarness) -> anyhow::Result<f32> {
    Ok(
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = 'public.outbox'::regclass")
            .fetch_one(&h.pool)
            .await?,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_never_analyzed_outbox_gets_statistics_once() -> anyhow::Result<()> {
    let h = PgHarness::new(OnDelivered::Mark).await?;
    // Empty: left alone (statistics saying "empty" would mislead the planner while
    // producers fill the table).
    PgPollSource::analyze_if_never_analyzed(&h.pool, &h.config).await?;
    ensure!(reltuples(&h).await? < 0.0, "an empty table was analyzed");
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'Order', 'o_' || (g % 10), 'order.placed', '\\x00' FROM generate_series(1, 1000) g",
    )
    .execute(&h.pool)
    .await?;
    ensure!(reltuples(&h).await? < 0.0, "fresh table already analyzed");

    PgPollSource::analyze_if_never_analyzed(&h.pool, &h.config).await?;
    ensure!(reltuples(&h).await? == 1000.0, "ANALYZE did not run");

    // Statistics exist now: a second call must not analyze again.
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'Order', 'o_1', 'order.placed', '\\x00' FROM generate_series(1, 500)",
    )
    .execute(&h.pool)
    .await?;
    PgPollSource::analyze_if_never_analyzed(&h.pool, &h.config).await?;
    ensure!(reltuples(&h).await? == 1000.0, "analyzed again");
    Ok(())
}
