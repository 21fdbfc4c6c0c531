//! A lost replication slot (a failover to a standby before PostgreSQL 17, a drop) recovered by
//! the CDC source from the table, exactly: every row the lost slot had not acknowledged is
//! published once, in order per aggregate; nothing it had acknowledged is published again;
//! rows the new slot also streams are not published twice (docs/cdc.md, "Failover").
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use cdc_support::CdcHarness;
use outbox_core::source::{Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, Event, NewEvent, Ordering, Source, SourceErrorKind};
use outbox_postgres::{OnSlotLoss, PgCdcSource};
use outbox_testkit::conformance::Harness;
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new(
        "Order",
        aggregate,
        "order.changed",
        format!("{{\"n\":{n}}}"),
    )
    .with_header("n", n.to_string())
}

/// Writes `n` events over four aggregates, one transaction each; returns their ids in commit
/// order.
async fn write(h: &CdcHarness, from: usize, n: usize) -> anyhow::Result<Vec<Uuid>> {
    let mut ids = Vec::new();
    for i in from..from + n {
        ids.extend(
            h.write(vec![event(&format!("o{}", i % 4), i)], true)
                .await?,
        );
    }
    Ok(ids)
}

/// Fetches and delivers until `until` holds for what was delivered so far (each delivery in
/// order, duplicates included).
async fn deliver_until(
    source: &mut PgCdcSource,
    delivered: &mut Vec<Event>,
    mut until: impl FnMut(&[Event]) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    while !until(delivered) {
        ensure!(
            Instant::now() < deadline,
            "gave up after {} deliveries",
            delivered.len()
        );
        let fetched = source.fetch(500, OffsetDateTime::now_utc()).await?;
        if fetched.events.is_empty() {
            source.wait_for_events(Duration::from_millis(100)).await;
            continue;
        }
        let settle: Vec<Settlement> = fetched
            .events
            .iter()
            .map(|e| Settlement {
                position: e.position,
                outcome: Outcome::Delivered,
            })
            .collect();
        source.settle(&settle, OffsetDateTime::now_utc()).await?;
        delivered.extend(fetched.events);
    }
    Ok(())
}

/// One fetch, delivered and settled, then a short wait: drives a source that has nothing
/// left to say, collecting anything it still says.
async fn step(source: &mut PgCdcSource, delivered: &mut Vec<Event>) -> anyhow::Result<()> {
    let fetched = source.fetch(500, OffsetDateTime::now_utc()).await?;
    let settle: Vec<Settlement> = fetched
        .events
        .iter()
        .map(|e| Settlement {
            position: e.position,
            outcome: Outcome::Delivered,
        })
        .collect();
    source.settle(&settle, OffsetDateTime::now_utc()).await?;
    delivered.extend(fetched.events);
    source.wait_for_events(Duration::from_millis(100)).await;
    Ok(())
}

fn distinct(events: &[Event]) -> usize {
    events
        .iter()
        .map(|e| e.id)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// Rows of the outbox that the saved acknowledged snapshot sees (the recovery's own rule).
async fn acknowledged_rows(h: &CdcHarness) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM outbox AS o, outbox_cdc_offsets AS f \
         WHERE f.slot = $1 AND f.acked_snapshot IS NOT NULL \
           AND age(o.xmin) > age((pg_snapshot_xmax(f.acked_snapshot::pg_snapshot)::text::numeric % 4294967296)::text::xid) \
           AND o.xmin::text::bigint <> ALL (ARRAY(SELECT (x::text::numeric % 4294967296)::bigint \
                                                  FROM pg_snapshot_xip(f.acked_snapshot::pg_snapshot) AS x))",
    )
    .bind(h.config.slot.as_str())
    .fetch_one(&h.pool)
    .await?)
}

/// Delivers `ids` with a source, waits until the acknowledged snapshot covers them all (the
/// source keeps saving while idle), and stops the source cleanly.
async fn deliver_and_acknowledge(h: &CdcHarness, ids: &[Uuid]) -> anyhow::Result<()> {
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let mut delivered = Vec::new();
    deliver_until(&mut source, &mut delivered, |d| distinct(d) >= ids.len()).await?;
    let deadline = Instant::now() + WAIT;
    while acknowledged_rows(h).await? < ids.len() as i64 {
        ensure!(
            Instant::now() < deadline,
            "the acknowledged snapshot never covered the {} delivered rows ({} covered)",
            ids.len(),
            acknowledged_rows(h).await?
        );
        let fetched = source.fetch(500, OffsetDateTime::now_utc()).await?;
        ensure!(fetched.events.is_empty(), "nothing new was written");
        source.wait_for_events(Duration::from_millis(100)).await;
    }
    let closed = source.closed();
    drop(source);
    tokio::time::timeout(WAIT, closed.wait()).await?;
    h.slot_released().await
}

async fn drop_slot(h: &CdcHarness) -> anyhow::Result<()> {
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(h.config.slot.as_str())
        .execute(&h.pool)
        .await?;
    Ok(())
}

