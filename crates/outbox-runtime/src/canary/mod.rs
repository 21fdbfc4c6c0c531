//! `[canary]`: the relay proves its own delivery while it runs.
//!
//! Every `every`, the relay writes a probe event ([`outbox_core::canary::Probe`]) into its
//! outbox table in a transaction of its own, exactly as a producer would, and reads the
//! destination back (the same read-back `outbox verify` uses) until the probe shows up:
//!
//! - `outbox_canary_latency_seconds`: its commit to its arrival (the broker's stored time
//!   where the read-back gives one, else the read that found it);
//! - `outbox_canary_lost_total`: a probe the destination did not show within `lost_after`
//!   while the table no longer holds it as pending (a probe still pending is behind the
//!   backlog, not lost: the backlog alerts cover that);
//! - `outbox_canary_out_of_order_total`: a probe that arrived after a later one (the probes
//!   of one relay process are one aggregate).
//!
//! A destination that cannot be read back (a queue, a webhook) still gets the probes, for a
//! consumer-side canary (`outbox_inbox::canary`); the relay says once that it cannot check
//! them itself. The tracking is `tracker.rs`; this file is the loop and its I/O.

mod tracker;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::backend::Backend;
use outbox_core::canary::Probe;
use outbox_core::metrics as m;
use outbox_core::relay::ErrorChain;
use outbox_core::verify::{
    DeliveryLedger, NoProgress, ReadBack, ReadBackError, ReadBackErrorKind, RowState,
};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::registry::SinkConfig;
use tracker::{Observation, Tracker};

/// `[canary]`: a probe event written and read back every `every` (off when `every` is unset).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CanaryConfig {
    /// How often a probe is written (`"10s"`); unset: no canary.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub every: Option<Duration>,
    /// A probe the destination has not shown this long after its commit, and that the table
    /// no longer holds as pending, counts as lost.
    #[serde(with = "humantime_serde")]
    pub lost_after: Duration,
    /// The probes' aggregate id: letters, digits, `-` and `_`. Unset: the host name and a
    /// random suffix per process, so every relay process has its own aggregate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Default for CanaryConfig {
    fn default() -> Self {
        Self {
            every: None,
            lost_after: Duration::from_secs(60),
            name: None,
        }
    }
}

/// The shortest `canary.every` accepted.
const MIN_EVERY: Duration = Duration::from_millis(100);

impl CanaryConfig {
    /// Checks what serde cannot; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(every) = self.every
            && every < MIN_EVERY
        {
            return Err(format!(
                "canary.every: {} is too short (at least {})",
                humantime::format_duration(every),
                humantime::format_duration(MIN_EVERY)
            ));
        }
        if self.lost_after < Duration::from_secs(1) {
            return Err("canary.lost_after: must be at least 1s".into());
        }
        if let Some(name) = &self.name
            && (name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(format!(
                "canary.name: `{name}` must be 1 to 64 letters, digits, `-` or `_` (it becomes the probes' aggregate id, and so part of destination names)"
            ));
        }
        Ok(())
    }

    /// The probes' aggregate id for this process.
    fn relay_name(&self) -> String {
        if let Some(name) = &self.name {
            return name.clone();
        }
        let host = std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
            .unwrap_or_default();
        let host: String = host
            .trim()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let suffix = &Uuid::new_v4().simple().to_string()[..6];
        if host.is_empty() {
            format!("relay-{suffix}")
        } else {
            format!("{host}-{suffix}")
        }
    }
}

/// What the console's canary tile shows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CanaryStatus {
    /// The probes' aggregate id.
    pub relay: String,
    /// Seconds between probes.
    pub every_seconds: f64,
    /// Probes written.
    pub written: u64,
    /// Why the last probe could not be written.
    pub write_error: Option<String>,
    /// Each destination the probes are read back from: `[sink]`, or each subscription that
    /// asks for probes.
    pub destinations: Vec<DestinationStatus>,
}

/// The canary's view of one destination.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DestinationStatus {
    /// The subscription, `None` for `[sink]`.
    pub subscription: Option<String>,
    /// The sink's kind.
    pub kind: String,
    /// Whether the destination can be read back; `None` until the relay knows.
    pub readable: Option<bool>,
    /// Why it cannot be read back, or the last read error.
    pub problem: Option<String>,
    /// Probes seen at the destination.
    pub arrived: u64,
    /// Probes counted lost.
    pub lost: u64,
    /// Probes that arrived after a later one.
    pub out_of_order: u64,
    /// Probes written and not seen yet.
    pub in_flight: u64,
    /// The last probe's commit-to-arrival latency, seconds.
    pub last_latency_seconds: Option<f64>,
    /// When the last probe arrived (RFC 3339).
    pub last_arrival: Option<String>,
}

/// The status shared with the console.
pub type SharedStatus = Arc<Mutex<CanaryStatus>>;

/// Where the probes are read back: `[sink]` (no subscription), or a subscription that asks
/// for probes (`aggregate_type` naming `outbox.canary`).
#[derive(Debug, Clone)]
pub struct Target {
    /// The subscription, `None` for `[sink]`.
    pub subscription: Option<String>,
    /// Its sink, destination applied.
    pub sink: SinkConfig,
}

