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
use outbox_core::stream_ledger::Spilled;
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_postgres::{PgCdcInspector, PgCdcSource};
use uuid::Uuid;

/// How long a drain may go without a new event (the wait follows progress); also the bound
/// on waiting for a closed connection.
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

async fn drain(
    source: &mut PgCdcSource,
    until: Uuid,
    stop_after: Option<usize>,
) -> anyhow::Result<Vec<Uuid>> {
    outbox_testkit::wait::settle_until(source, until, stop_after, 500, WAIT).await
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

/// Reads a positive number from the environment variable `name`.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A memory benchmark, not a correctness test (docs/benchmarks.md, "CDC: one huge
/// transaction"): one transaction of `OUTBOX_SPILL_BENCH_EVENTS` (default 1,000,000) outbox rows
/// with 200-byte payloads, written by the server itself, then streamed by the CDC source with
/// the default spill settings, fetched and settled 500 at a time as the relay does; prints
/// this process's peak RSS (`VmHWM`, reset after the write). `OUTBOX_SPILL_AFTER_EVENTS=0`
/// turns spilling off (the whole transaction in memory, as before issue 36).
///
/// ```text
/// cargo test --release -p outbox-postgres --test cdc_spill -- --ignored --nocapture
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --release --ignored --nocapture"]
async fn cdc_spill_rss() -> anyhow::Result<()> {
    let events: usize = env_number("OUTBOX_SPILL_BENCH_EVENTS").unwrap_or(1_000_000);
    let mut h = CdcHarness::new().await?;
    if env_number::<usize>("OUTBOX_SPILL_AFTER_EVENTS") == Some(0) {
        h.config.spill_after_events = usize::MAX;
        h.config.spill_after_bytes = u64::MAX;
    }
    let started = std::time::Instant::now();
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'Order', 'o-' || (g % 1000), 'order.placed', convert_to(lpad(g::text, 200, 'x'), 'UTF8') \
         FROM generate_series(1, $1) g",
    )
    .bind(i64::try_from(events)?)
    .execute(&h.pool)
    .await?;
    eprintln!(
        "wrote {events} events in one transaction in {:.1?}",
        started.elapsed()
    );
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let inspector = source.inspector();
    let run = outbox_testkit::memory::measure(outbox_testkit::wait::settle_count(
        &mut source,
        events,
        500,
        Duration::from_secs(1800),
    ))
    .await;
    run.output?;
    eprintln!(
        "spill_after_events = {}: {events} events streamed and settled in {:.1?} ({:.0} events/s); \
         RSS before {:.1} MiB, peak (VmHWM) {:.1} MiB; spilled {:?}",
        h.config.spill_after_events,
        run.took,
        events as f64 / run.took.as_secs_f64(),
        run.rss_before_mib,
        run.peak_rss_mib,
        inspector.spilled().unwrap_or_default()
    );
    Ok(())
}
