//! The CDC source against a real PostgreSQL with `wal_level = logical`: resume from the slot
//! after a clean stop and after a crash, standby takeover, table-less events, dead letters,
//! slot lag, the idle heartbeat, total order with concurrent producers, and setup errors.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use cdc_support::{CdcHarness, delivered};
use outbox_core::source::{Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, Event, NewEvent, Ordering, SinkErrorKind, Source};
use outbox_postgres::PgCdcSource;
use outbox_testkit::conformance::{Harness, RunningRelay, test_relay_config};
use outbox_testkit::faults::{Match, ScriptedSink, Times};
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new(
        "Order",
        aggregate,
        "order.changed",
        format!("{{\"n\":{n}}}"),
    )
    .with_header("n", n.to_string())
}

/// Fetches until at least `n` events arrived (the stream delivers asynchronously).
async fn fetch_at_least(source: &mut PgCdcSource, n: usize) -> anyhow::Result<Vec<Event>> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        ensure!(
            Instant::now() < deadline,
            "only {} of {n} events arrived",
            got.len()
        );
        let fetched = source.fetch(1000, OffsetDateTime::now_utc()).await?;
        if fetched.events.is_empty() {
            source.wait_for_events(Duration::from_millis(200)).await;
            continue;
        }
        got.extend(fetched.events);
        // Settle nothing yet: callers decide. Keep them in flight by not fetching again
        // unless more are needed (a fetch without settle releases them).
        if got.len() < n {
            let settle: Vec<Settlement> = got
                .iter()
                .map(|e| Settlement {
                    position: e.position,
                    outcome: Outcome::Released,
                })
                .collect();
            source.settle(&settle, OffsetDateTime::now_utc()).await?;
            got.clear();
        }
    }
    Ok(got)
}

fn ids(events: &[Event]) -> Vec<Uuid> {
    events.iter().map(|e| e.id).collect()
}

