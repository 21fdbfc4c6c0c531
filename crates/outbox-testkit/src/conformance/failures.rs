//! Failure checks: rolled-back transactions, poison events and dead letters, transient
//! failures and retries, and broker outages lose nothing and hold back only what they must.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use outbox_core::{DeadLetterPolicy, SinkErrorKind};
use uuid::Uuid;

use super::events::event;
use super::relay::{WAIT, start_relay};
use super::{Harness, StoredEvent};
use crate::faults::{Match, ScriptedSink, Times};

/// An event written by a transaction that rolled back is never published.
pub async fn rolled_back_transaction_never_reaches_the_broker<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    let relay = start_relay(h, &sink, 1, DeadLetterPolicy::HoldAggregate, 5).await?;
    let phantom = h.write(vec![event("rb", 1), event("rb", 2)], false).await?;
    let before = h.write(vec![event("ok", 1)], true).await?;
    let phantom2 = h.write(vec![event("ok", 2)], false).await?;
    let after = h.write(vec![event("ok", 3)], true).await?;
    let published = sink.wait_for_published(2, WAIT).await?;
    // Give the relay a few more polls to (wrongly) publish anything else.
    let more = sink.wait_for_published(3, Duration::from_millis(300)).await;
    relay.stop().await?;
    ensure!(
        more.is_err(),
        "more than the 2 committed events were published: {:?}",
        sink.published()
    );
    let ids: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(
        ids == vec![before[0], after[0]],
        "published {ids:?}, expected the two committed events"
    );
    for id in phantom.iter().chain(&phantom2) {
        ensure!(
            h.stored(*id).await?.is_none(),
            "rolled-back event {id} has a row"
        );
    }
    Ok(())
}

/// A poison event is dead-lettered with its reason while other aggregates keep flowing, and
/// (with `dead_letter = "hold-aggregate"`) the later events of its aggregate wait.
pub async fn poison_event_is_dead_lettered_and_holds_only_its_aggregate<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    poison_event(h, DeadLetterPolicy::HoldAggregate).await
}

/// With `dead_letter = "skip"`, the events behind a dead letter flow on.
pub async fn poison_event_is_dead_lettered_and_skipped<H: Harness>(h: &H) -> anyhow::Result<()> {
    poison_event(h, DeadLetterPolicy::Skip).await
}

async fn poison_event<H: Harness>(h: &H, policy: DeadLetterPolicy) -> anyhow::Result<()> {
    {
        let sink = Arc::new(ScriptedSink::new());
        let poison_agg = format!("poison-{policy:?}");
        let ids = h.write(vec![event(&poison_agg, 1)], true).await?;
        let poison = ids[0];
        sink.fail(
            Match::EventId(poison),
            SinkErrorKind::Rejected,
            Times::Forever,
        );
        let behind = h.write(vec![event(&poison_agg, 2)], true).await?[0];
        let others = h
            .write(
                (0..5)
                    .map(|i| event(&format!("fine-{policy:?}-{i}"), i))
                    .collect(),
                true,
            )
            .await?;
        let relay = start_relay(h, &sink, 1, policy, 3).await?;
        let expected = if policy == DeadLetterPolicy::Skip {
            6
        } else {
            5
        };
        let published = sink.wait_for_published(expected, WAIT).await?;
        let extra = sink
            .wait_for_published(expected + 1, Duration::from_millis(300))
            .await;
        let report = relay.stop().await?;
        ensure!(
            extra.is_err(),
            "{policy:?}: too many events published: {:?}",
            sink.published()
        );
        let published_ids: Vec<Uuid> = published.iter().map(|e| e.id).collect();
        for id in &others {
            ensure!(
                published_ids.contains(id),
                "{policy:?}: unrelated event {id} was not published"
            );
        }
        ensure!(
            !published_ids.contains(&poison),
            "{policy:?}: the poison event was acknowledged"
        );
        let stored = h.stored(poison).await?.context("poison row missing")?;
        ensure!(
            stored.state == "dead",
            "{policy:?}: poison event is {stored:?}, expected dead"
        );
        ensure!(report.dead_lettered == 1, "{policy:?}: report {report:?}");
        let behind_published = published_ids.contains(&behind);
        match policy {
            DeadLetterPolicy::HoldAggregate => ensure!(
                !behind_published,
                "hold-aggregate: the event behind the dead letter was published"
            ),
            DeadLetterPolicy::Skip => ensure!(
                behind_published,
                "skip: the event behind the dead letter was not published"
            ),
        }
    }
    Ok(())
}

