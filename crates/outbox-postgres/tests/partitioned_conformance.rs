//! The source conformance suite on a partitioned outbox table (`source.partitioning =
//! "daily"`): claims, marks and deletes by seq, the ordering trigger and dead-lettering must
//! behave exactly as on a plain table.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use outbox_postgres::{OnDelivered, Partitioning};
use support::PgHarness;

/// The shared harness over a daily-partitioned table, after checking that it is one.
async fn partitioned(on_delivered: OnDelivered) -> anyhow::Result<PgHarness> {
    let h = PgHarness::with_partitioning(on_delivered, Partitioning::Daily).await?;
    let partitioned: bool = sqlx::query_scalar(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = 'public.outbox'::regclass",
    )
    .fetch_one(&h.pool)
    .await?;
    anyhow::ensure!(partitioned, "the outbox table is not partitioned");
    Ok(h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_table_passes_the_conformance_suite_when_marking() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| partitioned(OnDelivered::Mark)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_table_passes_the_conformance_suite_when_deleting() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| partitioned(OnDelivered::Delete)).await
}
