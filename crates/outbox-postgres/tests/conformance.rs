//! The source conformance suite against a real PostgreSQL, in both `on_delivered` modes.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use outbox_postgres::OnDelivered;
use support::PgHarness;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_source_passes_the_conformance_suite_when_marking() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| PgHarness::new(OnDelivered::Mark)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_source_passes_the_conformance_suite_when_deleting() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| PgHarness::new(OnDelivered::Delete)).await
}
