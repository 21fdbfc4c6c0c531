//! The relay loop: fetch a batch from the [`Source`], publish it through the [`Sink`] in
//! per-aggregate waves, decide each event's outcome, settle, repeat.
//!
//! Ordering within a batch: when ordering is on, the batch is split into *waves*: wave `k`
//! holds the `k`-th event of every aggregate in the batch. A wave is published concurrently
//! (its events are independent) and fully acknowledged before the next wave starts; an
//! aggregate whose event failed takes no further part in the batch, so a later event never
//! overtakes an earlier one that is being retried or dead-lettered.

mod publish;

use std::collections::HashMap;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;
use serde::Deserialize;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::policy::{Backoff, RetryPolicy};
use crate::source::{Fetched, Outcome, Settlement};
use crate::trace::PublishTracer;
use crate::{Event, Sink, Source, SourceError, SourceErrorKind};

/// Which events must reach the broker in commit order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Ordering {
    /// No order: events are published as fast as possible, a failed event does not hold back
    /// anything.
    None,
    /// Events of one aggregate reach the broker in commit order (guarantee 3).
    #[default]
    PerAggregate,
    /// All events in commit order (CDC source only: one active relay following the WAL).
    Total,
}

/// What a dead-lettered event means for the later events of its aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DeadLetterPolicy {
    /// Later events of the aggregate wait until the dead letter is retried or purged: a
    /// consumer never sees event N+1 of an aggregate without event N.
    #[default]
    HoldAggregate,
    /// Later events of the aggregate flow on; the dead letter is out of line.
    Skip,
}

/// Relay settings (`[relay]` in the config file).
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Ordering guarantee (`none`, `per-aggregate`, `total`).
    pub ordering: Ordering,
    /// What a dead letter means for its aggregate (`hold-aggregate`, `skip`).
    pub dead_letter: DeadLetterPolicy,
    /// Most events claimed per batch.
    pub batch_size: NonZeroUsize,
    /// Failed attempts after which an event is dead-lettered.
    pub max_attempts: NonZeroU32,
    /// Backoff between attempts of one event.
    pub backoff: Backoff,
    /// Pause after a batch that was not full (a full batch is followed by the next at once).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Longest pause between polls while the outbox stays empty (the pause doubles from
    /// `poll_interval` up to this).
    #[serde(with = "humantime_serde")]
    pub idle_interval: Duration,
    /// Longest wait for the broker to acknowledge one wave; past it the wave counts as
    /// unavailable and its events are released untouched.
    #[serde(with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Longest wait for the outbox database to answer one fetch or one settle. Past it the
    /// database counts as unavailable: a server that vanished without closing its connections
    /// (a dead machine: no FIN, no RST) would otherwise hold the relay until the kernel gives
    /// up on the socket, shutdown included.
    #[serde(with = "humantime_serde")]
    pub source_timeout: Duration,
    /// Concurrent pipelines in this process, each with its own database connection: while
    /// one publishes, another claims. Default 1 (see the default's comment).
    pub workers: NonZeroUsize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            ordering: Ordering::PerAggregate,
            dead_letter: DeadLetterPolicy::HoldAggregate,
            batch_size: NonZeroUsize::new(500).expect("nonzero"),
            max_attempts: NonZeroU32::new(10).expect("nonzero"),
            backoff: Backoff::default(),
            poll_interval: Duration::from_millis(5),
            idle_interval: Duration::from_millis(50),
            publish_timeout: Duration::from_secs(30),
            source_timeout: Duration::from_secs(60),
            // One: measured, a second pipeline adds nothing to a backlog drain (77k vs 75k
            // events/s, null sink) and, under producers at the database's ceiling, the two
            // claim the same head of the queue and fall behind (12k vs 35k events/s):
            // docs/benchmarks.md, "Workers under concurrent producers".
            workers: NonZeroUsize::MIN,
        }
    }
}

impl RelayConfig {
    /// Checks values serde cannot; the error names the key (`relay.backoff.max: ...`).
    pub fn validate(&self) -> Result<(), String> {
        self.backoff
            .validate()
            .map_err(|(k, why)| format!("relay.backoff.{k}: {why}"))?;
        if self.idle_interval < self.poll_interval {
            return Err("relay.idle_interval: must not be less than relay.poll_interval".into());
        }
        if self.source_timeout.is_zero() {
            return Err("relay.source_timeout: must be greater than 0".into());
        }
        if self.publish_timeout.is_zero() {
            return Err("relay.publish_timeout: must be greater than 0".into());
        }
        Ok(())
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.get(),
            backoff: self.backoff.clone(),
        }
    }
}

/// Why the relay stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The source failed in a way retrying cannot fix.
    #[error("the outbox source failed")]
    Source(#[source] SourceError),
}

