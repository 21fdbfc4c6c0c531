//! Tries hard to break per-aggregate order (guarantee 3): two relays with three pipelines
//! each, small batches, eight concurrent producers (library and plain-SQL), hot aggregates,
//! rollbacks, a producer transaction that sits on an aggregate for a while, and an idle
//! session pinning the xmin horizon.
//!
//! The oracle does not trust `seq`: each library producer bumps a per-aggregate counter row
//! (`UPDATE ... RETURNING n`) in the same transaction as its event, so the committed values of
//! `n` for one aggregate are exactly 1, 2, 3, ... in commit order, and a rolled-back
//! transaction's `n` is reused by the next one. The broker must see them in that order, with
//! no gap (no loss) and nothing from a rolled-back transaction (no phantom). Plain-SQL
//! producers write their own aggregates, and each one's events must arrive in its program
//! order.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_postgres::OnDelivered;
use outbox_testkit::conformance::{Harness, RunningRelay, test_relay_config};
use outbox_testkit::faults::ScriptedSink;
use rand::Rng;
use support::PgHarness;

const HOT: [&str; 3] = ["hot-a", "hot-b", "hot-c"];
const LIB_PRODUCERS: usize = 6;
const TX_PER_PRODUCER: usize = 60;
const RAW_PRODUCERS: usize = 2;
const RAW_TX: usize = 80;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_aggregate_order_survives_replicas_concurrent_producers_rollbacks_and_long_transactions()
-> anyhow::Result<()> {
    let h = Arc::new(PgHarness::new(OnDelivered::Delete).await?);
    sqlx::query("CREATE TABLE counters (aggregate_id text PRIMARY KEY, n bigint NOT NULL)")
        .execute(&h.pool)
        .await?;
    let aggregates: Vec<String> = HOT
        .iter()
        .map(|s| s.to_string())
        .chain((0..12).map(|i| format!("cold-{i}")))
        .collect();
    for a in &aggregates {
        sqlx::query("INSERT INTO counters VALUES ($1, 0)")
            .bind(a)
            .execute(&h.pool)
            .await?;
    }

    // An idle session holding a snapshot open: pins the xmin horizon for the whole run. Our
    // design must not depend on the horizon, so delivery must go on regardless.
    let mut pinning = h.pool.acquire().await?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *pinning)
        .await?;
    sqlx::query("SELECT count(*) FROM counters")
        .execute(&mut *pinning)
        .await?;

    let sink = Arc::new(ScriptedSink::new());
    sink.set_delay(Duration::from_millis(1));
    let mut config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 5);
    config.batch_size = std::num::NonZeroUsize::new(8).expect("nonzero");
    let mut relays = Vec::new();
    for _ in 0..2 {
        let mut sources = Vec::new();
        for _ in 0..3 {
            sources.push(
                h.source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)
                    .await?,
            );
        }
        relays.push(RunningRelay::start(config.clone(), sink.clone(), sources));
    }

    // A producer that holds hot-a's ordering lock for 500 ms mid-run: later producers of
    // hot-a must wait behind it, and its event must still arrive in its place.
    let slow = {
        let h = h.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut tx = h.pool.begin().await?;
            let n: i64 = sqlx::query_scalar(
                "UPDATE counters SET n = n + 1 WHERE aggregate_id = 'hot-a' RETURNING n",
            )
            .fetch_one(&mut *tx)
            .await?;
            h.outbox
                .enqueue(
                    &mut *tx,
                    &NewEvent::new("Order", "hot-a", "slow", n.to_string()),
                )
                .await?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.commit().await?;
            anyhow::Ok(1usize)
        })
    };

    let mut producers = Vec::new();
    for p in 0..LIB_PRODUCERS {
        let h = h.clone();
        let aggregates = aggregates.clone();
        producers.push(tokio::spawn(async move {
            let mut committed = 0usize;
            for _ in 0..TX_PER_PRODUCER {
                let (agg, rollback, events_in_tx) = {
                    let mut rng = rand::rng();
                    let agg = if rng.random_bool(0.6) {
                        HOT[rng.random_range(0..HOT.len())].to_owned()
                    } else {
                        aggregates[rng.random_range(0..aggregates.len())].clone()
                    };
                    (agg, rng.random_bool(0.2), rng.random_range(1..=3))
                };
                let mut tx = h.pool.begin().await?;
                let mut batch = Vec::new();
                for _ in 0..events_in_tx {
                    let n: i64 = sqlx::query_scalar(
                        "UPDATE counters SET n = n + 1 WHERE aggregate_id = $1 RETURNING n",
                    )
                    .bind(&agg)
                    .fetch_one(&mut *tx)
                    .await?;
                    batch.push(
                        NewEvent::new("Order", agg.clone(), "counted", n.to_string())
                            .with_header("producer", p.to_string()),
                    );
                }
                h.outbox.enqueue_batch(&mut *tx, &batch).await?;
                if rollback {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                    committed += events_in_tx;
                }
            }
            anyhow::Ok(committed)
        }));
    }
    // Plain SQL producers, as another language would write: no library, no counter.
    for p in 0..RAW_PRODUCERS {
        let h = h.clone();
        producers.push(tokio::spawn(async move {
            let mut committed = 0usize;
            for i in 0..RAW_TX {
                let agg = format!("raw-{}", i % 3);
                let rollback = i % 7 == 3;
                let mut tx = h.pool.begin().await?;
                sqlx::query(
                    "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Raw', $1, 'raw.written', convert_to($2, 'UTF8'))",
                )
                .bind(&agg)
                .bind(format!("{p}:{i}"))
                .execute(&mut *tx)
                .await?;
                if rollback {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                    committed += 1;
                }
            }
            anyhow::Ok(committed)
        }));
    }
    let mut expected_total = slow.await??;
    for p in producers {
        expected_total += p.await??;
    }
    let published = sink
        .wait_for_published(expected_total, Duration::from_secs(60))
        .await
        .context("not every committed event was published")?;
    for r in relays {
        r.stop().await?;
    }
    sqlx::query("ROLLBACK").execute(&mut *pinning).await?;

    // Dedupe redeliveries (at-least-once), keep first deliveries in broker order.
    let mut seen = std::collections::HashSet::new();
    let firsts: Vec<_> = published
        .into_iter()
        .filter(|e| seen.insert(e.id))
        .collect();
    ensure!(
        firsts.len() == expected_total,
        "{} distinct events published, {expected_total} committed",
        firsts.len()
    );

    let mut counted: HashMap<String, Vec<i64>> = HashMap::new();
    let mut raw: HashMap<(String, String), Vec<usize>> = HashMap::new();
    for e in &firsts {
        let body = std::str::from_utf8(&e.payload)?;
        if e.aggregate_type == "Order" {
            counted
                .entry(e.aggregate_id.clone())
                .or_default()
                .push(body.parse()?);
        } else {
            let (p, i) = body.split_once(':').context("raw payload")?;
            raw.entry((e.aggregate_id.clone(), p.to_owned()))
                .or_default()
                .push(i.parse()?);
        }
    }
    for (agg, ns) in &counted {
        let expected: Vec<i64> = (1..=ns.len() as i64).collect();
        ensure!(
            *ns == expected,
            "aggregate {agg}: broker saw counter values {ns:?}; commit order is 1..={}",
            ns.len()
        );
        let final_n: i64 = sqlx::query_scalar("SELECT n FROM counters WHERE aggregate_id = $1")
            .bind(agg)
            .fetch_one(&h.pool)
            .await?;
        ensure!(
            final_n == ns.len() as i64,
            "aggregate {agg}: {final_n} committed, {} published",
            ns.len()
        );
    }
    ensure!(
        counted.get("hot-a").is_some_and(|v| v.len() > 10),
        "hot-a saw too little traffic to test anything"
    );
    for (key, is) in &raw {
        ensure!(
            is.windows(2).all(|w| w[0] < w[1]),
            "plain-SQL producer {key:?}: program order broken: {is:?}"
        );
        ensure!(
            is.iter().all(|i| i % 7 != 3),
            "plain-SQL producer {key:?}: a rolled-back event was published"
        );
    }
    Ok(())
}