/// How long one read of the destination may take before it is abandoned (and retried).
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The first pause between reads while a probe is in flight; it doubles up to
/// [`MAX_POLL`] and starts again at each new probe.
const FIRST_POLL: Duration = Duration::from_millis(20);
const MAX_POLL: Duration = Duration::from_secs(1);

/// The canary of one relay: writes probes into `backend`'s table and reads them back from
/// each of `targets` until `shutdown`.
pub async fn run(
    config: CanaryConfig,
    backend: Arc<dyn Backend>,
    targets: Vec<Target>,
    status: SharedStatus,
    shutdown: CancellationToken,
) {
    let Some(every) = config.every else { return };
    let producer = match backend.producer() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(reason = %e, "canary off: this database cannot write probes");
            return;
        }
    };
    let relay = config.relay_name();
    if let Ok(mut s) = status.lock() {
        s.relay.clone_from(&relay);
        s.every_seconds = every.as_secs_f64();
        s.destinations = targets
            .iter()
            .map(|t| DestinationStatus {
                subscription: t.subscription.clone(),
                kind: t.sink.kind().to_owned(),
                ..DestinationStatus::default()
            })
            .collect();
    }
    if targets.is_empty() {
        tracing::info!(relay = %relay, "canary: no subscription asks for probes (aggregate_type = \"outbox.canary\"); probes are written for consumer-side canaries only");
    }
    tracing::info!(relay = %relay, every = %humantime::format_duration(every), "canary on: writing a probe event every interval and reading it back from the destination");
    // The outbox table's own ledger says whether `[sink]`'s probes are still pending; a
    // subscription's rows live in its own table, so its probes are judged by time alone.
    let ledger = backend.delivery_ledger().ok();
    let mut watches: Vec<Watch<'_>> = targets
        .into_iter()
        .enumerate()
        .map(|(index, target)| Watch {
            index,
            ledger: if target.subscription.is_none() {
                ledger
            } else {
                None
            },
            target,
            tracker: Tracker::new(relay.clone()),
            reader: Reader::NotYet,
            lost_after: config.lost_after,
            status: status.clone(),
        })
        .collect();
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    let mut poll = FIRST_POLL;
    loop {
        let watching = watches.iter().any(Watch::watching);
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticker.tick() => {
                n += 1;
                if let Some((id, committed_at)) = write(producer, &relay, n, &status).await {
                    for watch in &mut watches {
                        watch.connect().await;
                        watch.issued(id, n, committed_at);
                    }
                }
                poll = FIRST_POLL;
            }
            () = tokio::time::sleep(poll), if watching => {
                for watch in &mut watches {
                    if watch.watching() {
                        watch.read().await;
                        watch.settle_overdue().await;
                    }
                }
                poll = (poll * 2).min(MAX_POLL);
            }
        }
        for watch in &watches {
            watch.publish_status();
        }
    }
}

/// Writes probe `n` in its own transaction; its id and commit time.
async fn write(
    producer: &dyn outbox_core::backend::Producer,
    relay: &str,
    n: u64,
    status: &SharedStatus,
) -> Option<(Uuid, OffsetDateTime)> {
    let id = Uuid::now_v7();
    let probe = Probe {
        relay: relay.to_owned(),
        n,
        written_at: OffsetDateTime::now_utc(),
    };
    let result = producer.commit(&[probe.event().with_id(id)]).await;
    let mut s = status
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match result {
        Ok(()) => {
            metrics::counter!(m::CANARY_PROBES).increment(1);
            s.written += 1;
            s.write_error = None;
            Some((id, OffsetDateTime::now_utc()))
        }
        Err(e) => {
            tracing::warn!(probe = n, error = %ErrorChain(&e), "canary: could not write the probe");
            s.write_error = Some(format!("writing probe {n}: {}", ErrorChain(&e)));
            None
        }
    }
}

/// The destination's reader.
enum Reader {
    /// Not connected yet (or the last attempt failed: tried again at the next probe).
    NotYet,
    Ready(Box<dyn ReadBack>),
    /// The destination cannot be read back: probes are written for a consumer-side canary.
    Unreadable,
}

/// One destination's probes.
struct Watch<'a> {
    index: usize,
    target: Target,
    tracker: Tracker,
    reader: Reader,
    ledger: Option<&'a dyn DeliveryLedger>,
    lost_after: Duration,
    status: SharedStatus,
}