/// Totals of one relay run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Events acknowledged by the broker.
    pub delivered: u64,
    /// Failed attempts scheduled for retry.
    pub retried: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Batches whose outcomes could not be recorded (their events will be published again).
    pub settle_failures: u64,
    /// Events not published, or whose retry or dead letter was not recorded, because the
    /// claim on them had expired (the relay was paused past `source.claim_timeout` or its
    /// lease): another replica owns them now.
    pub fenced: u64,
}

impl std::ops::AddAssign for RelayReport {
    fn add_assign(&mut self, o: Self) {
        self.delivered += o.delivered;
        self.retried += o.retried;
        self.dead_lettered += o.dead_lettered;
        self.settle_failures += o.settle_failures;
        self.fenced += o.fenced;
    }
}

/// The relay: moves events from sources to a sink until told to stop.
pub struct Relay<K> {
    config: RelayConfig,
    sink: Arc<K>,
    /// Publish spans; `None` (the default) costs nothing per event.
    tracer: Option<Arc<dyn PublishTracer>>,
    /// Labels on every metric this relay records (`subscription="sms"` for one pipeline of a
    /// fan-out); empty for the single-sink relay.
    labels: Vec<metrics::Label>,
}

/// Exponential pause for repeated unavailability of the database or the broker.
#[derive(Debug)]
struct Pause {
    next: Duration,
}

