//! The source conformance suite against the binlog CDC source on a real MariaDB (row-based
//! binlog): order under concurrent writers (the commit-order oracle), rollbacks, poison
//! events, retries, broker outages, shutdown, a relay that dies before settling (the stream
//! resumes at the kept position), delivery positions (each row's `seq`).

mod cdc_support;
mod support;

use cdc_support::CdcHarness;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binlog_cdc_source_passes_the_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(CdcHarness::new).await
}
