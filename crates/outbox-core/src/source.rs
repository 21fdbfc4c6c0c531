//! The [`Source`] trait: where committed events come from, and how their fate is recorded.

use std::error::Error as StdError;
use std::future::Future;
use std::time::Duration;

use time::OffsetDateTime;

use crate::{Event, Position};

/// How reading or settling failed, which decides what the relay does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceErrorKind {
    /// The database went away or timed out. The relay backs off and tries again; nothing was
    /// recorded, so every event of the batch will be fetched again.
    Unavailable,
    /// Retrying cannot help (the outbox table does not exist, permission denied, an invalid
    /// configuration). The relay stops with this error.
    Fatal,
}

/// A failure of the source, with a kind and the underlying cause.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SourceError {
    kind: SourceErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl SourceError {
    /// A failure of the given kind.
    pub fn new(kind: SourceErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }
    /// The database could not be reached; see [`SourceErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(SourceErrorKind::Unavailable, message)
    }
    /// Retrying cannot help; see [`SourceErrorKind::Fatal`].
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(SourceErrorKind::Fatal, message)
    }
    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
    /// What kind of failure this is.
    pub fn kind(&self) -> SourceErrorKind {
        self.kind
    }
}

/// What became of one fetched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker acknowledged it. Mark it delivered (or delete it).
    Delivered,
    /// Publishing failed; try again not before `not_before`. Counts one failed attempt.
    Retry {
        /// Earliest time of the next attempt.
        not_before: OffsetDateTime,
        /// What went wrong, for `last_error` and `outbox why`.
        error: String,
    },
    /// Give up on it: keep it as a dead letter with the reason. Counts one failed attempt.
    DeadLetter {
        /// Why it was dead-lettered.
        reason: String,
    },
    /// It was not attempted (an earlier event of its aggregate failed in the same batch, the
    /// broker was unavailable, or the relay is shutting down). Leave it exactly as it was.
    Released,
}

/// The outcome of one event, addressed by its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The event's position, as fetched.
    pub position: Position,
    /// What became of it.
    pub outcome: Outcome,
}

/// A batch of events claimed by [`Source::fetch`].
#[derive(Debug, Default)]
pub struct Fetched {
    /// Events ready to publish, in source order. When ordering is on, each aggregate's events
    /// are in commit order and none has an earlier undelivered event outside this batch.
    pub events: Vec<Event>,
    /// True when the source stopped at the batch limit, so more events are probably ready and
    /// the relay should fetch again at once.
    pub more: bool,
    /// Until when (monotonic clock) the claim on these events is this source's alone: past it,
    /// another replica may claim them (a row lock dropped by `idle_in_transaction_session_timeout`,
    /// an expired lease). The relay publishes no wave that could not finish before it and
    /// records no retry or dead letter after it (fencing a relay that was paused). `None`: the
    /// claim cannot expire (one stream, one reader).
    pub valid_until: Option<tokio::time::Instant>,
}

/// Reads committed outbox events and records what became of them.
///
/// Contract:
/// - At-least-once: after a crash `fetch` may return events that were already published;
///   `settle` is idempotent.
/// - Only committed events are returned (no phantom from a rolled-back transaction).
/// - When the source is configured for per-aggregate ordering, events with the same
///   `(aggregate_type, aggregate_id)` come back in commit order, and an event is returned only
///   when every earlier event of its aggregate is delivered or in the same batch — also with
///   several relay replicas on the same table.
/// - After a non-empty `fetch`, the relay calls `settle` exactly once, with one settlement per
///   fetched event, before it fetches again. Claimed events stay invisible to other replicas
///   until then.
pub trait Source: Send + 'static {
    /// Claims up to `limit` events that are ready at `now` (the clock is a parameter so tests
    /// can move time).
    fn fetch(
        &mut self,
        limit: usize,
        now: OffsetDateTime,
    ) -> impl Future<Output = Result<Fetched, SourceError>> + Send;

    /// Records the outcomes of the last fetched batch at `now` and releases the claim.
    fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Waits until new events may be ready, at most `max`. Sources with a wake-up channel
    /// (LISTEN/NOTIFY) return early when it fires; the default just sleeps.
    fn wait_for_events(&mut self, max: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(max)
    }
}

/// Counts that describe the backlog, for metrics, `status` and the watchdog.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Backlog {
    /// Events not yet delivered and not dead-lettered.
    pub pending: u64,
    /// Of `pending`, events that failed at least once and wait for their next attempt.
    pub retrying: u64,
    /// Dead-lettered events.
    pub dead: u64,
    /// Age in seconds of the oldest pending event that is not waiting on backoff.
    pub oldest_pending_age_seconds: f64,
    /// Events delivered in the last minute (when the source keeps delivered rows).
    pub delivered_last_minute: Option<u64>,
}

/// Optional ability of a source: report its backlog.
pub trait Inspect: Send + Sync + 'static {
    /// Reads the backlog counters.
    fn backlog(&self) -> impl Future<Output = Result<Backlog, SourceError>> + Send;
}
