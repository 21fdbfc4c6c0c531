//! Transactions larger than the spill threshold (`source.spill_after_events`, set low here):
//! their events go to a scratch file while the transaction is open and come back in batches
//! after its commit, each once, in commit order; a rolled-back one never appears; a source
//! that dies while loading one loses nothing. Memory is measured by the `cdc_spill_rss`
//! benchmark (`cdc_drain.rs`), not here.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;

use std::time::Duration;

use anyhow::{Context, ensure};
use cdc_support::CdcHarness;
use outbox_core::source::{Outcome, Settlement};
use outbox_core::stream_ledger::Spilled;
use outbox_core::{DeadLetterPolicy, Event, NewEvent, Ordering, Source};
use outbox_postgres::{PgCdcInspector, PgCdcSource};
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);
const THRESHOLD: usize = 1_000;
const BIG: usize = 20_000;

fn event(n: usize) -> NewEvent {
    NewEvent::new(
        "Order",
        format!("o-{}", n % 7),
        "order.changed",
        format!("{{\"n\":{n}}}"),
    )
    .with_header("n", n.to_string())
}

/// A harness whose sources spill past [`THRESHOLD`] events, into `dir` when given.
async fn harness(dir: Option<&std::path::Path>) -> anyhow::Result<CdcHarness> {
    let mut h = CdcHarness::new().await?;
    h.config.spill_after_events = THRESHOLD;
    h.config.spill_dir = dir.map(Into::into);
    h.config.validate().map_err(anyhow::Error::msg)?;
    Ok(h)
}

/// One transaction of `BIG` outbox rows with two table-less events among them; returns the
/// ids in write order. Rolled back instead of committed when `commit` is false.
async fn write_big(h: &CdcHarness, first: usize, commit: bool) -> anyhow::Result<Vec<Uuid>> {
    let mut tx = h.pool.begin().await?;
    let mut ids = Vec::with_capacity(BIG + 2);
    for chunk in 0..BIG / 1_000 {
        let events: Vec<NewEvent> = (0..1_000)
            .map(|i| event(first + chunk * 1_000 + i))
            .collect();
        ids.extend(h.outbox.enqueue_batch(&mut *tx, &events).await?);
        if chunk == 4 || chunk == 13 {
            let message = event(first + chunk).with_header("table_less", "yes");
            ids.push(outbox_postgres::emit_message(&mut *tx, &message).await?);
        }
    }
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(ids)
}

async fn write_one(h: &CdcHarness, n: usize) -> anyhow::Result<Uuid> {
    let mut tx = h.pool.begin().await?;
    let ids = h.outbox.enqueue_batch(&mut *tx, &[event(n)]).await?;
    tx.commit().await?;
    ids.into_iter().next().context("one id")
}

/// Fetches and settles as delivered, `batch` at a time, until `until` arrived or, with
/// `stop_after`, that many events were settled.
async fn drain(
    source: &mut PgCdcSource,
    until: Uuid,
    stop_after: Option<usize>,
) -> anyhow::Result<Vec<Uuid>> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    while !got.contains(&until) && stop_after.is_none_or(|n| got.len() < n) {
        ensure!(
            Instant::now() < deadline,
            "only {} events arrived, not the last one",
            got.len()
        );
        let fetched = source.fetch(500, OffsetDateTime::now_utc()).await?;
        if fetched.events.is_empty() {
            source.wait_for_events(Duration::from_millis(200)).await;
            continue;
        }
        let settle: Vec<Settlement> = fetched
            .events
            .iter()
            .map(|e: &Event| Settlement {
                position: e.position,
                outcome: Outcome::Delivered,
            })
            .collect();
        source.settle(&settle, OffsetDateTime::now_utc()).await?;
        got.extend(fetched.events.iter().map(|e| e.id));
    }
    Ok(got)
}

