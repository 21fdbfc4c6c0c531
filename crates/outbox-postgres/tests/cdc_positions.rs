//! `aggregate_seq` from the CDC source (`outbox_core::aggregate_seq`, "Change streams"): every
//! event carries its aggregate's number in commit order, the same number again when a crash
//! makes the stream send it again, none skipped or reused; a dead letter (and the events
//! parked behind it) uses its number up, and `outbox dead retry` numbers them again after the
//! aggregate's last number.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use cdc_support::{CdcHarness, delivered};
use outbox_core::{DeadLetterPolicy, Event, NewEvent, Ordering, SinkErrorKind, Source};
use outbox_testkit::conformance::{RunningRelay, test_relay_config};
use outbox_testkit::faults::{Match, ScriptedSink, Times};
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

fn seq_of(e: &Event) -> Option<i64> {
    let mut found = e
        .headers
        .iter()
        .filter(|(n, _)| n == outbox_core::message::header::AGGREGATE_SEQ);
    let first = found.next()?.1.parse().ok();
    // One header, never two.
    found.next().is_none().then_some(first).flatten()
}

/// Each committed row's expected number: its rank by `seq` within its aggregate (the trigger
/// makes `seq` order commit order per aggregate).
async fn ranks(h: &CdcHarness) -> anyhow::Result<HashMap<Uuid, i64>> {
    let rows: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT id, row_number() OVER (PARTITION BY aggregate_type, aggregate_id ORDER BY seq) \
         FROM outbox",
    )
    .fetch_all(&h.pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Four producers write interleaved transactions of 1–3 events over six shared aggregates
/// (some rolled back) while a relay loop publishes; the loop "crashes" (drops the source
/// without a final status update or save, as `kill -9`) every few batches, sometimes with a
/// batch published and not settled, sometimes right after settling (its heads not saved
/// yet), and a new source takes the slot over. Every publish of an event carries the same
/// number, and the numbers are each aggregate's commit order 1, 2, 3, … exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn numbers_follow_commit_order_and_survive_crashes_mid_stream() -> anyhow::Result<()> {
    let h = Arc::new(CdcHarness::new().await?);
    let mut producers = Vec::new();
    for p in 0..4usize {
        let h = h.clone();
        producers.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            for t in 0..60usize {
                // Aggregates in one order in every transaction (docs/ordering.md: no deadlock).
                let mut events: Vec<NewEvent> = (0..1 + (t + p) % 3)
                    .map(|i| {
                        NewEvent::new(
                            "Order",
                            format!("o{}", (t * 7 + p * 3 + i) % 6),
                            "order.changed",
                            "{}",
                        )
                    })
                    .collect();
                events.sort_by(|a, b| a.aggregate_id.cmp(&b.aggregate_id));
                let mut tx = h.pool.begin().await?;
                let ids = h.outbox.enqueue_batch(&mut *tx, &events).await?;
                if t % 11 == 5 {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                    committed.extend(ids);
                }
                if t.is_multiple_of(6) {
                    tokio::task::yield_now().await;
                }
            }
            anyhow::Ok(committed)
        }));
    }

    // (id, number) of every publish, in publish order.
    let mut published: Vec<(Uuid, Option<i64>)> = Vec::new();
    let mut settled: HashSet<Uuid> = HashSet::new();
    let mut committed: Option<Vec<Uuid>> = None;
    let mut crashes = 0usize;
    let deadline = Instant::now() + WAIT;
    let mut round = 0usize;
    loop {
        if committed.is_none() && producers.iter().all(|p| p.is_finished()) {
            let mut all = Vec::new();
            for p in producers.drain(..) {
                all.extend(p.await??);
            }
            committed = Some(all);
        }
        if committed
            .as_ref()
            .is_some_and(|c| c.iter().all(|id| settled.contains(id)))
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "not everything was delivered: {} publishes, {crashes} crashes",
            published.len()
        );
        round += 1;
        let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::Skip)?;
        let batches = 1 + round % 4;
        let mut done = 0;
        let batch_deadline = Instant::now() + Duration::from_secs(10);
        while done < batches && Instant::now() < batch_deadline {
            let fetched = source.fetch(7, OffsetDateTime::now_utc()).await?;
            if fetched.events.is_empty() {
                source.wait_for_events(Duration::from_millis(50)).await;
                if committed.is_some() {
                    break; // a source that streams nothing more: start the next round
                }
                continue;
            }
            published.extend(fetched.events.iter().map(|e| (e.id, seq_of(e))));
            done += 1;
            if done == batches && round.is_multiple_of(2) {
                break; // crash with this batch published, not settled
            }
            source
                .settle(&delivered(&fetched.events), OffsetDateTime::now_utc())
                .await?;
            settled.extend(fetched.events.iter().map(|e| e.id));
        }
        source.abort();
        crashes += 1;
        h.slot_released().await?;
    }
    let committed = committed.unwrap_or_default();
    ensure!(crashes >= 5, "only {crashes} crashes");

    let expected = ranks(&h).await?;
    let mut number_of: HashMap<Uuid, i64> = HashMap::new();
    let mut republished = 0;
    for (id, n) in &published {
        let n = n.with_context(|| format!("event {id} was published without aggregate_seq"))?;
        match number_of.insert(*id, n) {
            Some(before) => {
                republished += 1;
                ensure!(
                    before == n,
                    "event {id} was published as {before}, then again as {n}"
                );
            }
            None => {
                let want = expected.get(id).copied();
                ensure!(
                    want == Some(n),
                    "event {id} carries {n}; its place in its aggregate's commit order is {want:?}"
                );
            }
        }
    }
    ensure!(
        number_of.len() == committed.len() && committed.len() == expected.len(),
        "{} events published, {} committed, {} rows",
        number_of.len(),
        committed.len(),
        expected.len()
    );
    ensure!(
        republished > 0,
        "no event was published twice: the crashes tested nothing"
    );
    tracing::info!(
        events = committed.len(),
        republished,
        crashes,
        "CDC numbering across crashes"
    );
    Ok(())
}

