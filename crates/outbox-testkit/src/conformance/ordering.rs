//! Ordering checks: each aggregate's events reach the broker in commit order, from concurrent
//! writers and several replicas, numbered 1, 2, 3, … (`aggregate_seq`) where the source
//! numbers them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::{DeadLetterPolicy, NewEvent, SinkErrorKind};
use uuid::Uuid;

use super::Harness;
use super::events::{
    event, first_deliveries, order_by_aggregate, position_of, positions_count_up_per_aggregate,
};
use super::relay::{WAIT, start_relay};
use crate::faults::{Match, ScriptedSink, Times};

/// Committed events from concurrent writers reach the broker once each (at least), and each
/// aggregate's events arrive in the order their transactions committed.
pub async fn committed_events_arrive_in_per_aggregate_order<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    let relay = start_relay(h, &sink, h.replicas(), DeadLetterPolicy::HoldAggregate, 5).await?;
    // Writers commit concurrently with the relay: 6 aggregates, 40 transactions of 1-3 events.
    let mut expected: HashMap<(String, String), Vec<Uuid>> = HashMap::new();
    let mut total = 0;
    for t in 0..40 {
        let agg = format!("agg-{}", t % 6);
        let events: Vec<NewEvent> = (0..(t % 3) + 1).map(|i| event(&agg, t * 10 + i)).collect();
        total += events.len();
        let ids = h.write(events, true).await?;
        expected
            .entry(("Order".into(), agg))
            .or_default()
            .extend(ids);
    }
    let published = sink.wait_for_published(total, WAIT).await?;
    relay.stop().await?;
    let firsts = first_deliveries(&published);
    ensure!(
        firsts.len() == total,
        "expected {total} distinct events, broker saw {}",
        firsts.len()
    );
    let got = order_by_aggregate(&firsts);
    for (key, ids) in &expected {
        ensure!(
            got.get(key) == Some(ids),
            "aggregate {key:?}: broker order {:?} differs from commit order {ids:?}",
            got.get(key)
        );
    }
    Ok(())
}

/// Transactions of one aggregate that overlap so that commit order differs from insert
/// order reach the broker in COMMIT order, with every replica claiming at once.
///
/// The oracle trusts no sequence of the outbox: each write bumps a business counter in its
/// own transaction ([`Harness::write_counted`]), so the committed counter values are the
/// aggregate's commit order. Phase 1 forces the inversion deterministically with the relays
/// stopped: writer A inserts its event, then holds its transaction open; writer B, started
/// later, inserts, bumps and commits first (where the database lets it: with an ordering lock
/// per aggregate B waits for A, and commit order equals insert order). Only then do the
/// relays start, so they see both committed events at once: a source that publishes in
/// insert (id or seq) order publishes A before B and fails. Phase 2 runs concurrent writers
/// (outbox row first or counter first, random holds) while the replicas relay.
pub async fn concurrent_writers_reach_the_broker_in_commit_order<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    const AGGREGATES: [&str; 3] = ["cw-a", "cw-b", "cw-c"];
    let hold = Duration::from_millis(300);
    let mut written: Vec<(String, Uuid, i64)> = Vec::new();

    // Phase 1: deterministic inversions, no relay running.
    for aggregate in AGGREGATES {
        let a = h.write_counted(event(aggregate, 0), true, hold);
        let b = async {
            tokio::time::sleep(hold / 6).await;
            h.write_counted(event(aggregate, 1), true, Duration::ZERO)
                .await
        };
        let (a, b) = tokio::join!(a, b);
        for (id, n) in [a?, b?] {
            written.push((aggregate.to_owned(), id, n));
        }
    }

    let sink = Arc::new(ScriptedSink::new());
    let relay = start_relay(h, &sink, h.replicas(), DeadLetterPolicy::HoldAggregate, 5).await?;

    // Phase 2: concurrent writers while the replicas relay.
    let writers = (0..6).map(|w| async move {
        let mut out = Vec::new();
        for i in 0..8usize {
            let aggregate = AGGREGATES[(w + i) % AGGREGATES.len()];
            let outbox_first = (w + i) % 2 == 0;
            let hold = Duration::from_millis(((w * 7 + i * 13) % 25) as u64);
            let (id, n) = h
                .write_counted(event(aggregate, 100 + w * 10 + i), outbox_first, hold)
                .await?;
            out.push((aggregate.to_owned(), id, n));
        }
        anyhow::Ok(out)
    });
    for result in futures::future::join_all(writers).await {
        written.extend(result?);
    }

    let published = sink.wait_for_published(written.len(), WAIT).await;
    relay.stop().await?;
    let published = published?;
    let commit_position: HashMap<Uuid, (String, i64)> = written
        .iter()
        .map(|(aggregate, id, n)| (*id, (aggregate.clone(), *n)))
        .collect();
    if h.assigns_positions() {
        positions_count_up_per_aggregate(&first_deliveries(&published))?;
    }
    let mut seen: HashMap<String, Vec<i64>> = HashMap::new();
    for e in first_deliveries(&published) {
        if let Some((aggregate, n)) = commit_position.get(&e.id) {
            seen.entry(aggregate.clone()).or_default().push(*n);
        }
    }
    for aggregate in AGGREGATES {
        let got = seen.remove(aggregate).unwrap_or_default();
        let committed = written.iter().filter(|(a, _, _)| a == aggregate).count() as i64;
        let expected: Vec<i64> = (1..=committed).collect();
        ensure!(
            got == expected,
            "aggregate {aggregate}: the broker saw commit positions {got:?}, expected {expected:?} (commit order, nothing missing)"
        );
    }
    Ok(())
}

