//! The source conformance suite: what every outbox source must do, checked the same way for
//! each database. A database crate implements [`Harness`] for a fresh outbox and calls
//! [`run_all`]; adding a source adds one call.
//!
//! Each check drives the real [`Relay`] over the real source, with a [`ScriptedSink`] as the
//! broker, and asserts what the broker saw and what the table recorded.

use std::collections::HashMap;
use std::future::Future;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use outbox_core::policy::Backoff;
use outbox_core::{
    DeadLetterPolicy, Event, NewEvent, Ordering, Relay, RelayConfig, RelayReport, SinkErrorKind,
    Source,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::faults::{Match, ScriptedSink, Times};

/// What the table says about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// `pending`, `delivered` or `dead`.
    pub state: String,
    /// Failed attempts recorded.
    pub attempts: i32,
}

/// One fresh outbox in one database, as the suite needs it.
pub trait Harness: Send + Sync + 'static {
    /// The source under test.
    type Source: Source;
    /// A new source (a relay replica's pipeline) on this outbox.
    fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> impl Future<Output = anyhow::Result<Self::Source>> + Send;
    /// Writes `events` in ONE transaction and commits it (`commit = true`) or rolls it back.
    fn write(
        &self,
        events: Vec<NewEvent>,
        commit: bool,
    ) -> impl Future<Output = anyhow::Result<Vec<Uuid>>> + Send;
    /// The stored state of an event; `None` when there is no row (deleted or never written).
    fn stored(&self, id: Uuid) -> impl Future<Output = anyhow::Result<Option<StoredEvent>>> + Send;
    /// Whether several sources may relay one outbox concurrently (replicas).
    fn replicas(&self) -> usize;
    /// Whether the source numbers each aggregate's deliveries (`aggregate_seq`,
    /// `outbox_core::aggregate_seq`): the SQL sources do (polling and PostgreSQL CDC); the
    /// DynamoDB stream source does not.
    fn assigns_positions(&self) -> bool {
        true
    }
    /// The commit-order oracle of [`concurrent_writers_reach_the_broker_in_commit_order`]:
    /// in ONE transaction, writes `event` and bumps a per-aggregate business counter
    /// (`UPDATE counters SET n = n + 1 WHERE aggregate = ... RETURNING n`, creating the row
    /// at 0 when missing), the outbox row first when `outbox_first` (a producer that inserts
    /// its event before it touches the business row), else the counter first; waits `hold`
    /// between the two statements, then commits. Returns the event id and the counter value
    /// it committed: the counter's row lock makes those values 1, 2, 3, ... in commit order
    /// per aggregate, whatever the outbox's own ids or sequence say.
    fn write_counted(
        &self,
        event: NewEvent,
        outbox_first: bool,
        hold: Duration,
    ) -> impl Future<Output = anyhow::Result<(Uuid, i64)>> + Send {
        let _ = (event, outbox_first, hold);
        async { bail!("this harness does not implement write_counted (the commit-order oracle)") }
    }
    /// Whether the outbox recorded `id` as delivered, once the relay stopped. By default the
    /// stored row says `delivered` (or is gone). A source that records delivery elsewhere
    /// (CDC: the slot's confirmed position; rows stay `pending`) overrides this.
    fn recorded_delivered(&self, id: Uuid) -> impl Future<Output = anyhow::Result<bool>> + Send {
        async move {
            Ok(self
                .stored(id)
                .await?
                .is_none_or(|s| s.state == "delivered"))
        }
    }
}

const WAIT: Duration = Duration::from_secs(30);

/// A relay config for tests: small batches (so batches interleave), fast backoff.
pub fn test_relay_config(
    ordering: Ordering,
    dead_letter: DeadLetterPolicy,
    max_attempts: u32,
) -> RelayConfig {
    RelayConfig {
        ordering,
        dead_letter,
        batch_size: NonZeroUsize::new(16).expect("nonzero"),
        max_attempts: NonZeroU32::new(max_attempts).expect("nonzero"),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
        },
        poll_interval: Duration::from_millis(2),
        idle_interval: Duration::from_millis(20),
        publish_timeout: Duration::from_secs(5),
        source_timeout: Duration::from_secs(60),
        workers: NonZeroUsize::new(1).expect("nonzero"),
    }
}

