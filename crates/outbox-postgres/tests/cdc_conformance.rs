//! The source conformance suite against the CDC source (logical replication).
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;

use cdc_support::CdcHarness;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cdc_source_passes_the_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(CdcHarness::new).await
}
