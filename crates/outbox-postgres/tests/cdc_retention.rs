//! Retention in CDC mode: rows stay `pending` (the stream carries the events), so retention
//! deletes only rows whose transactions the replication slot has confirmed; never a dead
//! letter, never an event the relay has not settled.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use cdc_support::CdcHarness;
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, SinkErrorKind};
use outbox_postgres::{PgRetention, RetentionSettings};
use outbox_testkit::conformance::{Harness, RunningRelay, test_relay_config};
use outbox_testkit::faults::{ScriptedSink, Times};
use time::OffsetDateTime;

const WAIT: Duration = Duration::from_secs(60);

fn events(prefix: &str, n: usize) -> Vec<NewEvent> {
    (0..n)
        .map(|i| NewEvent::new("Order", format!("{prefix}{i}"), "order.placed", "{}"))
        .collect()
}

async fn rows(h: &CdcHarness) -> anyhow::Result<Vec<(String, String)>> {
    Ok(
        sqlx::query_as("SELECT aggregate_id, state FROM outbox ORDER BY seq")
            .fetch_all(&h.pool)
            .await?,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cdc_retention_deletes_only_rows_the_slot_has_confirmed() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    h.write(events("a", 10), true).await?;
    let retention = PgRetention::new(h.pool.clone(), &h.config);
    let later = OffsetDateTime::now_utc() + time::Duration::days(2);
    let settings = |wait| RetentionSettings {
        keep: Duration::from_secs(86_400),
        cdc_wait: wait,
        ..RetentionSettings::default()
    };
    let mut go = |_| ControlFlow::Continue(());

    // No relay has streamed anything yet: nothing is known to be delivered.
    let report = retention
        .run(later, &settings(Duration::from_millis(500)), &mut go)
        .await?;
    ensure!(report.deleted == 0, "{report:?}");
    ensure!(
        report.notes.iter().any(|n| n.contains("has not confirmed")),
        "{report:?}"
    );
    ensure!(rows(&h).await?.len() == 10);

    // The relay delivers the ten events and dead-letters a poison one.
    let sink = Arc::new(ScriptedSink::new());
    sink.fail_aggregate("poison", SinkErrorKind::Rejected, Times::Forever);
    sink.fail_aggregate("stuck", SinkErrorKind::Transient, Times::Forever);
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::Skip, 1_000_000),
        sink.clone(),
        vec![h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::Skip)?],
    );
    sink.wait_for_published(10, WAIT).await?;
    h.write(
        vec![NewEvent::new("Order", "poison", "order.bad", "{}")],
        true,
    )
    .await?;
    outbox_testkit::wait::eventually(WAIT, || async {
        rows(&h)
            .await
            .is_ok_and(|r| r.iter().any(|(_, s)| s == "dead"))
    })
    .await?;
    // The horizon is the cluster's oldest snapshot: a transaction another test holds open on
    // the shared server (a claim, a frozen relay) defers rows to a later run. Run until the
    // ten are gone; never more than them.
    let mut deleted = 0;
    let started = tokio::time::Instant::now();
    while deleted < 10 {
        let report = retention.run(later, &settings(WAIT), &mut go).await?;
        ensure!(report.notes.is_empty(), "{report:?}");
        deleted += report.deleted;
        ensure!(
            started.elapsed() < WAIT,
            "only {deleted} of 10 delivered rows deleted: {report:?}"
        );
        if deleted < 10 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    ensure!(
        deleted == 10,
        "{deleted} rows deleted, expected the 10 delivered"
    );
    ensure!(
        rows(&h).await? == [("poison".to_owned(), "dead".to_owned())],
        "{:?}",
        rows(&h).await?
    );

    // An event that keeps failing holds the slot, so nothing written after it is deleted
    // either, even once those are published.
    h.write(
        vec![NewEvent::new("Order", "stuck", "order.placed", "{}")],
        true,
    )
    .await?;
    sink.wait_for_attempts(12, WAIT).await?;
    h.write(events("b", 5), true).await?;
    sink.wait_for_published(15, WAIT).await?;
    let report = retention
        .run(later, &settings(Duration::from_secs(2)), &mut go)
        .await?;
    ensure!(report.deleted == 0, "{report:?}");
    ensure!(
        report.notes.iter().any(|n| n.contains("has not confirmed")),
        "{report:?}"
    );
    ensure!(rows(&h).await?.len() == 7, "{:?}", rows(&h).await?);
    relay.stop().await?;
    Ok(())
}