/// The rule: a dead letter uses its number up (it may have reached the broker), and so does
/// every event parked behind it (`hold-aggregate`); `outbox dead retry` re-inserts them, and
/// the stream numbers them as new deliveries, after the aggregate's last number. A clean
/// restart goes on from the saved heads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_uses_its_number_and_a_retry_numbers_the_aggregate_on() -> anyhow::Result<()>
{
    let h = CdcHarness::new().await?;
    let write = |aggregate: &'static str, n: usize| {
        let h = &h;
        async move {
            let mut tx = h.pool.begin().await?;
            let id = h
                .outbox
                .enqueue(
                    &mut *tx,
                    &NewEvent::new("Order", aggregate, "order.changed", format!("{n}")),
                )
                .await?;
            tx.commit().await?;
            anyhow::Ok(id)
        }
    };
    let x: Vec<Uuid> = {
        let mut ids = Vec::new();
        for n in 0..4 {
            ids.push(write("x", n).await?);
        }
        ids
    };
    let y = write("y", 0).await?;
    let sink = Arc::new(ScriptedSink::new());
    sink.fail(
        Match::EventId(x[1]),
        SinkErrorKind::Rejected,
        Times::Count(1),
    );
    let config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 3);
    let relay = RunningRelay::start(
        config.clone(),
        sink.clone(),
        vec![h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?],
    );
    h.wait_dead(3)
        .await
        .context("x[1] dead-lettered and x[2], x[3] parked behind it")?;
    sink.wait_for_published(2, WAIT).await?;
    relay.stop().await?;

    let dead = outbox_postgres::PgDeadLetters::new(h.pool.clone(), &h.config);
    let retried = dead
        .retry(&outbox_postgres::RetrySelection::Ids(vec![x[1]]))
        .await?;
    ensure!(retried.len() == 3, "re-streamed {retried:?}");
    let later = write("x", 4).await?;
    let relay = RunningRelay::start(
        config,
        sink.clone(),
        vec![h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?],
    );
    sink.wait_for_published(6, WAIT).await?;
    relay.stop().await?;

    let attempts: Vec<(Uuid, Option<i64>, bool)> = sink
        .attempts()
        .into_iter()
        .map(|a| (a.event.id, seq_of(&a.event), a.result.is_ok()))
        .collect();
    let expected = vec![
        (x[0], Some(1), true),
        (x[1], Some(2), false), // rejected: dead-lettered, 2 is used up
        (y, Some(1), true),
        // x[2] and x[3] were parked with 3 and 4, never published: used up too.
        (x[1], Some(5), true), // `dead retry`: new deliveries after the last number
        (x[2], Some(6), true),
        (x[3], Some(7), true),
        (later, Some(8), true),
    ];
    let mut got = attempts.clone();
    // y goes beside x: compare per aggregate, in order.
    got.sort_by_key(|(id, _, _)| *id == y);
    let mut want = expected.clone();
    want.sort_by_key(|(id, _, _)| *id == y);
    ensure!(
        got == want,
        "attempts (id, aggregate_seq, delivered):\n{attempts:?}\nexpected\n{expected:?}"
    );
    Ok(())
}