async fn write_each(h: &CdcHarness, events: Vec<NewEvent>) -> anyhow::Result<Vec<Uuid>> {
    let mut all = Vec::new();
    for e in events {
        all.extend(h.write(vec![e], true).await?);
    }
    Ok(all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clean_stop_confirms_what_was_settled_and_the_next_source_resumes_after_it()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let first = write_each(&h, (0..2).map(|i| event("a", i)).collect()).await?;
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let batch = fetch_at_least(&mut source, 2).await?;
    ensure!(ids(&batch) == first, "first batch {:?}", ids(&batch));
    source
        .settle(&delivered(&batch), OffsetDateTime::now_utc())
        .await?;
    let second = write_each(&h, (2..4).map(|i| event("a", i)).collect()).await?;
    let unsettled = fetch_at_least(&mut source, 2).await?;
    ensure!(
        ids(&unsettled) == second,
        "second batch {:?}",
        ids(&unsettled)
    );
    // Dropped mid-batch, without settling: a clean stop (final standby status update).
    let closed = source.closed();
    drop(source);
    tokio::time::timeout(WAIT, closed.wait()).await?;
    let mut next = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let again = fetch_at_least(&mut next, 2).await?;
    ensure!(
        ids(&again) == second,
        "after the restart the source returned {:?}, expected only the unsettled {second:?}",
        ids(&again)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_without_the_final_status_update_republishes_only_an_unconfirmed_tail()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let all = write_each(
        &h,
        (0..6)
            .map(|i| event(&format!("agg-{}", i % 3), i))
            .collect(),
    )
    .await?;
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let batch = fetch_at_least(&mut source, 6).await?;
    ensure!(ids(&batch) == all);
    // The first four are acknowledged, the last two are in flight when the relay dies.
    let mut settle = delivered(&batch[..4]);
    settle.extend(batch[4..].iter().map(|e| Settlement {
        position: e.position,
        outcome: Outcome::Released,
    }));
    source.settle(&settle, OffsetDateTime::now_utc()).await?;
    source.abort(); // kill -9: no final status update, no clean end of the session
    let later = write_each(&h, vec![event("agg-0", 6)]).await?;
    let mut next = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let mut expected_tail: Vec<Uuid> = all[4..].to_vec();
    expected_tail.extend(&later);
    let again = fetch_at_least(&mut next, expected_tail.len()).await?;
    let got = ids(&again);
    // Whatever was not confirmed comes again, in order, and it is a contiguous tail: the
    // unsettled events and the new one always, acknowledged ones only if their confirmation
    // had not reached the server.
    let mut expected = all.clone();
    expected.extend(&later);
    let start = expected.len() - got.len();
    ensure!(
        got == expected[start..],
        "after the crash the source returned {got:?}, not a tail of {expected:?}"
    );
    ensure!(start <= 4, "unsettled events were lost: got {got:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_takes_over_within_seconds_when_the_active_source_dies() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let first = h.write(vec![event("t", 0)], true).await?;
    let mut active = h.cdc_source(Ordering::Total, DeadLetterPolicy::HoldAggregate)?;
    let mut standby = h.cdc_source(Ordering::Total, DeadLetterPolicy::HoldAggregate)?;
    let got = fetch_at_least(&mut active, 1).await?;
    ensure!(ids(&got) == first);
    ensure!(active.is_streaming());
    let nothing = standby.fetch(10, OffsetDateTime::now_utc()).await?;
    ensure!(
        nothing.events.is_empty() && !standby.is_streaming(),
        "two sources stream from one slot"
    );
    active
        .settle(&delivered(&got), OffsetDateTime::now_utc())
        .await?;
    active.abort();
    let died = Instant::now();
    let second = h.write(vec![event("t", 1)], true).await?;
    let taken = fetch_at_least(&mut standby, 1).await?;
    let took = died.elapsed();
    ensure!(standby.is_streaming(), "the standby does not hold the slot");
    ensure!(took < Duration::from_secs(5), "takeover took {took:?}");
    let taken_ids = ids(&taken);
    ensure!(
        taken_ids.ends_with(&second)
            && taken_ids
                .iter()
                .all(|id| first.contains(id) || second.contains(id)),
        "the standby returned {taken_ids:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn table_less_events_are_delivered_with_the_exact_message_contract_in_commit_order()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let sink = Arc::new(ScriptedSink::new());
    let relay = RunningRelay::start(
        test_relay_config(Ordering::Total, DeadLetterPolicy::HoldAggregate, 3),
        sink.clone(),
        vec![h.cdc_source(Ordering::Total, DeadLetterPolicy::HoldAggregate)?],
    );
    let binary: Vec<u8> = vec![0, 1, 2, 255, b'\n', b'\\', b'x', 0x80];
    let message = NewEvent::new("Invoice", "i-7", "invoice.issued", binary.clone())
        .with_id(Uuid::now_v7())
        .with_header("tenant", "acme")
        .with_header("quote", "a\"b\nc");
    let mut tx = h.pool.begin().await?;
    let row1 = h.outbox.enqueue(&mut *tx, &event("o-1", 1)).await?;
    let msg_id = outbox_postgres::emit_message(&mut *tx, &message).await?;
    let row2 = h.outbox.enqueue(&mut *tx, &event("o-1", 2)).await?;
    tx.commit().await?;
    // Rolled back: never delivered. Another prefix: not ours.
    let mut tx = h.pool.begin().await?;
    outbox_postgres::emit_message(&mut *tx, &event("ghost", 1)).await?;
    tx.rollback().await?;
    outbox_postgres::emit_message_with_prefix(&h.pool, "other", &event("foreign", 1)).await?;
    let last = outbox_postgres::emit_message(&h.pool, &event("o-1", 3)).await?;
    let published = sink.wait_for_published(4, WAIT).await?;
    let extra = sink.wait_for_published(5, Duration::from_millis(300)).await;
    relay.stop().await?;
    ensure!(
        extra.is_err(),
        "more than 4 events: {:?}",
        ids(&sink.published())
    );
    ensure!(
        ids(&published) == vec![row1, msg_id, row2, last],
        "published {:?}",
        ids(&published)
    );
    let m = &published[1];
    ensure!(m.aggregate_type == "Invoice" && m.aggregate_id == "i-7");
    ensure!(m.event_type == "invoice.issued");
    ensure!(m.payload[..] == binary[..], "payload {:?}", m.payload);
    let mut headers = m.headers.clone();
    headers.sort();
    ensure!(
        headers
            == vec![
                // Its aggregate's first event: table-less events are numbered like rows.
                ("aggregate_seq".to_owned(), "1".to_owned()),
                ("quote".to_owned(), "a\"b\nc".to_owned()),
                ("tenant".to_owned(), "acme".to_owned())
            ],
        "headers {headers:?}"
    );
    ensure!(
        h.stored(msg_id).await?.is_none(),
        "a table-less event has a row"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_lettered_table_less_event_becomes_a_dead_row_and_holds_its_aggregate()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let sink = Arc::new(ScriptedSink::new());
    let poison = NewEvent::new("Invoice", "i-9", "invoice.issued", &b"poison"[..])
        .with_id(Uuid::now_v7())
        .with_header("k", "v");
    sink.fail(
        Match::EventId(poison.id.context("id")?),
        SinkErrorKind::Rejected,
        Times::Forever,
    );
    let poison_id = outbox_postgres::emit_message(&h.pool, &poison).await?;
    let behind = outbox_postgres::emit_message(
        &h.pool,
        &NewEvent::new("Invoice", "i-9", "invoice.paid", &b"behind"[..]),
    )
    .await?;
    let other = outbox_postgres::emit_message(&h.pool, &event("fine", 1)).await?;
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 3),
        sink.clone(),
        vec![h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?],
    );
    sink.wait_for_published(1, WAIT).await?;
    h.wait_dead(2)
        .await
        .context("the poison event and the one behind it were not both dead-lettered")?;
    let extra = sink.wait_for_published(2, Duration::from_millis(300)).await;
    let report = relay.stop().await?;
    ensure!(extra.is_err(), "published {:?}", ids(&sink.published()));
    ensure!(ids(&sink.published()) == vec![other]);
    ensure!(report.dead_lettered == 1, "{report:?}");
    let row: (String, Vec<u8>, serde_json::Value, i32, Option<String>) = sqlx::query_as(
        "SELECT event_type, payload, headers, attempts, last_error FROM outbox WHERE id = $1",
    )
    .bind(poison_id)
    .fetch_one(&h.pool)
    .await?;
    ensure!(
        row.0 == "invoice.issued" && row.1 == b"poison" && row.3 == 1,
        "{row:?}"
    );
    ensure!(row.2 == serde_json::json!({"k": "v"}), "{row:?}");
    let held: Option<String> =
        sqlx::query_scalar("SELECT last_error FROM outbox WHERE id = $1 AND state = 'dead'")
            .bind(behind)
            .fetch_one(&h.pool)
            .await?;
    ensure!(
        held.as_deref().is_some_and(|e| e.starts_with("held")),
        "the event behind the dead letter: {held:?}"
    );
    Ok(())
}

/// The recovery SQL of docs/cdc.md: re-insert an aggregate's dead letters in one transaction.
const REPUBLISH_DEAD: &str = "
CREATE TEMP TABLE outbox_retry ON COMMIT DROP AS
    SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq, last_error
    FROM outbox WHERE state = 'dead' AND aggregate_type = $1 AND aggregate_id = $2;
";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letters_republished_with_the_documented_sql_are_delivered_in_order()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let sink = Arc::new(ScriptedSink::new());
    let ids_written = write_each(&h, (0..3).map(|i| event("held", i)).collect()).await?;
    sink.fail(
        Match::EventId(ids_written[0]),
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
        .context("the aggregate was not parked behind its dead letter")?;
    ensure!(sink.published().is_empty());
    // The operator retries the aggregate (docs/cdc.md, "Dead letters").
    let mut tx = h.pool.begin().await?;
    sqlx::query(REPUBLISH_DEAD.trim())
        .bind("Order")
        .bind("held")
        .execute(&mut *tx)
        .await?;
    sqlx::query("DELETE FROM outbox WHERE id IN (SELECT id FROM outbox_retry)")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT set_config('outbox.keep_seq', 'on', true)")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq, last_error) \
         SELECT id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, seq, last_error \
         FROM outbox_retry ORDER BY seq",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let published = sink.wait_for_published(3, WAIT).await?;
    relay.stop().await?;
    ensure!(
        ids(&published) == ids_written,
        "published {:?}",
        ids(&published)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slot_lag_grows_while_the_relay_is_stopped_and_falls_after_it_ran() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let inspector = outbox_postgres::PgCdcInspector::new(h.pool.clone(), &h.config);
    let lag = |s: Option<outbox_postgres::SlotStatus>| -> anyhow::Result<i64> {
        s.context("slot missing")?
            .retained_wal_bytes
            .context("no retained_wal_bytes")
    };
    let before = lag(inspector.check_slot().await?)?;
    for chunk in 0..10 {
        h.write(
            (0..20)
                .map(|i| event(&format!("lag-{i}"), chunk * 20 + i))
                .collect(),
            true,
        )
        .await?;
    }
    let stopped = lag(inspector.check_slot().await?)?;
    ensure!(
        stopped > before + 10_000,
        "lag did not grow while stopped: {before} -> {stopped}"
    );
    let backlog_end: i64 =
        sqlx::query_scalar("SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint")
            .fetch_one(&h.pool)
            .await?;
    let sink = Arc::new(ScriptedSink::new());
    let source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let closed = source.closed();
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 3),
        sink.clone(),
        vec![source],
    );
    sink.wait_for_published(200, WAIT).await?;
    // Other tests write WAL on the same server meanwhile: the running relay keeps confirming
    // the server's position (heartbeat), so the lag falls and stays small.
    let fell = outbox_testkit::wait::eventually(WAIT, || {
        let inspector = inspector.clone();
        async move {
            matches!(inspector.check_slot().await, Ok(Some(s))
                if s.retained_wal_bytes.is_some_and(|b| b < stopped / 4))
        }
    })
    .await;
    relay.stop().await?;
    tokio::time::timeout(WAIT, closed.wait()).await?;
    let after = inspector.check_slot().await?;
    ensure!(
        fell.is_ok(),
        "lag did not fall while the relay ran: {stopped} -> {after:?}"
    );
    let confirmed = h.confirmed_lsn().await?;
    ensure!(
        confirmed >= backlog_end,
        "the slot is confirmed up to {confirmed}, short of the backlog's end {backlog_end}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_outbox_still_lets_the_slot_advance_past_unrelated_wal() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let mut source = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let nothing = source.fetch(10, OffsetDateTime::now_utc()).await?;
    ensure!(nothing.events.is_empty() && source.is_streaming());
    sqlx::raw_sql(
        "CREATE TABLE unrelated (n int); INSERT INTO unrelated SELECT generate_series(1, 5000);",
    )
    .execute(&h.pool)
    .await?;
    let target: i64 =
        sqlx::query_scalar("SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint")
            .fetch_one(&h.pool)
            .await?;
    let deadline = Instant::now() + WAIT;
    loop {
        // The relay's idle loop: wait for events (here: keepalives), fetch nothing.
        source.wait_for_events(Duration::from_millis(200)).await;
        let f = source.fetch(10, OffsetDateTime::now_utc()).await?;
        ensure!(f.events.is_empty(), "unrelated writes produced events");
        if h.confirmed_lsn().await? >= target {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the slot did not advance while the outbox was quiet"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn total_order_holds_across_many_aggregates_with_concurrent_producers() -> anyhow::Result<()>
{
    total_order(false).await
}

/// Total order while one event is retried: nothing after it may reach the broker first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn total_order_holds_while_an_event_is_retried() -> anyhow::Result<()> {
    total_order(true).await
}

async fn total_order(with_retry: bool) -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    // The commit-order oracle: each transaction increments one counter row first and holds
    // its lock until commit, so counter order is commit order.
    sqlx::raw_sql(
        "CREATE TABLE commit_counter (n bigint NOT NULL); INSERT INTO commit_counter VALUES (0);",
    )
    .execute(&h.pool)
    .await?;
    let sink = Arc::new(ScriptedSink::new());
    let relay = RunningRelay::start(
        test_relay_config(Ordering::Total, DeadLetterPolicy::HoldAggregate, 10),
        sink.clone(),
        vec![h.cdc_source(Ordering::Total, DeadLetterPolicy::HoldAggregate)?],
    );
    let (producers, per_producer) = (4, 40);
    let mut tasks = Vec::new();
    let flaky = Uuid::now_v7();
    if with_retry {
        sink.fail(
            Match::EventId(flaky),
            SinkErrorKind::Transient,
            Times::Count(2),
        );
    }
    for p in 0..producers {
        let pool = h.pool.clone();
        let outbox = h.outbox.clone();
        tasks.push(tokio::spawn(async move {
            for t in 0..per_producer {
                let mut tx = pool.begin().await?;
                let n: i64 = sqlx::query_scalar("UPDATE commit_counter SET n = n + 1 RETURNING n")
                    .fetch_one(&mut *tx)
                    .await?;
                for i in 0..2 {
                    let mut e = NewEvent::new(
                        "Account",
                        format!("acc-{}", (p * 7 + t * 3 + i) % 25),
                        "account.changed",
                        &b"{}"[..],
                    )
                    .with_header("n", n.to_string())
                    .with_header("i", i.to_string());
                    if p == 1 && t == 5 && i == 0 {
                        e = e.with_id(flaky);
                    }
                    outbox.enqueue(&mut *tx, &e).await?;
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let total = producers * per_producer * 2;
    let published = sink.wait_for_published(total, WAIT).await?;
    relay.stop().await?;
    let header = |e: &Event, k: &str| -> anyhow::Result<i64> {
        Ok(e.headers
            .iter()
            .find(|(name, _)| name == k)
            .context("header")?
            .1
            .parse()?)
    };
    let mut seen = HashSet::new();
    let mut order = Vec::new();
    for e in &published {
        if seen.insert(e.id) {
            order.push((header(e, "n")?, header(e, "i")?, e.position.0, e.attempts));
        }
    }
    ensure!(
        order.len() == total,
        "{} distinct events of {total}",
        order.len()
    );
    let mut sorted = order.clone();
    sorted.sort();
    if let Some(at) = order.iter().zip(&sorted).position(|(a, b)| a != b) {
        anyhow::bail!(
            "broker order differs from commit order at {at}: broker {:?}, commit {:?}",
            &order[at.saturating_sub(3)..(at + 6).min(order.len())],
            &sorted[at.saturating_sub(3)..(at + 6).min(sorted.len())]
        );
    }
    if !with_retry {
        return Ok(());
    }
    // The retried event delayed everything after it, and was not overtaken.
    let attempts = sink.attempts();
    let flaky_acked = attempts
        .iter()
        .position(|a| a.event.id == flaky && a.result.is_ok())
        .context("flaky event never acknowledged")?;
    let first_flaky = attempts
        .iter()
        .position(|a| a.event.id == flaky)
        .context("flaky event never attempted")?;
    let between: Vec<_> = attempts[first_flaky..flaky_acked]
        .iter()
        .filter(|a| a.event.id != flaky && a.result.is_ok())
        .collect();
    ensure!(
        between.is_empty(),
        "{} events overtook a retried event",
        between.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cdc_setup_is_idempotent_and_publishes_inserts_only() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let again = outbox_postgres::setup_cdc(&h.pool, &h.config).await?;
    ensure!(
        !again.publication_created && !again.slot_created && again.slot_lsn.is_some(),
        "{again:?}"
    );
    let (ins, upd, del): (bool, bool, bool) = sqlx::query_as(
        "SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = $1",
    )
    .bind(h.config.publication.as_str())
    .fetch_one(&h.pool)
    .await?;
    ensure!(ins && !upd && !del);
    let plugin: String =
        sqlx::query_scalar("SELECT plugin FROM pg_replication_slots WHERE slot_name = $1")
            .bind(h.config.slot.as_str())
            .fetch_one(&h.pool)
            .await?;
    ensure!(plugin == "pgoutput");
    Ok(())
}

/// `outbox dead retry` in CDC mode (`PgDeadLetters::retry`) re-streams the dead letter and the
/// events parked behind it, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_letter_retry_restreams_the_aggregate_in_order() -> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let sink = Arc::new(ScriptedSink::new());
    let ids_written = write_each(&h, (0..3).map(|i| event("retried", i)).collect()).await?;
    sink.fail(
        Match::EventId(ids_written[0]),
        SinkErrorKind::Rejected,
        Times::Count(1),
    );
    let config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 3);
    let relay = RunningRelay::start(
        config,
        sink.clone(),
        vec![h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?],
    );
    h.wait_dead(3)
        .await
        .context("the aggregate was not parked behind its dead letter")?;
    let dead = outbox_postgres::PgDeadLetters::new(h.pool.clone(), &h.config);
    let retried = dead
        .retry(&outbox_postgres::RetrySelection::Ids(vec![ids_written[0]]))
        .await?;
    ensure!(retried.len() == 3, "re-streamed {retried:?}");
    let published = sink.wait_for_published(3, WAIT).await?;
    relay.stop().await?;
    ensure!(
        ids(&published) == ids_written,
        "published {:?}",
        ids(&published)
    );
    Ok(())
}

/// `outbox dead retry` while no relay runs, with the event behind the dead letter still in the
/// slot's unconfirmed tail: the next relay streams that event first (it committed before the
/// retry), yet publishes the retried dead letter before it, and unmarks it once delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_retried_between_relays_still_goes_before_the_event_behind_it()
-> anyhow::Result<()> {
    let h = CdcHarness::new().await?;
    let written = write_each(&h, (0..2).map(|i| event("between", i)).collect()).await?;
    let (poison, behind) = (written[0], written[1]);
    let mut first = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let batch = fetch_at_least(&mut first, 1).await?;
    ensure!(ids(&batch)[0] == poison, "first batch {:?}", ids(&batch));
    let settle: Vec<Settlement> = batch
        .iter()
        .map(|e| Settlement {
            position: e.position,
            outcome: if e.id == poison {
                Outcome::DeadLetter {
                    reason: "rejected by the broker".into(),
                }
            } else {
                Outcome::Released
            },
        })
        .collect();
    first.settle(&settle, OffsetDateTime::now_utc()).await?;
    // Stopped before it parked the event behind: that one stays pending and unconfirmed.
    let closed = first.closed();
    drop(first);
    tokio::time::timeout(WAIT, closed.wait()).await?;
    let state: String = sqlx::query_scalar("SELECT state FROM outbox WHERE id = $1")
        .bind(behind)
        .fetch_one(&h.pool)
        .await?;
    ensure!(state == "pending", "the event behind is {state}");

    let dead = outbox_postgres::PgDeadLetters::new(h.pool.clone(), &h.config);
    let retried = dead
        .retry(&outbox_postgres::RetrySelection::Ids(vec![poison]))
        .await?;
    ensure!(retried == vec![poison], "retried {retried:?}");
    let seqs: Vec<(Uuid, i64)> = sqlx::query_as("SELECT id, seq FROM outbox ORDER BY seq")
        .fetch_all(&h.pool)
        .await?;
    ensure!(
        seqs.iter().map(|(id, _)| *id).collect::<Vec<_>>() == written,
        "the retried row keeps its seq: {seqs:?}"
    );

    let mut second = h.cdc_source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)?;
    let mut order = Vec::new();
    let deadline = Instant::now() + WAIT;
    while !(order.contains(&poison) && order.contains(&behind)) {
        ensure!(Instant::now() < deadline, "published only {order:?}");
        let fetched = second.fetch(100, OffsetDateTime::now_utc()).await?;
        if fetched.events.is_empty() {
            second.wait_for_events(Duration::from_millis(200)).await;
            continue;
        }
        order.extend(ids(&fetched.events));
        second
            .settle(&delivered(&fetched.events), OffsetDateTime::now_utc())
            .await?;
    }
    ensure!(
        order == vec![poison, behind],
        "the retried dead letter goes first, once: {order:?}"
    );
    let marked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE state = 'pending' AND last_error IS NOT NULL",
    )
    .fetch_one(&h.pool)
    .await?;
    ensure!(
        marked == 0,
        "{marked} delivered rows still marked as put back"
    );
    Ok(())
}