impl Pause {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(10);
    fn new() -> Self {
        Self { next: Self::FIRST }
    }
    fn take(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl<K: Sink> Relay<K> {
    /// A relay publishing to `sink`.
    pub fn new(config: RelayConfig, sink: Arc<K>) -> Self {
        Self {
            config,
            sink,
            tracer: None,
            labels: Vec::new(),
        }
    }

    /// Adds `name="value"` to every metric this relay records (the subscription of a
    /// fan-out pipeline).
    #[must_use]
    pub fn with_metric_label(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.labels.push(metrics::Label::new(name, value.into()));
        self
    }

    /// This relay's metric labels plus `extra`.
    fn labels(&self, extra: &[(&'static str, &'static str)]) -> Vec<metrics::Label> {
        let mut labels = self.labels.clone();
        labels.extend(extra.iter().map(|(k, v)| metrics::Label::new(*k, *v)));
        labels
    }

    /// Reports every publish attempt to `tracer` (one span per event and attempt; see
    /// [`crate::trace`]).
    #[must_use]
    pub fn with_tracer(mut self, tracer: Arc<dyn PublishTracer>) -> Self {
        self.tracer = Some(tracer);
        self
    }

    /// Runs one pipeline per source until `shutdown` is cancelled, then finishes the batch in
    /// flight (publish, await acks, settle) and returns. Returns an error only for a fatal
    /// source error; an unavailable database or broker is waited out with backoff.
    pub async fn run<S: Source>(
        &self,
        sources: Vec<S>,
        shutdown: CancellationToken,
    ) -> Result<RelayReport, RelayError> {
        let workers = sources
            .into_iter()
            .enumerate()
            .map(|(i, s)| self.run_worker(i, s, shutdown.clone()));
        let reports = futures::future::join_all(workers).await;
        let mut total = RelayReport::default();
        let mut first_err = None;
        for r in reports {
            match r {
                Ok(rep) => total += rep,
                Err(e) => {
                    shutdown.cancel();
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    async fn run_worker<S: Source>(
        &self,
        worker: usize,
        mut source: S,
        shutdown: CancellationToken,
    ) -> Result<RelayReport, RelayError> {
        let mut report = RelayReport::default();
        let mut db_pause = Pause::new();
        let mut sink_pause = Pause::new();
        let mut idle = self.config.poll_interval;
        let mut rng = rand::rngs::SmallRng::from_os_rng();
        let policy = self.config.retry_policy();
        let limit = self.config.batch_size.get();
        tracing::debug!(worker, "relay worker started");
        while !shutdown.is_cancelled() {
            let fetched = match self
                .within_source_timeout("fetch", source.fetch(limit, OffsetDateTime::now_utc()))
                .await
            {
                Ok(f) => {
                    db_pause.reset();
                    f
                }
                Err(e) if e.kind() == SourceErrorKind::Unavailable => {
                    let d = db_pause.take();
                    metrics::counter!(m::SOURCE_ERRORS, self.labels(&[])).increment(1);
                    tracing::warn!(worker, error = %ErrorChain(&e), retry_in = ?d, "outbox database unavailable");
                    sleep_or_cancel(d, &shutdown).await;
                    continue;
                }
                Err(e) => {
                    tracing::error!(worker, error = %ErrorChain(&e), "outbox source failed; stopping");
                    return Err(RelayError::Source(e));
                }
            };
            let Fetched {
                events,
                more,
                valid_until,
            } = fetched;
            if events.is_empty() {
                if !more {
                    tokio::select! {
                        () = source.wait_for_events(idle) => {}
                        () = shutdown.cancelled() => {}
                    }
                    idle = (idle * 2).min(self.config.idle_interval);
                }
                continue;
            }
            idle = self.config.poll_interval;
            metrics::histogram!(m::BATCH_SIZE, self.labels(&[])).record(events.len() as f64);

            let (mut settlements, mut batch_report, sink_down) = self
                .publish_batch(events, &policy, &mut rng, valid_until)
                .await;
            if let Some(deadline) = valid_until
                && tokio::time::Instant::now() >= deadline
            {
                // The claim expired while this batch was in flight: the events may be another
                // replica's now. Deliveries are facts and are recorded; a retry or a dead
                // letter is a decision about a claim this relay no longer holds.
                let fenced = fence_settlements(&mut settlements);
                self.count_fenced(fenced);
                if fenced > 0 {
                    batch_report.fenced += fenced;
                    tracing::warn!(
                        worker,
                        fenced,
                        "the claim expired before its outcomes were recorded (was the relay paused?); recording deliveries only"
                    );
                }
            }
            let now = OffsetDateTime::now_utc();
            match self
                .within_source_timeout("settle", source.settle(&settlements, now))
                .await
            {
                Ok(()) => report += batch_report,
                Err(e) => {
                    // Nothing was recorded: every event of the batch stays pending and will be
                    // published again (duplicates, never loss).
                    report.settle_failures += 1;
                    metrics::counter!(m::SETTLE_FAILURES, self.labels(&[])).increment(1);
                    tracing::warn!(worker, error = %ErrorChain(&e), "could not record batch outcomes; its events will be published again");
                    if e.kind() == SourceErrorKind::Fatal {
                        return Err(RelayError::Source(e));
                    }
                    sleep_or_cancel(db_pause.take(), &shutdown).await;
                    continue;
                }
            }
            if let Some(err) = sink_down {
                let d = sink_pause.take();
                metrics::gauge!(m::SINK_UP, self.labels(&[])).set(0.0);
                tracing::warn!(worker, sink = self.sink.name(), error = %err.report(), retry_in = ?d, "broker unavailable; pausing");
                sleep_or_cancel(d, &shutdown).await;
            } else {
                sink_pause.reset();
                metrics::gauge!(m::SINK_UP, self.labels(&[])).set(1.0);
                if !more {
                    // A partial batch: pause up to `poll_interval` before the next fetch. A
                    // source that knows when events arrive (the CDC stream, LISTEN/NOTIFY)
                    // ends the pause as soon as there are; a plain poller sleeps it out.
                    tokio::select! {
                        () = source.wait_for_events(self.config.poll_interval) => {}
                        () = shutdown.cancelled() => {}
                    }
                }
            }
        }
        tracing::debug!(worker, ?report, "relay worker stopped");
        Ok(report)
    }

    /// `call`, or the database counted as unavailable past `relay.source_timeout`. The call
    /// is dropped then: a claim it held is rolled back with its connection, and what it was
    /// settling is published again (duplicates, never loss).
    async fn within_source_timeout<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, SourceError>>,
    ) -> Result<T, SourceError> {
        match tokio::time::timeout(self.config.source_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(SourceError::unavailable(format!(
                "the outbox database did not answer a {what} within {:?} (relay.source_timeout): unreachable, or a server gone without closing its connections",
                self.config.source_timeout
            ))),
        }
    }
}

/// Turns every outcome but `Delivered` into `Released` (the claim expired: retries and dead
/// letters are the new owner's to decide); returns how many changed.
fn fence_settlements(settlements: &mut [Settlement]) -> u64 {
    let mut fenced = 0;
    for s in settlements {
        if !matches!(s.outcome, Outcome::Delivered | Outcome::Released) {
            s.outcome = Outcome::Released;
            fenced += 1;
        }
    }
    fenced
}

/// Splits a batch into waves: wave `k` holds the `k`-th event of each aggregate, in batch
/// order. Without ordering the whole batch is one wave; with total order, one event per wave.
pub fn split_into_waves(events: Vec<Event>, ordering: Ordering) -> Vec<Vec<Event>> {
    match ordering {
        Ordering::None => vec![events],
        Ordering::Total => events.into_iter().map(|e| vec![e]).collect(),
        Ordering::PerAggregate => {
            let mut seen: HashMap<(&str, &str), usize> = HashMap::with_capacity(events.len());
            let mut wave_of = Vec::with_capacity(events.len());
            let mut waves_needed = 0;
            for e in &events {
                let n = seen
                    .entry((e.aggregate_type.as_str(), e.aggregate_id.as_str()))
                    .or_insert(0);
                wave_of.push(*n);
                *n += 1;
                waves_needed = waves_needed.max(*n);
            }
            drop(seen);
            if waves_needed <= 1 {
                return vec![events];
            }
            let mut waves: Vec<Vec<Event>> = (0..waves_needed).map(|_| Vec::new()).collect();
            for (e, w) in events.into_iter().zip(wave_of) {
                waves[w].push(e);
            }
            waves
        }
    }
}

async fn sleep_or_cancel(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(d) => {}
        () = shutdown.cancelled() => {}
    }
}

/// Displays an error with its whole `source()` chain on one line.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