/// Saves are fenced by the slot's owner (migration 0008): once another relay took the slot
/// over (its claim writes a new owner id into the position's row, before it reads the
/// position), a save of the old relay, say one whose COMMIT reached the server late after a
/// `kill -9`, changes neither the position nor the heads the new owner numbers from.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_save_by_a_relay_that_lost_the_slot_changes_nothing() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let write = |n: usize| {
        let h = &h;
        async move {
            let mut tx = h.pool.begin().await?;
            h.outbox
                .enqueue(
                    &mut *tx,
                    &NewEvent::new("Order", "x", "order.changed", format!("{n}")),
                )
                .await?;
            tx.commit().await?;
            anyhow::Ok(())
        }
    };
    let saved = || async {
        let lsn: i64 = sqlx::query_scalar("SELECT confirmed_lsn FROM outbox_cdc_offsets")
            .fetch_one(&h.pool)
            .await?;
        let head: Option<i64> = sqlx::query_scalar(
            "SELECT last_position FROM outbox_aggregate_positions WHERE aggregate_id = 'x'",
        )
        .fetch_optional(&h.pool)
        .await?;
        anyhow::Ok((lsn, head))
    };
    for n in 0..3 {
        write(n).await?;
    }
    let mut old = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::Skip)?;
    ensure!(stream_settled(&mut old, 3).await? == [Some(1), Some(2), Some(3)]);
    let before = saved().await?;
    ensure!(
        before.1 == Some(3),
        "the owner's save wrote the heads: {before:?}"
    );

    for n in 3..6 {
        write(n).await?;
    }
    // What a relay taking the slot over does first (outbox_cdc_offset_claim.sql).
    sqlx::query("UPDATE outbox_cdc_offsets SET owner = gen_random_uuid()")
        .execute(&h.pool)
        .await?;
    ensure!(stream_settled(&mut old, 3).await? == [Some(4), Some(5), Some(6)]);
    ensure!(
        saved().await? == before,
        "a relay that no longer owns the slot saved its position or heads: {:?} after {before:?}",
        saved().await?
    );
    old.abort();
    h.slot_released().await?;

    // The next owner resumes from the last save of the owner it replaced: the stretch after
    // it streams again with the numbers it had.
    let mut next = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::Skip)?;
    ensure!(stream_settled(&mut next, 3).await? == [Some(4), Some(5), Some(6)]);
    ensure!(saved().await?.1 == Some(6), "the new owner saves");
    Ok(())
}

/// Fetches until `n` events came and settles them, each batch past the 100 ms between saves
/// (so each settle saves); returns their numbers.
async fn stream_settled(
    source: &mut outbox_postgres::PgCdcSource,
    n: usize,
) -> anyhow::Result<Vec<Option<i64>>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < n {
        ensure!(Instant::now() < deadline, "streamed {got:?}");
        let fetched = source.fetch(10, OffsetDateTime::now_utc()).await?;
        if fetched.events.is_empty() {
            source.wait_for_events(Duration::from_millis(50)).await;
            continue;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        source
            .settle(&delivered(&fetched.events), OffsetDateTime::now_utc())
            .await?;
        got.extend(fetched.events.iter().map(seq_of));
    }
    Ok(got)
}
