//! The source conformance suite against a real MariaDB, in both `on_delivered` modes: order
//! under concurrent writers and three replicas, the commit-order oracle (also with producers
//! that write the outbox row before they lock their business row), rollbacks, poison events,
//! retries, broker outages, shutdown, a dead relay's claim, delivery positions.

mod support;

use outbox_mysql::{ClaimMode, OnDelivered};
use support::MySqlHarness;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_source_passes_the_conformance_suite_when_marking() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| MySqlHarness::new(OnDelivered::Mark)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_source_passes_the_conformance_suite_when_deleting() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| MySqlHarness::new(OnDelivered::Delete)).await
}

/// The lease-token claim for servers without `SKIP LOCKED`, forced on this server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_claim_passes_the_conformance_suite_when_marking() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| {
        MySqlHarness::with_claim(OnDelivered::Mark, ClaimMode::Lease)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_claim_passes_the_conformance_suite_when_deleting() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| {
        MySqlHarness::with_claim(OnDelivered::Delete, ClaimMode::Lease)
    })
    .await
}
