//! The example service end to end, on both setups, with redeliveries and lost acks forced:
//! every order is awarded exactly once.

use anyhow::ensure;
use outbox_example_loyalty::{Options, run_embedded, run_postgres_nats};
use outbox_testkit::services::{Nats, Postgres};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_awards_every_order_exactly_once_despite_duplicates() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let options = Options {
        orders: 40,
        customers: 4,
        // Every batch published twice: every event arrives at least twice.
        redeliver: 1.0,
        lost_acks: 0.2,
    };
    let summary = run_embedded(dir.path(), &options).await?;
    ensure!(summary.orders == 40, "{summary:?}");
    ensure!(
        summary.duplicates >= 40,
        "each event was published twice, so at least 40 duplicates: {summary:?}"
    );
    ensure!(summary.exactly_once(), "{summary:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_nats_award_every_order_exactly_once_despite_lost_acks() -> anyhow::Result<()>
{
    let url = Postgres::shared().await?.fresh_database().await?;
    let nats = Nats::shared().await?;
    let options = Options {
        orders: 40,
        customers: 4,
        // JetStream drops a republished event id itself (duplicate window); the consumer's
        // lost acks are what the inbox must absorb here.
        redeliver: 0.5,
        lost_acks: 0.3,
    };
    let summary = run_postgres_nats(&url, nats.url(), &options).await?;
    ensure!(summary.lost_acks > 0, "{summary:?}");
    ensure!(
        summary.duplicates >= summary.lost_acks,
        "every lost ack comes back as a duplicate: {summary:?}"
    );
    ensure!(summary.exactly_once(), "{summary:?}");
    Ok(())
}
