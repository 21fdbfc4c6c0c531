//! A drain-rate figure, not a correctness test (ignored by default): a backlog of outbox rows
//! streamed by the CDC source into a sink that acknowledges at once, against `pg_recvlogical`
//! reading the same backlog from its own `pgoutput` slot with the same publication, and
//! against the polling source draining the same rows (CDC leaves them pending) the same way.
//!
//! ```text
//! OUTBOX_DRAIN_EVENTS=100000 cargo test --release -p outbox-postgres --test cdc_drain -- --ignored --nocapture
//! ```
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use cdc_support::CdcHarness;
use outbox_core::sink::Delivery;
use outbox_core::{DeadLetterPolicy, Event, NewEvent, Ordering, Relay, Sink, SinkError};
use outbox_testkit::conformance::test_relay_config;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Acknowledges everything at once and counts.
#[derive(Default)]
struct NullSink {
    seen: AtomicUsize,
    target: usize,
    done: Notify,
}

impl Sink for NullSink {
    fn name(&self) -> &'static str {
        "null"
    }
    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let n = self.seen.fetch_add(batch.len(), AtomicOrdering::Relaxed) + batch.len();
        if n >= self.target {
            self.done.notify_one();
        }
        Ok(vec![Ok(()); batch.len()])
    }
    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --release --ignored --nocapture"]
async fn cdc_drain_rate_against_pg_recvlogical() -> anyhow::Result<()> {
    let total: usize = std::env::var("OUTBOX_DRAIN_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let h = CdcHarness::new().await?;
    let reference_slot = format!("{}_ref", h.config.slot);
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(&reference_slot)
        .execute(&h.pool)
        .await?;
    let per_tx = 10;
    let started = Instant::now();
    let mut written = 0;
    while written < total {
        let mut tx = h.pool.begin().await?;
        for _ in 0..100 {
            let events: Vec<NewEvent> = (0..per_tx)
                .map(|i| {
                    NewEvent::new(
                        "Order",
                        format!("o-{}", (written + i) % 1000),
                        "order.placed",
                        format!("{{\"n\":{}}}", written + i),
                    )
                })
                .collect();
            h.outbox.enqueue_batch(&mut *tx, &events).await?;
            written += per_tx;
        }
        tx.commit().await?;
    }
    let end_lsn: String = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
        .fetch_one(&h.pool)
        .await?;
    eprintln!("wrote {written} events in {:?}", started.elapsed());

    let sink = Arc::new(NullSink {
        target: written,
        ..NullSink::default()
    });
    let mut config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 3);
    config.batch_size = std::num::NonZeroUsize::new(500).context("nonzero")?;
    let relay = Relay::new(config, sink.clone());
    let source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let token = shutdown.clone();
    let run = tokio::spawn(async move { relay.run(vec![source], token).await });
    tokio::time::timeout(Duration::from_secs(600), sink.done.notified()).await?;
    let cdc = started.elapsed();
    shutdown.cancel();
    run.await??;
    let cdc_rate = written as f64 / cdc.as_secs_f64();

    let url = h.url.clone();
    let started = Instant::now();
    let status = tokio::process::Command::new("/usr/lib/postgresql/15/bin/pg_recvlogical")
        .args([
            "-d",
            &url,
            "--slot",
            &reference_slot,
            "--start",
            "--no-loop",
        ])
        .args(["-o", "proto_version=1", "-o"])
        .arg(format!("publication_names={}", h.config.publication))
        .args(["-f", "/dev/null", "-E", &end_lsn])
        .status()
        .await?;
    let reference = started.elapsed();
    ensure!(status.success(), "pg_recvlogical failed: {status}");
    let reference_rate = written as f64 / reference.as_secs_f64();
    eprintln!(
        "CDC source -> null sink: {written} events in {cdc:?} = {cdc_rate:.0} events/s\n\
         pg_recvlogical (pgoutput, same publication) -> /dev/null: {reference:?} = {reference_rate:.0} events/s\n\
         ratio: {:.0} %",
        100.0 * cdc_rate / reference_rate
    );
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&reference_slot)
        .execute(&h.pool)
        .await?;

    // The polling source on the same rows (CDC never updates them: all still pending), with
    // the relay's defaults: 2 workers, batches of 500, per-aggregate order, mark delivered.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {}",
        h.config.qualified_table()
    )))
    .execute(&h.pool)
    .await?;
    let sink = Arc::new(NullSink {
        target: written,
        ..NullSink::default()
    });
    let mut config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 3);
    config.batch_size = std::num::NonZeroUsize::new(500).context("nonzero")?;
    let relay = Relay::new(config, sink.clone());
    let mut poll_config = h.config.clone();
    poll_config.mode = outbox_postgres::Mode::Poll;
    let sources = (0..2)
        .map(|_| {
            outbox_postgres::PgPollSource::new(
                h.pool.clone(),
                &poll_config,
                Ordering::PerAggregate,
                DeadLetterPolicy::HoldAggregate,
            )
        })
        .collect();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let token = shutdown.clone();
    let run = tokio::spawn(async move { relay.run(sources, token).await });
    tokio::time::timeout(Duration::from_secs(600), sink.done.notified()).await?;
    let poll = started.elapsed();
    shutdown.cancel();
    run.await??;
    let poll_rate = written as f64 / poll.as_secs_f64();
    eprintln!(
        "polling source (2 workers, mark) -> null sink: {poll:?} = {poll_rate:.0} events/s\n\
         CDC / polling: {:.1}x",
        cdc_rate / poll_rate
    );
    Ok(())
}