/// Transient failures are retried with backoff, counting attempts, and dead-lettered after
/// `max_attempts`; an event that recovers is delivered before the later events of its
/// aggregate, and other aggregates never wait for it.
pub async fn transient_failures_retry_then_recover_or_dead_letter<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    let flaky = h.write(vec![event("flaky", 1)], true).await?[0];
    let flaky_next = h.write(vec![event("flaky", 2)], true).await?[0];
    let hopeless = h.write(vec![event("hopeless", 1)], true).await?[0];
    let bystander = h.write(vec![event("bystander", 1)], true).await?[0];
    sink.fail(
        Match::EventId(flaky),
        SinkErrorKind::Transient,
        Times::Count(2),
    );
    sink.fail(
        Match::EventId(hopeless),
        SinkErrorKind::Transient,
        Times::Forever,
    );
    let relay = start_relay(h, &sink, 1, DeadLetterPolicy::HoldAggregate, 4).await?;
    // hopeless: 4 attempts; flaky: 3 attempts; flaky_next, bystander: 1 each.
    sink.wait_for_attempts(9, WAIT).await?;
    let published = sink.wait_for_published(3, WAIT).await?;
    relay.stop().await?;
    let ids: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    let pos = |id: Uuid| ids.iter().position(|x| *x == id);
    ensure!(pos(bystander).is_some(), "bystander not published: {ids:?}");
    let (Some(a), Some(b)) = (pos(flaky), pos(flaky_next)) else {
        bail!("flaky aggregate not fully published: {ids:?}");
    };
    ensure!(a < b, "flaky aggregate published out of order: {ids:?}");
    let stored = h.stored(hopeless).await?.context("hopeless row missing")?;
    ensure!(
        stored
            == StoredEvent {
                state: "dead".into(),
                attempts: 4
            },
        "hopeless event: {stored:?}"
    );
    let flaky_attempts: Vec<_> = sink
        .attempts()
        .into_iter()
        .filter(|a| a.event.id == flaky)
        .collect();
    ensure!(
        flaky_attempts.len() == 3,
        "flaky event attempted {} times",
        flaky_attempts.len()
    );
    Ok(())
}

/// While the broker is unavailable no attempt is counted and nothing is lost; once it is
/// back, the backlog drains.
pub async fn broker_outage_loses_nothing_and_counts_no_attempts<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    sink.set_down(true);
    let ids = h
        .write(
            (0..20)
                .map(|i| event(&format!("outage-{}", i % 4), i))
                .collect(),
            true,
        )
        .await?;
    let relay = start_relay(h, &sink, 1, DeadLetterPolicy::HoldAggregate, 2).await?;
    sink.wait_for_calls(3, WAIT).await?;
    for id in &ids {
        let s = h.stored(*id).await?.context("row missing during outage")?;
        ensure!(
            s == StoredEvent {
                state: "pending".into(),
                attempts: 0
            },
            "during the outage event {id} is {s:?}"
        );
    }
    sink.set_down(false);
    let published = sink.wait_for_published(ids.len(), WAIT).await?;
    relay.stop().await?;
    let got: std::collections::HashSet<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(
        ids.iter().all(|id| got.contains(id)),
        "events lost across the outage"
    );
    Ok(())
}
