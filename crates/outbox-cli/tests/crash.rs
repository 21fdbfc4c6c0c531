//! Guarantee 1 and 3 under `kill -9`: two relay processes on one outbox, one of them killed
//! with SIGKILL and restarted over and over while producers write; afterwards every committed
//! event is in JetStream and each aggregate's events are in commit order. Run for the polling
//! source (both relays claim) and for CDC (one relay streams from the slot, the other stands
//! by and takes over when it dies). Every message carries `aggregate_seq`, each aggregate's
//! commit order 1, 2, 3, … exactly (nothing skipped or reused across the kills), and every
//! copy of an event in the stream carries the same number.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_postgres::PgOutbox;
use outbox_testkit::services::{Nats, Postgres};
use rand::Rng;
use support::{Workdir, read_stream, wait_drained};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_relays_lose_no_committed_event_and_keep_per_aggregate_order()
-> anyhow::Result<()> {
    sigkill_scenario(Mode::Poll).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_cdc_relays_lose_no_committed_event_and_keep_per_aggregate_order()
-> anyhow::Result<()> {
    sigkill_scenario(Mode::Cdc).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Poll,
    Cdc,
}

async fn sigkill_scenario(mode: Mode) -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let nats = Nats::shared().await?;
    let tag = format!("crash{}", uuid::Uuid::new_v4().simple());
    // Slots are cluster-wide: each run gets its own.
    let source_mode = match mode {
        Mode::Poll => String::new(),
        Mode::Cdc => format!("mode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\n"),
    };
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
{source_mode}
[relay]
batch_size = 40
workers = 2
poll_interval = "2ms"
[sink]
kind = "nats"
url = "{nats}"
destination = "{tag}.{{aggregate_id}}"
stream = "{tag}"
"#,
            nats = nats.url()
        ),
    )?;
    let migrate = work
        .run(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    ensure!(migrate.code == Some(0), "migrate failed: {migrate:?}");

    let pool = sqlx::PgPool::connect(&url).await?;
    let outbox = PgOutbox::default();
    let mut relays = [
        work.spawn_relay(&config, "relay-0.log")?,
        work.spawn_relay(&config, "relay-1.log")?,
    ];

    // One producer per aggregate group: program order is commit order for its aggregates.
    let mut producers = Vec::new();
    for p in 0..4 {
        let pool = pool.clone();
        let outbox = outbox.clone();
        producers.push(tokio::spawn(async move {
            let mut written: Vec<(String, usize)> = Vec::new();
            let mut next: HashMap<String, usize> = HashMap::new();
            for t in 0..150 {
                let (agg, n_events, rollback) = {
                    let mut rng = rand::rng();
                    (
                        format!("p{p}-a{}", rng.random_range(0..5)),
                        rng.random_range(1..=4),
                        t % 9 == 4,
                    )
                };
                let start = *next.get(&agg).unwrap_or(&0);
                let events: Vec<NewEvent> = (0..n_events)
                    .map(|i| {
                        NewEvent::new(
                            "Order",
                            agg.clone(),
                            "order.changed",
                            format!("{}", start + i),
                        )
                    })
                    .collect();
                let mut tx = pool.begin().await?;
                outbox.enqueue_batch(&mut *tx, &events).await?;
                if rollback {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                    next.insert(agg.clone(), start + n_events);
                    written.extend((start..start + n_events).map(|n| (agg.clone(), n)));
                }
                if t % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            }
            anyhow::Ok(written)
        }));
    }

    // Meanwhile: SIGKILL a random relay every 100-300 ms and start a new one in its place.
    for k in 0..15 {
        let pause = rand::rng().random_range(100..300);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = rand::rng().random_range(0..relays.len());
        relays[victim].start_kill()?; // SIGKILL
        relays[victim].wait().await?;
        // A marker per spawn: a relay killed before its start line (a loaded machine can take
        // longer than the pause to exec it) must not make the next one look unstarted.
        work.append_log(&format!("relay-{victim}.log"), support::RESTART_MARKER)?;
        relays[victim] = work.spawn_relay(&config, &format!("relay-{victim}.log"))?;
        tracing::info!(kill = k, victim, "relay killed and restarted");
    }
    let mut committed: Vec<(String, usize)> = Vec::new();
    for p in producers {
        committed.extend(p.await??);
    }
    let client = nats.connect().await?;
    match mode {
        Mode::Poll => wait_drained(&pool, Duration::from_secs(60)).await?,
        // CDC leaves rows as they are: drained means every committed event is in the stream.
        Mode::Cdc => {
            let expected = committed.len();
            outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
                read_stream(&client, &tag).await.is_ok_and(|got| {
                    got.iter().map(|m| &m.id).collect::<HashSet<_>>().len() >= expected
                })
            })
            .await
            .with_context(|| {
                format!(
                    "not every committed event reached JetStream:\n{}\n{}",
                    work.read_log("relay-0.log"),
                    work.read_log("relay-1.log")
                )
            })?;
        }
    }
    support::stop_restarted_relays(&work, &mut relays).await?;

    let received = read_stream(&client, &tag).await?;
    let mut seen = HashSet::new();
    let mut by_aggregate: HashMap<String, Vec<usize>> = HashMap::new();
    let mut numbers: HashMap<String, usize> = HashMap::new();
    for m in &received {
        let seq: usize = m
            .headers
            .iter()
            .find(|(k, _)| k == "aggregate_seq")
            .with_context(|| format!("event {} has no aggregate_seq", m.id))?
            .1
            .parse()?;
        if let Some(before) = numbers.insert(m.id.clone(), seq) {
            ensure!(
                before == seq,
                "event {} was published as {before}, then as {seq}",
                m.id
            );
        }
        if seen.insert(m.id.clone()) {
            let n: usize = std::str::from_utf8(&m.payload)?.parse()?;
            // The payload counts the aggregate's committed events from 0.
            ensure!(
                seq == n + 1,
                "event {} (#{n} of aggregate {}) carries aggregate_seq {seq}",
                m.id,
                m.aggregate_id
            );
            by_aggregate
                .entry(m.aggregate_id.clone())
                .or_default()
                .push(n);
        }
    }
    let mut expected: HashMap<String, Vec<usize>> = HashMap::new();
    for (agg, n) in committed {
        expected.entry(agg).or_default().push(n);
    }
    let total: usize = expected.values().map(Vec::len).sum();
    ensure!(
        seen.len() == total,
        "{} distinct events in JetStream, {total} committed",
        seen.len()
    );
    for (agg, ns) in &expected {
        ensure!(
            by_aggregate.get(agg) == Some(ns),
            "aggregate {agg}: JetStream has {:?}, commit order is {ns:?}",
            by_aggregate.get(agg)
        );
    }
    Ok(())
}