impl Watch<'_> {
    fn watching(&self) -> bool {
        self.tracker.in_flight() > 0 && matches!(self.reader, Reader::Ready(_))
    }

    fn update(&self, f: impl FnOnce(&mut DestinationStatus)) {
        let mut s = self
            .status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(d) = s.destinations.get_mut(self.index) {
            f(d);
        }
    }

    fn counter(&self, name: &'static str) -> metrics::Counter {
        match &self.target.subscription {
            Some(sub) => metrics::counter!(name, "subscription" => sub.clone()),
            None => metrics::counter!(name),
        }
    }

    /// Probe `n` was committed: wait for it, unless this destination cannot be read back.
    fn issued(&mut self, id: Uuid, n: u64, committed_at: OffsetDateTime) {
        if !matches!(self.reader, Reader::Unreadable) {
            self.tracker.issued(id, n, committed_at);
        }
    }

    /// Connects the reader if it is not yet.
    async fn connect(&mut self) {
        if !matches!(self.reader, Reader::NotYet) {
            return;
        }
        let subscription = self.target.subscription.clone().unwrap_or_default();
        match self.target.sink.read_back().await {
            Ok(reader) => {
                tracing::debug!(subscription, destination = %reader.describe(), "canary reads the destination back");
                self.reader = Reader::Ready(reader);
                self.update(|s| {
                    s.readable = Some(true);
                    s.problem = None;
                });
            }
            Err(ReadBackError {
                kind: ReadBackErrorKind::Unsupported,
                message,
            }) => {
                tracing::info!(subscription, reason = %message, "canary: probes are written, but this destination cannot be read back by the relay; check them with a consumer-side canary (docs/operations.md#canary)");
                self.reader = Reader::Unreadable;
                self.tracker = Tracker::new(String::new());
                self.update(|s| {
                    s.readable = Some(false);
                    s.problem = Some(message);
                });
            }
            Err(e) => {
                tracing::warn!(subscription, error = %e, "canary: cannot read the destination back yet; trying again at the next probe");
                self.update(|s| s.problem = Some(e.message.clone()));
            }
        }
    }

    /// Reads the destination from the oldest probe in flight and records what arrived.
    async fn read(&mut self) {
        let Reader::Ready(reader) = &self.reader else {
            return;
        };
        let Some(from) = self.tracker.read_from() else {
            return;
        };
        let expected = self.tracker.expected();
        let read = tokio::time::timeout(READ_TIMEOUT, reader.read(from, &expected, &NoProgress));
        let outcome = match read.await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "canary: reading the destination back failed");
                self.update(|s| s.problem = Some(e.message.clone()));
                return;
            }
            Err(_) => {
                tracing::warn!(timeout = ?READ_TIMEOUT, "canary: reading the destination back took too long");
                return;
            }
        };
        let now = OffsetDateTime::now_utc();
        for observation in self.tracker.observe(&outcome.messages, now) {
            match observation {
                Observation::Arrived {
                    n, latency_seconds, ..
                } => {
                    match &self.target.subscription {
                        Some(sub) => metrics::histogram!(m::CANARY_LATENCY_SECONDS, "subscription" => sub.clone()).record(latency_seconds),
                        None => metrics::histogram!(m::CANARY_LATENCY_SECONDS).record(latency_seconds),
                    }
                    tracing::debug!(probe = n, latency_seconds, "canary probe arrived");
                    self.update(|s| {
                        s.arrived += 1;
                        s.last_latency_seconds = Some(latency_seconds);
                        s.last_arrival = Some(outbox_core::admin::when(now));
                        s.problem = None;
                    });
                }
                Observation::OutOfOrder { id, n, after } => {
                    self.counter(m::CANARY_OUT_OF_ORDER).increment(1);
                    tracing::error!(probe = n, event_id = %id, after_probe = after, "canary probe arrived after a later probe of the same relay: per-aggregate order was broken on the way to the destination");
                    self.update(|s| s.out_of_order += 1);
                }
                Observation::ArrivedAfterLost { id, n } => {
                    tracing::warn!(probe = n, event_id = %id, "canary probe counted lost arrived after all");
                }
            }
        }
    }

    /// Counts overdue probes lost, unless the table still holds them as pending.
    async fn settle_overdue(&mut self) {
        let overdue = self
            .tracker
            .overdue(OffsetDateTime::now_utc(), self.lost_after);
        if overdue.is_empty() {
            return;
        }
        let ids: Vec<Uuid> = overdue.iter().map(|(id, _)| *id).collect();
        let pending: Vec<Uuid> = match self.ledger {
            Some(ledger) => match ledger.lookup(&ids).await {
                Ok(rows) => rows
                    .into_iter()
                    .filter(|r| r.state == RowState::Undelivered)
                    .map(|r| r.id)
                    .collect(),
                // Unknown: decided at the next read.
                Err(_) => return,
            },
            None => Vec::new(),
        };
        for (id, n) in overdue {
            if pending.contains(&id) {
                continue;
            }
            self.tracker.lost(id);
            self.counter(m::CANARY_LOST).increment(1);
            tracing::error!(probe = n, event_id = %id, lost_after = %humantime::format_duration(self.lost_after), "canary probe lost: the table no longer holds it as pending, and the destination has not shown it");
            self.update(|s| s.lost += 1);
        }
    }

    fn publish_status(&self) {
        let in_flight = self.tracker.in_flight() as u64;
        #[allow(clippy::cast_precision_loss)]
        let value = in_flight as f64;
        match &self.target.subscription {
            Some(sub) => {
                metrics::gauge!(m::CANARY_IN_FLIGHT, "subscription" => sub.clone()).set(value)
            }
            None => metrics::gauge!(m::CANARY_IN_FLIGHT).set(value),
        }
        self.update(|s| s.in_flight = in_flight);
    }
}