/// The SQL sources number each aggregate's deliveries 1, 2, 3, … (`aggregate_seq`): a
/// retried event keeps its number on every attempt, a dead letter uses its number up (it may
/// have reached the broker before its last attempt failed), and a relay restarted later goes
/// on from where the last one stopped. Sources that do not number (DynamoDB) add no header.
pub async fn delivery_positions_are_contiguous_per_aggregate<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    let ids = h
        .write((1..=4).map(|n| event("pos", n)).collect(), true)
        .await?;
    let other = h.write(vec![event("pos-other", 1)], true).await?[0];
    sink.fail(
        Match::EventId(ids[0]),
        SinkErrorKind::Transient,
        Times::Count(2),
    );
    sink.fail(
        Match::EventId(ids[2]),
        SinkErrorKind::Rejected,
        Times::Forever,
    );
    let relay = start_relay(h, &sink, 1, DeadLetterPolicy::Skip, 3).await?;
    sink.wait_for_published(4, WAIT).await?;
    relay.stop().await?;
    let later = h.write(vec![event("pos", 5)], true).await?[0];
    let relay = start_relay(h, &sink, 1, DeadLetterPolicy::Skip, 3).await?;
    sink.wait_for_published(5, WAIT).await?;
    relay.stop().await?;

    let numbered = |id: Uuid| -> Vec<Option<u64>> {
        sink.attempts()
            .into_iter()
            .filter(|a| a.event.id == id)
            .map(|a| position_of(&a.event))
            .collect()
    };
    if !h.assigns_positions() {
        for id in ids.iter().chain([&other, &later]) {
            ensure!(
                numbered(*id).iter().all(Option::is_none),
                "a source that does not number deliveries added aggregate_seq to {id}"
            );
        }
        return Ok(());
    }
    let expect = |id: Uuid, n: u64, attempts: usize| -> anyhow::Result<()> {
        let got = numbered(id);
        ensure!(
            got == vec![Some(n); attempts],
            "event {id}: positions on its attempts {got:?}, expected {attempts} × {n}"
        );
        Ok(())
    };
    expect(ids[0], 1, 3).context("a retried event keeps its position")?;
    expect(ids[1], 2, 1)?;
    expect(ids[2], 3, 1).context("a rejected event is published with its position")?;
    expect(ids[3], 4, 1).context("the event after a dead letter does not reuse its position")?;
    expect(later, 5, 1).context("a restarted relay goes on from the stored head")?;
    expect(other, 1, 1).context("each aggregate counts on its own")?;
    Ok(())
}