/// A relay running in the background over `sources`.
pub struct RunningRelay {
    shutdown: CancellationToken,
    handle: JoinHandle<Result<RelayReport, outbox_core::RelayError>>,
}

impl RunningRelay {
    /// Starts `Relay::run` on a task.
    pub fn start<S: Source>(config: RelayConfig, sink: Arc<ScriptedSink>, sources: Vec<S>) -> Self {
        let shutdown = CancellationToken::new();
        let relay = Relay::new(config, sink);
        let token = shutdown.clone();
        let handle = tokio::spawn(async move { relay.run(sources, token).await });
        Self { shutdown, handle }
    }

    /// Asks the relay to stop, waits for it to drain, and returns its report.
    pub async fn stop(self) -> anyhow::Result<RelayReport> {
        self.shutdown.cancel();
        let report = tokio::time::timeout(WAIT, self.handle)
            .await
            .context("relay did not stop")??;
        Ok(report?)
    }
}

async fn sources<H: Harness>(
    h: &H,
    n: usize,
    ordering: Ordering,
    dead_letter: DeadLetterPolicy,
) -> anyhow::Result<Vec<H::Source>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(h.source(ordering, dead_letter).await?);
    }
    Ok(out)
}

fn order_by_aggregate(events: &[Event]) -> HashMap<(String, String), Vec<Uuid>> {
    let mut out: HashMap<(String, String), Vec<Uuid>> = HashMap::new();
    for e in events {
        out.entry((e.aggregate_type.clone(), e.aggregate_id.clone()))
            .or_default()
            .push(e.id);
    }
    out
}

/// Removes repeated ids, keeping the first occurrence (a redelivery of an event that was
/// already published is allowed: at-least-once).
fn first_deliveries(events: &[Event]) -> Vec<Event> {
    let mut seen = std::collections::HashSet::new();
    events
        .iter()
        .filter(|e| seen.insert(e.id))
        .cloned()
        .collect()
}

fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new(
        "Order",
        aggregate,
        "order.changed",
        format!("{{\"aggregate\":\"{aggregate}\",\"n\":{n}}}"),
    )
    .with_header("n", n.to_string())
}

/// Committed events from concurrent writers reach the broker once each (at least), and each
/// aggregate's events arrive in the order their transactions committed.
pub async fn committed_events_arrive_in_per_aggregate_order<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 5),
        sink.clone(),
        sources(
            h,
            h.replicas(),
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )
        .await?,
    );
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

/// An event written by a transaction that rolled back is never published.
pub async fn rolled_back_transaction_never_reaches_the_broker<H: Harness>(
    h: &H,
) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 5),
        sink.clone(),
        sources(
            h,
            1,
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )
        .await?,
    );
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
        let relay = RunningRelay::start(
            test_relay_config(Ordering::PerAggregate, policy, 3),
            sink.clone(),
            sources(h, 1, Ordering::PerAggregate, policy).await?,
        );
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
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 4),
        sink.clone(),
        sources(
            h,
            1,
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )
        .await?,
    );
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
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 2),
        sink.clone(),
        sources(
            h,
            1,
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )
        .await?,
    );
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

/// A relay told to stop finishes the batch it is publishing (acks awaited, outcomes
/// recorded) before it returns; nothing is left published-but-unrecorded.
pub async fn shutdown_drains_the_batch_in_flight<H: Harness>(h: &H) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    sink.pause();
    let ids = h
        .write(
            (0..5).map(|i| event(&format!("drain-{i}"), i)).collect(),
            true,
        )
        .await?;
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 2),
        sink.clone(),
        sources(
            h,
            1,
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )
        .await?,
    );
    sink.wait_for_calls(1, WAIT).await?;
    relay.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    ensure!(
        !relay.handle.is_finished(),
        "relay returned while a publish was in flight"
    );
    sink.resume();
    relay.stop().await?;
    let published: std::collections::HashSet<Uuid> =
        sink.published().iter().map(|e| e.id).collect();
    for id in &ids {
        let delivered = h.recorded_delivered(*id).await?;
        ensure!(
            delivered == published.contains(id),
            "event {id}: published={} but recorded delivered={delivered} (stored {:?})",
            published.contains(id),
            h.stored(*id).await?
        );
    }
    ensure!(
        !published.is_empty(),
        "the in-flight batch was not published"
    );
    Ok(())
}