/// Per aggregate, the order of `delivered` is the order of `written`.
fn check_order(written: &[Uuid], delivered: &[Event]) -> anyhow::Result<()> {
    let rank: HashMap<Uuid, usize> = written.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut last: HashMap<&str, usize> = HashMap::new();
    for e in delivered {
        let r = *rank.get(&e.id).context("an event that was not written")?;
        if let Some(prev) = last.insert(e.aggregate_id.as_str(), r) {
            ensure!(
                prev < r,
                "aggregate {}: event #{r} delivered after #{prev}",
                e.aggregate_id
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_slot_is_recovered_from_the_table_exactly() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let acknowledged = write(&h, 0, 20).await?;
    deliver_and_acknowledge(&h, &acknowledged).await?;
    // Committed while the slot existed but never delivered, then committed while it was gone:
    // both must come from the table.
    let undelivered = write(&h, 20, 10).await?;
    drop_slot(&h).await?;
    let while_gone = write(&h, 30, 10).await?;

    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let mut delivered = Vec::new();
    deliver_until(&mut source, &mut delivered, |d| distinct(d) >= 20).await?;
    let after = write(&h, 40, 10).await?;
    deliver_until(&mut source, &mut delivered, |d| distinct(d) >= 30).await?;

    let expected: Vec<Uuid> = [&undelivered[..], &while_gone[..], &after[..]].concat();
    let got: Vec<Uuid> = delivered.iter().map(|e| e.id).collect();
    let republished: Vec<&Uuid> = got.iter().filter(|id| acknowledged.contains(id)).collect();
    ensure!(
        republished.is_empty(),
        "{} acknowledged events published again: {republished:?}",
        republished.len()
    );
    ensure!(
        got.len() == expected.len() && expected.iter().all(|id| got.contains(id)),
        "delivered {} events ({} distinct), expected exactly the {} unacknowledged ones",
        got.len(),
        distinct(&delivered),
        expected.len()
    );
    check_order(&expected, &delivered)?;

    // The recovery is recorded as done once its events are settled and the stream moved on.
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let status = outbox_postgres::recovery_status(&h.pool, &h.config)
            .await?
            .context("no recovery recorded")?;
        if !status.in_progress() {
            break status;
        }
        ensure!(
            Instant::now() < deadline,
            "the recovery never finished: {status:?}"
        );
        step(&mut source, &mut delivered).await?;
    };
    ensure!(
        delivered.len() == expected.len(),
        "{} more deliveries while the recovery finished",
        delivered.len() - expected.len()
    );
    ensure!(
        status.recovered_events == Some(20),
        "recovered {:?}, expected the 20 unacknowledged rows",
        status.recovered_events
    );
    let line = status.describe();
    ensure!(
        line.contains("20 events") && line.contains("table-less events"),
        "{line}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_the_new_slot_also_streams_are_published_once() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let acknowledged = write(&h, 0, 8).await?;
    deliver_and_acknowledge(&h, &acknowledged).await?;
    drop_slot(&h).await?;
    let while_gone = write(&h, 8, 6).await?;
    // `outbox migrate` finds the slot lost: it records the recovery and creates the slot.
    let report = outbox_postgres::setup_cdc(&h.pool, &h.config).await?;
    ensure!(report.slot_created && report.slot_recovery, "{report:?}");
    // Committed after the new slot exists and before any relay ran: the new slot streams
    // them, and the recovery's snapshot (taken by the relay) sees them in the table too.
    let both = write(&h, 14, 6).await?;

    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let mut delivered = Vec::new();
    deliver_until(&mut source, &mut delivered, |d| distinct(d) >= 12).await?;
    let after = write(&h, 20, 4).await?;
    deliver_until(&mut source, &mut delivered, |d| distinct(d) >= 16).await?;
    // Whatever the stream still had to say about the overlap has been said by now: the
    // recovery ends only after the stream passed it.
    let deadline = Instant::now() + WAIT;
    while outbox_postgres::recovery_status(&h.pool, &h.config)
        .await?
        .is_some_and(|s| s.in_progress())
    {
        ensure!(Instant::now() < deadline, "the recovery never finished");
        step(&mut source, &mut delivered).await?;
    }
    let expected: Vec<Uuid> = [&while_gone[..], &both[..], &after[..]].concat();
    let got: Vec<Uuid> = delivered.iter().map(|e| e.id).collect();
    ensure!(
        got.len() == expected.len() && expected.iter().all(|id| got.contains(id)),
        "delivered {got:?}, expected each of {expected:?} exactly once"
    );
    check_order(&expected, &delivered)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_slot_loss_stop_keeps_the_error_that_says_how_to_recover() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    drop_slot(&h).await?;
    let mut config = h.config.clone();
    config.on_slot_loss = OnSlotLoss::Stop;
    let mut source = PgCdcSource::new(
        h.pool.clone(),
        &config,
        Ordering::PerAggregate,
        DeadLetterPolicy::HoldAggregate,
    )?;
    let err = source
        .fetch(10, OffsetDateTime::now_utc())
        .await
        .expect_err("streaming without a slot");
    ensure!(err.kind() == SourceErrorKind::Fatal, "{err}");
    let message = err.to_string();
    ensure!(
        message.contains("does not exist")
            && message.contains("on_slot_loss")
            && message.contains("outbox migrate")
            && message.contains("docs/cdc.md#failover"),
        "{message}"
    );
    let slot: Option<String> =
        sqlx::query_scalar("SELECT slot_name::text FROM pg_replication_slots WHERE slot_name = $1")
            .bind(h.config.slot.as_str())
            .fetch_optional(&h.pool)
            .await?;
    ensure!(slot.is_none(), "a stopping relay created the slot");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_an_acknowledged_snapshot_the_relay_refuses_to_guess() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    drop_slot(&h).await?;
    sqlx::query("DELETE FROM outbox_cdc_offsets")
        .execute(&h.pool)
        .await?;
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let err = source
        .fetch(10, OffsetDateTime::now_utc())
        .await
        .expect_err("no snapshot to recover from");
    ensure!(err.kind() == SourceErrorKind::Fatal, "{err}");
    let message = err.to_string();
    ensure!(
        message.contains("no acknowledged snapshot") && message.contains("docs/cdc.md#failover"),
        "{message}"
    );
    Ok(())
}
