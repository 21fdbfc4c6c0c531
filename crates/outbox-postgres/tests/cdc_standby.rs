//! `source.wait_for_standby` against a real primary with a synchronous streaming standby: a
//! transaction the primary has flushed but the standby has not is held, not published (a
//! failover in that window would make it a phantom), and goes out once the standby has it.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::source::{Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, Event, NewEvent, Ordering, Source};
use outbox_postgres::{Mode, PgCdcSource, PgOutbox, PostgresConfig, WaitForStandby};
use outbox_testkit::services::PostgresPair;
use time::OffsetDateTime;
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(60);

/// Fetches, delivers and settles once; returns what came.
async fn step(source: &mut PgCdcSource) -> anyhow::Result<Vec<Event>> {
    let fetched = source.fetch(100, OffsetDateTime::now_utc()).await?;
    let settle: Vec<Settlement> = fetched
        .events
        .iter()
        .map(|e| Settlement {
            position: e.position,
            outcome: Outcome::Delivered,
        })
        .collect();
    source.settle(&settle, OffsetDateTime::now_utc()).await?;
    if fetched.events.is_empty() {
        source.wait_for_events(Duration::from_millis(50)).await;
    }
    Ok(fetched.events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_is_published_only_once_the_synchronous_standby_has_it() -> anyhow::Result<()>
{
    outbox_testkit::init_tracing();
    let pair = PostgresPair::start(true).await?;
    let outcome = held_until_the_standby_has_it(&pair).await;
    // Whatever happened, the standby runs again: a primary whose commits wait for a dead
    // synchronous standby does not shut down.
    if outcome.is_err() {
        let _ = pair.standby().restart().await;
    }
    outcome
}

async fn held_until_the_standby_has_it(pair: &PostgresPair) -> anyhow::Result<()> {
    let url = pair.primary().fresh_database().await?;
    let mut config = PostgresConfig::new(url.clone());
    config.mode = Mode::Cdc;
    config.heartbeat_interval = Duration::from_millis(500);
    config.wait_for_standby = WaitForStandby::Auto; // synchronous_standby_names is set
    config.validate().map_err(anyhow::Error::msg)?;
    let pool = outbox_postgres::connect(&config, 8).await?;
    outbox_postgres::migrate(&pool, &config.qualified_table(), false).await?;
    outbox_postgres::setup_cdc(&pool, &config).await?;
    let outbox = PgOutbox::new(config.qualified_table());
    let write = |n: usize| {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        async move {
            let mut tx = pool.begin().await?;
            let ids = outbox
                .enqueue_batch(
                    &mut *tx,
                    &[NewEvent::new(
                        "Order",
                        "o1",
                        "order.changed",
                        format!("{{\"n\":{n}}}"),
                    )],
                )
                .await?;
            tx.commit().await?;
            anyhow::Ok(ids[0])
        }
    };
    let mut source = PgCdcSource::new(
        pool.clone(),
        &config,
        Ordering::PerAggregate,
        DeadLetterPolicy::HoldAggregate,
    )?;

    // With the standby up, an event goes through.
    let first = write(1).await?;
    let deadline = Instant::now() + WAIT;
    loop {
        ensure!(Instant::now() < deadline, "the first event never came");
        let got = step(&mut source).await?;
        if got.iter().any(|e| e.id == first) {
            break;
        }
    }

    // The standby dies: the primary flushes the next commit (and logical decoding sees it),
    // while the committing session waits for a standby that never answers.
    pair.standby().kill().await?;
    let pending = tokio::spawn(write(2));
    let deadline = Instant::now() + WAIT;
    while source.held_for_standby() == 0 {
        ensure!(
            Instant::now() < deadline,
            "the second transaction was never decoded"
        );
        let got = step(&mut source).await?;
        ensure!(
            got.is_empty(),
            "published {:?} while no standby had it",
            got.iter().map(|e| e.id).collect::<Vec<_>>()
        );
    }
    ensure!(
        !pending.is_finished(),
        "the commit returned without the standby"
    );

    // The standby comes back and catches up: the event goes out, and the commit returns.
    pair.standby().restart().await?;
    let deadline = Instant::now() + WAIT;
    let second = loop {
        ensure!(
            Instant::now() < deadline,
            "the held event never went out after the standby came back"
        );
        if let Some(e) = step(&mut source).await?.into_iter().next() {
            break e;
        }
    };
    let committed = tokio::time::timeout(WAIT, pending)
        .await
        .context("the commit never returned")???;
    ensure!(
        second.id == committed,
        "published {} for {committed}",
        second.id
    );
    ensure!(source.held_for_standby() == 0);
    Ok(())
}

/// What waiting for the standby costs: the time from the start of a commit to the event
/// coming out of the source, with `wait_for_standby` on and off, over the same pair (the
/// commit itself waits for the synchronous standby either way). Prints p50/p90/p99; a figure,
/// not an assertion (docs/benchmarks.md, "Failover"):
/// `cargo test --release -p outbox-postgres --test cdc_standby -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: prints latency figures"]
async fn commit_to_fetch_latency_with_and_without_waiting_for_the_standby() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pair = PostgresPair::start(true).await?;
    for mode in [WaitForStandby::Off, WaitForStandby::On] {
        let url = pair.primary().fresh_database().await?;
        let mut config = PostgresConfig::new(url);
        config.mode = Mode::Cdc;
        config.wait_for_standby = mode;
        // Slots are per cluster: one per run.
        config.slot = outbox_core::Identifier::new(format!("bench_{mode:?}").to_lowercase())?;
        config.validate().map_err(anyhow::Error::msg)?;
        let pool = outbox_postgres::connect(&config, 8).await?;
        outbox_postgres::migrate(&pool, &config.qualified_table(), false).await?;
        outbox_postgres::setup_cdc(&pool, &config).await?;
        let outbox = PgOutbox::new(config.qualified_table());
        let mut source = PgCdcSource::new(
            pool.clone(),
            &config,
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )?;
        let mut latencies = Vec::new();
        for n in 0..300 {
            let started = Instant::now();
            let mut tx = pool.begin().await?;
            let id = outbox
                .enqueue_batch(
                    &mut *tx,
                    &[NewEvent::new(
                        "Order",
                        format!("o{n}"),
                        "order.changed",
                        "{}",
                    )],
                )
                .await?[0];
            tx.commit().await?;
            let deadline = Instant::now() + WAIT;
            loop {
                ensure!(Instant::now() < deadline, "event {n} never came");
                let fetched = source.fetch(100, OffsetDateTime::now_utc()).await?;
                let settle: Vec<Settlement> = fetched
                    .events
                    .iter()
                    .map(|e| Settlement {
                        position: e.position,
                        outcome: Outcome::Delivered,
                    })
                    .collect();
                source.settle(&settle, OffsetDateTime::now_utc()).await?;
                if fetched.events.iter().any(|e| e.id == id) {
                    break;
                }
                source.wait_for_events(Duration::from_millis(50)).await;
            }
            latencies.push(started.elapsed());
        }
        latencies.sort();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        eprintln!(
            "wait_for_standby = {mode:?}: commit start -> fetched, {} events: p50 {:?} p90 {:?} p99 {:?} max {:?}",
            latencies.len(),
            at(0.5),
            at(0.9),
            at(0.99),
            latencies[latencies.len() - 1]
        );
    }
    Ok(())
}