/// A batch claimed by a relay that dies before settling is claimed again and published.
pub async fn claim_of_a_dead_relay_is_released<H: Harness>(h: &H) -> anyhow::Result<()> {
    let ids = h
        .write((0..3).map(|i| event("crash", i)).collect(), true)
        .await?;
    let mut doomed = h
        .source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)
        .await?;
    let claimed = doomed.fetch(10, time::OffsetDateTime::now_utc()).await?;
    ensure!(
        claimed.events.len() == 3,
        "first relay claimed {} events",
        claimed.events.len()
    );
    drop(doomed); // dies without settling
    let sink = Arc::new(ScriptedSink::new());
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 2),
        sink.clone(),
        sources(
            h,
            1,
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )
        .await?,
    );
    let published = sink.wait_for_published(3, WAIT).await?;
    relay.stop().await?;
    let got: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(
        got == ids,
        "after the crash the broker saw {got:?}, expected {ids:?} in order"
    );
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
    let relay = RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 5),
        sink.clone(),
        sources(
            h,
            h.replicas(),
            Ordering::PerAggregate,
            DeadLetterPolicy::HoldAggregate,
        )
        .await?,
    );

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

/// The `aggregate_seq` header of a published event.
fn position_of(e: &Event) -> Option<u64> {
    e.headers
        .iter()
        .find(|(n, _)| n == outbox_core::message::header::AGGREGATE_SEQ)
        .and_then(|(_, v)| v.parse().ok())
}

/// In `events` (first deliveries, in publish order), each aggregate's positions are 1, 2, 3, …
fn positions_count_up_per_aggregate(events: &[Event]) -> anyhow::Result<()> {
    let mut seen: HashMap<(&str, &str), Vec<Option<u64>>> = HashMap::new();
    for e in events {
        seen.entry((&e.aggregate_type, &e.aggregate_id))
            .or_default()
            .push(position_of(e));
    }
    for ((t, id), got) in seen {
        let expected: Vec<Option<u64>> = (1..=got.len() as u64).map(Some).collect();
        ensure!(
            got == expected,
            "aggregate {t}/{id}: delivery positions {got:?}, expected {expected:?}"
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
    let config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::Skip, 3);
    let relay = RunningRelay::start(
        config.clone(),
        sink.clone(),
        sources(h, 1, Ordering::PerAggregate, DeadLetterPolicy::Skip).await?,
    );
    sink.wait_for_published(4, WAIT).await?;
    relay.stop().await?;
    let later = h.write(vec![event("pos", 5)], true).await?[0];
    let relay = RunningRelay::start(
        config,
        sink.clone(),
        sources(h, 1, Ordering::PerAggregate, DeadLetterPolicy::Skip).await?,
    );
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

/// Runs every check in turn against fresh outboxes from `new_harness`.
pub async fn run_all<H, F, Fut>(new_harness: F) -> anyhow::Result<()>
where
    H: Harness,
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<H>>,
{
    macro_rules! check {
        ($name:ident) => {
            $name(&new_harness().await?)
                .await
                .with_context(|| concat!("conformance check `", stringify!($name), "` failed"))?;
        };
    }
    check!(committed_events_arrive_in_per_aggregate_order);
    check!(rolled_back_transaction_never_reaches_the_broker);
    check!(poison_event_is_dead_lettered_and_holds_only_its_aggregate);
    check!(poison_event_is_dead_lettered_and_skipped);
    check!(transient_failures_retry_then_recover_or_dead_letter);
    check!(broker_outage_loses_nothing_and_counts_no_attempts);
    check!(shutdown_drains_the_batch_in_flight);
    check!(claim_of_a_dead_relay_is_released);
    check!(concurrent_writers_reach_the_broker_in_commit_order);
    check!(delivery_positions_are_contiguous_per_aggregate);
    Ok(())
}
