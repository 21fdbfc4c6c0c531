//! Fault injection for relay tests: [`ScriptedSink`], an in-memory [`Sink`] that records what
//! it was given and fails on cue (per event, per aggregate, the whole broker), slowly if asked.

use std::sync::Mutex;
use std::time::Duration;

use outbox_core::sink::Delivery;
use outbox_core::{Event, Sink, SinkError, SinkErrorKind};
use tokio::sync::watch;
use uuid::Uuid;

use crate::lock;

/// Which events a failure rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// Every event.
    Any,
    /// Events with this `aggregate_id` (any aggregate type).
    AggregateId(String),
    /// Events with this `aggregate_type`.
    AggregateType(String),
    /// Events with this `event_type`.
    EventType(String),
    /// The event with this id.
    EventId(Uuid),
}

impl Match {
    /// True when `event` is one this rule applies to.
    pub fn matches(&self, event: &Event) -> bool {
        match self {
            Match::Any => true,
            Match::AggregateId(id) => &event.aggregate_id == id,
            Match::AggregateType(t) => &event.aggregate_type == t,
            Match::EventType(t) => &event.event_type == t,
            Match::EventId(id) => &event.id == id,
        }
    }
}

/// How many attempts a failure rule fails before it stops applying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Times {
    /// Every attempt, until [`ScriptedSink::clear_failures`].
    Forever,
    /// The next `n` matching attempts, then the events go through.
    Count(u32),
}

/// One event as it was handed to [`Sink::publish`], and what the sink answered for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Which `publish` call it came in (from 0, in the order calls started). With
    /// per-aggregate ordering the relay makes one call per wave.
    pub call: usize,
    /// The event.
    pub event: Event,
    /// `Ok` when acknowledged, else the kind of failure returned (`Unavailable` for every event
    /// of a call made while the sink was down).
    pub result: Result<(), SinkErrorKind>,
}

#[derive(Debug)]
struct Rule {
    matcher: Match,
    kind: SinkErrorKind,
    times: Times,
}

#[derive(Debug, Default)]
struct State {
    calls_started: usize,
    attempts: Vec<Attempt>,
    published: Vec<Event>,
    rules: Vec<Rule>,
    down: bool,
    delay: Duration,
    max_payload: Option<usize>,
}

impl State {
    /// The failure for `event`, consuming one count of the first rule that applies.
    fn failure_for(&mut self, event: &Event) -> Option<SinkError> {
        if let Some(max) = self.max_payload
            && event.payload.len() > max
        {
            return Some(SinkError::rejected(format!(
                "payload of {} bytes is over the scripted limit of {max} bytes",
                event.payload.len()
            )));
        }
        let rule = self
            .rules
            .iter_mut()
            .find(|r| r.matcher.matches(event) && r.times != Times::Count(0))?;
        if let Times::Count(n) = &mut rule.times {
            *n -= 1;
        }
        Some(SinkError::new(
            rule.kind,
            format!(
                "scripted {:?} failure for event {} ({:?})",
                rule.kind, event.id, rule.matcher
            ),
        ))
    }
}

/// An in-memory [`Sink`] for relay tests: records every publish and fails as scripted.
///
/// ```
/// # async fn example() -> anyhow::Result<()> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use outbox_core::SinkErrorKind;
/// use outbox_testkit::faults::{ScriptedSink, Times};
///
/// let sink = Arc::new(ScriptedSink::new());
/// sink.fail_aggregate("o_poison", SinkErrorKind::Rejected, Times::Forever);
/// sink.fail_event_type("order.shipped", SinkErrorKind::Transient, Times::Count(2));
/// // ... run a Relay with `sink.clone()` ...
/// let delivered = sink.wait_for_published(10, Duration::from_secs(5)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ScriptedSink {
    state: Mutex<State>,
    /// Bumped after every change to `state` that a waiter may care about.
    changed: watch::Sender<u64>,
    paused: watch::Sender<bool>,
}