fn spilled(inspector: &PgCdcInspector) -> Spilled {
    inspector.spilled().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_past_the_spill_threshold_is_delivered_once_in_commit_order()
-> anyhow::Result<()> {
    let h = harness(None).await?;
    let mut expected = vec![write_one(&h, 0).await?];
    expected.extend(write_big(&h, 1, true).await?);
    let after_big: i64 =
        sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
            .fetch_one(&h.pool)
            .await?;
    let last = write_one(&h, BIG + 1).await?;
    expected.push(last);
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let inspector = source.inspector();
    let got = drain(&mut source, last, None).await?;
    ensure!(
        got.len() == expected.len(),
        "{} events delivered, {} written",
        got.len(),
        expected.len()
    );
    ensure!(
        got == expected,
        "not in commit order: first difference at {:?}",
        got.iter().zip(&expected).position(|(a, b)| a != b)
    );
    let spill = spilled(&inspector);
    ensure!(
        spill
            == Spilled {
                transactions: 1,
                events: (BIG + 2) as u64
            },
        "the big transaction was not taken from a scratch file: {spill:?}"
    );
    // Everything settled: on a clean stop the slot is confirmed past the big transaction.
    let closed = source.closed();
    drop(source);
    tokio::time::timeout(WAIT, closed.wait()).await?;
    let confirmed = h.confirmed_lsn().await?;
    ensure!(
        confirmed > after_big,
        "the slot stayed at {confirmed}, before the transaction after the big one ({after_big})"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolled_back_large_transaction_and_a_rolled_back_savepoint_publish_nothing()
-> anyhow::Result<()> {
    let h = harness(None).await?;
    write_big(&h, 0, false).await?;
    // A committed transaction past the threshold whose middle part was rolled back to a
    // savepoint: only the rest is published.
    let mut tx = h.pool.begin().await?;
    let kept_before = h
        .outbox
        .enqueue_batch(&mut *tx, &(0..1_500).map(event).collect::<Vec<_>>())
        .await?;
    sqlx::query("SAVEPOINT undone").execute(&mut *tx).await?;
    h.outbox
        .enqueue_batch(&mut *tx, &(1_500..4_000).map(event).collect::<Vec<_>>())
        .await?;
    sqlx::query("ROLLBACK TO SAVEPOINT undone")
        .execute(&mut *tx)
        .await?;
    let kept_after = h
        .outbox
        .enqueue_batch(&mut *tx, &(4_000..5_500).map(event).collect::<Vec<_>>())
        .await?;
    tx.commit().await?;
    let marker = write_one(&h, 99_999).await?;
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let inspector = source.inspector();
    let got = drain(&mut source, marker, None).await?;
    let mut expected = kept_before;
    expected.extend(kept_after);
    expected.push(marker);
    ensure!(
        got == expected,
        "{} events delivered, expected the {} committed ones in order",
        got.len(),
        expected.len()
    );
    // Only the committed transaction was spilled: an aborted one never reaches pgoutput v1.
    ensure!(
        spilled(&inspector)
            == Spilled {
                transactions: 1,
                events: 3_000
            },
        "spilled: {:?}",
        spilled(&inspector)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_source_killed_while_loading_a_spilled_transaction_loses_nothing() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("outbox-spill-test-{}", Uuid::now_v7()));
    std::fs::create_dir(&dir)?;
    let h = harness(Some(&dir)).await?;
    let mut expected = vec![write_one(&h, 0).await?];
    expected.extend(write_big(&h, 1, true).await?);
    let last = write_one(&h, BIG + 1).await?;
    expected.push(last);

    let mut first = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let inspector = first.inspector();
    let partial = drain(&mut first, last, Some(3_000)).await?;
    ensure!(
        partial[..] == expected[..partial.len()],
        "the first source's events are not a prefix in order"
    );
    ensure!(
        spilled(&inspector).transactions == 1,
        "not spilled: {:?}",
        spilled(&inspector)
    );
    let names: Vec<_> = std::fs::read_dir(&dir)?.collect();
    ensure!(
        names.is_empty(),
        "the scratch file has a name in source.spill_dir: {names:?}"
    );
    first.abort(); // kill -9: no final status update
    h.slot_released().await?;

    let mut second = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let again = drain(&mut second, last, None).await?;
    // The big transaction was not confirmed: it comes whole again (duplicates of what the first
    // source delivered), preceded at most by the small one before it.
    let start = expected.len() - again.len();
    ensure!(
        start <= 1 && again[..] == expected[start..],
        "after the restart {} events arrived, not the unconfirmed tail of {}",
        again.len(),
        expected.len()
    );
    ensure!(std::fs::read_dir(&dir)?.next().is_none());
    std::fs::remove_dir(&dir)?;
    Ok(())
}