impl Default for ScriptedSink {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedSink {
    /// A sink that acknowledges everything at once.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            paused: watch::channel(false).0,
        }
    }

    /// Fails matching events with `kind`, `times` times (each matching attempt uses one).
    /// Rules are tried in the order they were added.
    pub fn fail(&self, matcher: Match, kind: SinkErrorKind, times: Times) {
        lock(&self.state).rules.push(Rule {
            matcher,
            kind,
            times,
        });
    }

    /// Fails events of aggregate `aggregate_id`; see [`ScriptedSink::fail`].
    pub fn fail_aggregate(
        &self,
        aggregate_id: impl Into<String>,
        kind: SinkErrorKind,
        times: Times,
    ) {
        self.fail(Match::AggregateId(aggregate_id.into()), kind, times);
    }

    /// Fails events of type `event_type`; see [`ScriptedSink::fail`].
    pub fn fail_event_type(
        &self,
        event_type: impl Into<String>,
        kind: SinkErrorKind,
        times: Times,
    ) {
        self.fail(Match::EventType(event_type.into()), kind, times);
    }

    /// Removes every failure rule.
    pub fn clear_failures(&self) {
        lock(&self.state).rules.clear();
    }

    /// Rejects (as a broker's size limit would) every event whose payload is longer than `max`
    /// bytes; `None` lifts the limit.
    pub fn set_max_payload(&self, max: Option<usize>) {
        lock(&self.state).max_payload = max;
    }

    /// While down, every `publish` fails as a whole with [`SinkErrorKind::Unavailable`] and the
    /// healthcheck fails: a broker outage.
    pub fn set_down(&self, down: bool) {
        lock(&self.state).down = down;
    }

    /// Waits this long in every `publish` before answering (a slow broker).
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.state).delay = delay;
    }

    /// Holds every `publish` (already started or not) before it answers, until
    /// [`ScriptedSink::resume`]: lets a test stop the relay mid-batch, e.g. to check that
    /// unacknowledged events are published again.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Lets held and later `publish` calls answer.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Events acknowledged so far, in the order they were acknowledged (duplicates included).
    pub fn published(&self) -> Vec<Event> {
        lock(&self.state).published.clone()
    }

    /// Every event handed to `publish` so far, acknowledged or not, in order.
    pub fn attempts(&self) -> Vec<Attempt> {
        lock(&self.state).attempts.clone()
    }

    /// How many `publish` calls have started.
    pub fn calls(&self) -> usize {
        lock(&self.state).calls_started
    }

    /// Waits until at least `n` events were acknowledged; returns them all. On timeout the
    /// error says what was published and attempted.
    pub async fn wait_for_published(
        &self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Event>> {
        self.wait_until(&format!("{n} published events"), timeout, |s| {
            s.published.len() >= n
        })
        .await?;
        Ok(self.published())
    }

    /// Waits until every event of `ids` was acknowledged (at-least-once sources may publish
    /// others twice meanwhile, so a count would not tell); returns everything published.
    pub async fn wait_for_ids(
        &self,
        ids: &[uuid::Uuid],
        timeout: Duration,
    ) -> anyhow::Result<Vec<Event>> {
        self.wait_until(&format!("events {ids:?} published"), timeout, |s| {
            ids.iter().all(|id| s.published.iter().any(|e| e.id == *id))
        })
        .await?;
        Ok(self.published())
    }

    /// Waits until at least `n` `publish` calls have started (e.g. to stop the relay while a
    /// paused call is in flight).
    pub async fn wait_for_calls(&self, n: usize, timeout: Duration) -> anyhow::Result<()> {
        self.wait_until(&format!("{n} publish calls"), timeout, |s| {
            s.calls_started >= n
        })
        .await
    }

    /// Waits until at least `n` attempts (any result) were recorded; returns them all.
    pub async fn wait_for_attempts(
        &self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Attempt>> {
        self.wait_until(&format!("{n} publish attempts"), timeout, |s| {
            s.attempts.len() >= n
        })
        .await?;
        Ok(self.attempts())
    }

    async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&State) -> bool,
    ) -> anyhow::Result<()> {
        let mut changes = self.changed.subscribe();
        let check = |_: &u64| done(&lock(&self.state));
        if let Ok(Ok(_)) = tokio::time::timeout(timeout, changes.wait_for(check)).await {
            return Ok(());
        }
        let state = lock(&self.state);
        let attempts: Vec<String> = state
            .attempts
            .iter()
            .map(|a| {
                format!(
                    "call {} {}/{} {} {}: {:?}",
                    a.call,
                    a.event.aggregate_type,
                    a.event.aggregate_id,
                    a.event.event_type,
                    a.event.id,
                    a.result
                )
            })
            .collect();
        anyhow::bail!(
            "waited {timeout:?} for {what}; {} calls, {} published, attempts:\n{}",
            state.calls_started,
            state.published.len(),
            attempts.join("\n")
        )
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

impl Sink for ScriptedSink {
    fn name(&self) -> &'static str {
        "scripted"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let (call, delay) = {
            let mut state = lock(&self.state);
            state.calls_started += 1;
            (state.calls_started - 1, state.delay)
        };
        self.notify();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut paused = self.paused.subscribe();
        // The sender lives in `self`, so this cannot fail while we are borrowed.
        let _ = paused.wait_for(|p| !*p).await;

        let result = {
            let mut state = lock(&self.state);
            if state.down {
                state.attempts.extend(batch.iter().map(|event| Attempt {
                    call,
                    event: event.clone(),
                    result: Err(SinkErrorKind::Unavailable),
                }));
                Err(SinkError::unavailable("scripted sink is down"))
            } else {
                let mut deliveries = Vec::with_capacity(batch.len());
                for event in batch {
                    let delivery = match state.failure_for(event) {
                        Some(err) => Err(err),
                        None => {
                            state.published.push(event.clone());
                            Ok(())
                        }
                    };
                    state.attempts.push(Attempt {
                        call,
                        event: event.clone(),
                        result: delivery.as_ref().map(|_| ()).map_err(SinkError::kind),
                    });
                    deliveries.push(delivery);
                }
                Ok(deliveries)
            }
        };
        self.notify();
        result
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        if lock(&self.state).down {
            Err(SinkError::unavailable("scripted sink is down"))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u128, aggregate_id: &str, event_type: &str) -> Event {
        Event {
            id: Uuid::from_u128(n),
            position: outbox_core::Position(n as i64),
            aggregate_type: "Order".into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload: bytes::Bytes::from_static(b"{}"),
            headers: Vec::new(),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    #[tokio::test]
    async fn counted_failures_run_out_and_forever_failures_do_not() {
        let sink = ScriptedSink::new();
        sink.fail_aggregate("a", SinkErrorKind::Transient, Times::Count(1));
        sink.fail_event_type("bad", SinkErrorKind::Rejected, Times::Forever);
        let batch = [
            event(1, "a", "ok"),
            event(2, "b", "bad"),
            event(3, "c", "ok"),
        ];
        let first = sink.publish(&batch).await.expect("batch accepted");
        let kinds: Vec<_> = first
            .iter()
            .map(|d| d.as_ref().map_err(SinkError::kind).copied())
            .collect();
        assert_eq!(
            kinds,
            vec![
                Err(SinkErrorKind::Transient),
                Err(SinkErrorKind::Rejected),
                Ok(())
            ]
        );
        let second = sink.publish(&batch).await.expect("batch accepted");
        assert!(second[0].is_ok() && second[1].is_err() && second[2].is_ok());
        let ids: Vec<u128> = sink.published().iter().map(|e| e.id.as_u128()).collect();
        assert_eq!(ids, vec![3, 1, 3]);
        assert_eq!(sink.attempts().iter().map(|a| a.call).max(), Some(1));
    }

    #[tokio::test]
    async fn a_down_sink_fails_whole_batches_and_its_healthcheck() {
        let sink = ScriptedSink::new();
        sink.set_down(true);
        let err = sink.publish(&[event(1, "a", "x")]).await.expect_err("down");
        assert_eq!(err.kind(), SinkErrorKind::Unavailable);
        assert!(sink.healthcheck().await.is_err());
        sink.set_down(false);
        sink.publish(&[event(1, "a", "x")]).await.expect("up again");
        assert_eq!(
            sink.wait_for_published(1, Duration::from_secs(1))
                .await
                .expect("published")
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn oversized_payloads_are_rejected() {
        let sink = ScriptedSink::new();
        sink.set_max_payload(Some(1));
        let d = sink
            .publish(&[event(1, "a", "x")])
            .await
            .expect("batch accepted");
        assert_eq!(
            d[0].as_ref().map_err(SinkError::kind),
            Err(SinkErrorKind::Rejected)
        );
    }

    #[tokio::test]
    async fn paused_publish_waits_for_resume() {
        let sink = std::sync::Arc::new(ScriptedSink::new());
        sink.pause();
        let task = tokio::spawn({
            let sink = sink.clone();
            async move { sink.publish(&[event(1, "a", "x")]).await.map(|d| d.len()) }
        });
        sink.wait_for_calls(1, Duration::from_secs(5))
            .await
            .expect("call started");
        assert!(sink.published().is_empty());
        sink.resume();
        assert_eq!(task.await.expect("task").expect("published"), 1);
        let err = sink
            .wait_for_published(2, Duration::from_millis(50))
            .await
            .expect_err("only one");
        assert!(err.to_string().contains("1 published"), "{err}");
    }
}
