//! Lanes: the one piece every consumer loop shares (JetStream, Redis Streams, RabbitMQ,
//! Kafka; the webhook receiver uses [`lane_of`] only).
//!
//! A loop parses each delivery into an [`InboxMessage`] and hands it to `Lanes::dispatch`
//! (module `schedule`), which queues it by key `(aggregate_type, aggregate_id)`. `lanes`
//! workers serve the keys; one key is served by one worker at a time, in delivery order:
//!
//! - handler `Ok` → the broker-specific `Settle::ack` (after the handler's commit);
//! - handler `Err` → **retried in place** after a backoff: the message stays at the head of
//!   its key's queue, so later messages of the same key wait (per-key order holds across
//!   retries), while the worker serves other keys meanwhile (a failing key never holds up
//!   another); the delivery is kept alive (`Settle::keep_alive`) so the broker does not
//!   hand it to another consumer;
//! - after `max_attempts` attempts (counting the broker's earlier deliveries, when it says)
//!   → `Settle::dead_letter` with the reason: the broker's dead-letter mechanism, never a
//!   silent ack;
//! - shutdown → messages in a handler finish and are acked; queued messages and messages
//!   waiting for a retry are released (`Settle::release`) for redelivery.

// Without a loop feature only the public policy, report and error types are used.
#![cfg_attr(
    not(any(
        feature = "nats",
        feature = "redis",
        feature = "rabbitmq",
        feature = "kafka"
    )),
    allow(dead_code, unused_imports)
)]

use std::collections::hash_map::DefaultHasher;
use std::error::Error as StdError;
use std::fmt::Display;
use std::hash::{Hash, Hasher};
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

use crate::{InboxError, InboxMessage};

mod schedule;

pub(crate) use schedule::{Lanes, Settle};

/// Where a consumer loop's order gate reads which delivery position of an aggregate was
/// applied last, and records one it passes without applying (a dead letter). Implemented by
/// [`PgInbox::order_gate`](crate::PgInbox::order_gate),
/// [`SqliteInbox::order_gate`](crate::SqliteInbox::order_gate) and `MySqlInbox::order_gate`
/// (feature `mysql`), whose positions the handler writes with the side effect
/// (`begin_message` / `process_message`).
pub trait OrderGate: Send + Sync + 'static {
    /// The highest position of the aggregate this consumer applied; 0 when none.
    fn applied<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, InboxError>>;

    /// Records that position `seq` is passed without being applied (its message was
    /// dead-lettered), so that its successor need not wait for it.
    fn pass<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<(), InboxError>>;
}

/// Per-aggregate order at the consumer, across crashes, redeliveries and instances: a message
/// whose `aggregate_seq` is more than one past the last applied position of its aggregate is
/// held (not handled, not counted as an attempt, kept alive) until its predecessor is applied
/// here or by another instance, or until `gap_timeout` passes; then it is handled with a
/// warning and counted in [`ConsumerReport::gaps`]. Messages without a position (DynamoDB,
/// `ordering = "none"` polling) pass at once. See `docs/inbox.md`, "Order at the consumer".
#[derive(Clone)]
pub struct ConsumerOrder {
    gate: Arc<dyn OrderGate>,
    gap_timeout: Duration,
}

impl ConsumerOrder {
    /// Order by `gate`, with a gap timeout of 2 minutes.
    pub fn new(gate: impl OrderGate) -> Self {
        Self {
            gate: Arc::new(gate),
            gap_timeout: Duration::from_secs(120),
        }
    }

    /// How long a message waits for a missing predecessor before it is handled anyway (the
    /// predecessor was dead-lettered by the relay, or lost with a broker's retention). Keep
    /// it above the broker's redelivery delay (JetStream `ack_wait`, Redis `claim_idle`).
    #[must_use]
    pub fn gap_timeout(mut self, timeout: Duration) -> Self {
        self.gap_timeout = timeout;
        self
    }

    pub(crate) fn gate(&self) -> &dyn OrderGate {
        self.gate.as_ref()
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.gap_timeout
    }
}

impl std::fmt::Debug for ConsumerOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerOrder")
            .field("gap_timeout", &self.gap_timeout)
            .finish_non_exhaustive()
    }
}

/// What a consumer loop calls for each message: any
/// `Fn(InboxMessage) -> impl Future<Output = Result<(), E>>` (`Send`, `'static`), where `E`
/// is `Display`. It should run its side effect through the inbox and return `Ok` for both
/// `Processed` and `Duplicate`; `Err` means "not done, retry".
pub trait MessageHandler: Send + Sync + 'static {
    /// The handler's error (logged, and the dead-letter reason after the last attempt).
    type Error: Display + Send + 'static;
    /// The future of one call.
    type Future: Future<Output = Result<(), Self::Error>> + Send + 'static;
    /// Handles one message.
    fn call(&self, message: InboxMessage) -> Self::Future;
}

impl<H, Fut, E> MessageHandler for H
where
    H: Fn(InboxMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    type Error = E;
    type Future = Fut;
    fn call(&self, message: InboxMessage) -> Fut {
        self(message)
    }
}

/// A boxed error cause.
pub(crate) type BoxError = Box<dyn StdError + Send + Sync>;

/// How a consumer loop spreads, retries and gives up on messages (every loop has one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanePolicy {
    /// Messages handled at once (workers). Messages of one key are never handled at once,
    /// and keep their delivery order. Default 4.
    pub lanes: NonZeroUsize,
    /// Most messages held at once, handled or queued (also the broker-side prefetch or
    /// unacknowledged limit where the broker has one). Default 256.
    pub max_in_flight: NonZeroUsize,
    /// Handler attempts of one message before it is dead-lettered. Default 10.
    pub max_attempts: NonZeroU32,
    /// Wait before the first retry; doubles per attempt. Default 1 s.
    pub backoff_base: Duration,
    /// Longest wait between two attempts. Default 60 s.
    pub backoff_max: Duration,
}

impl Default for LanePolicy {
    fn default() -> Self {
        Self {
            lanes: NonZeroUsize::new(4).expect("not zero"),
            max_in_flight: NonZeroUsize::new(256).expect("not zero"),
            max_attempts: NonZeroU32::new(10).expect("not zero"),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
    }
}

impl LanePolicy {
    /// The wait after the `attempt`-th failed attempt: `backoff_base × 2^(attempt-1)`,
    /// capped at `backoff_max`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(20));
        self.backoff_base
            .saturating_mul(factor)
            .min(self.backoff_max)
    }
}

/// The lane of a key among `lanes` (the webhook receiver's key locks): the same key always
/// maps to the same lane.
pub fn lane_of(aggregate_type: &str, aggregate_id: &str, lanes: NonZeroUsize) -> usize {
    let mut hasher = DefaultHasher::new();
    (aggregate_type, aggregate_id).hash(&mut hasher);
    usize::try_from(hasher.finish() % lanes.get() as u64).unwrap_or(0)
}

/// Why a consumer loop could not run (every loop returns it).
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The broker could not be reached.
    #[error("cannot connect to {broker} at {url}")]
    Connect {
        /// Which broker.
        broker: &'static str,
        /// Its address (password masked).
        url: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The broker refused a set-up step or the stream of deliveries failed for good.
    #[error("{broker} refused to {what}")]
    Broker {
        /// Which broker.
        broker: &'static str,
        /// What the loop tried to do.
        what: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The consumer's settings are unusable.
    #[error("consumer config: {0}")]
    Config(String),
}

impl ConsumerError {
    /// Connecting to `url` failed; the error shows the URL with its password masked.
    #[cfg_attr(
        not(any(feature = "nats", feature = "redis", feature = "rabbitmq")),
        allow(dead_code)
    )]
    pub(crate) fn connect(broker: &'static str, url: &str, source: impl Into<BoxError>) -> Self {
        Self::Connect {
            broker,
            url: redact(url),
            source: source.into(),
        }
    }

    pub(crate) fn broker(
        broker: &'static str,
        what: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Broker {
            broker,
            what: what.into(),
            source: source.into(),
        }
    }
}

/// The URL with its password masked.
#[cfg_attr(
    not(any(feature = "nats", feature = "redis", feature = "rabbitmq")),
    allow(dead_code)
)]
fn redact(url: &str) -> String {
    outbox_core::redact::redact_url(url)
}

/// What one run of a consumer loop did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// Messages handled and acknowledged (processed or found to be duplicates).
    pub acked: u64,
    /// Failed handler attempts that were retried.
    pub retried: u64,
    /// Messages handed to the dead-letter mechanism (after `max_attempts`, or not following
    /// the contract).
    pub dead_lettered: u64,
    /// Messages given back unhandled at shutdown, for redelivery.
    pub released: u64,
    /// Deliveries refused before any handler ran (the webhook receiver's bad, stale or
    /// unsigned requests).
    pub rejected: u64,
    /// Times a message waited for its aggregate's previous position (order gate).
    pub held: u64,
    /// Messages handled after `gap_timeout` without their predecessor (order gate).
    pub gaps: u64,
}

/// What the lanes did, counted as they go.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acked: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) held: AtomicU64,
    pub(crate) gaps: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn report(&self) -> ConsumerReport {
        ConsumerReport {
            acked: self.acked.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            rejected: 0,
            held: self.held.load(Ordering::Relaxed),
            gaps: self.gaps.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_attempt_up_to_the_cap() {
        let p = LanePolicy::default();
        assert_eq!(p.backoff(1), Duration::from_secs(1));
        assert_eq!(p.backoff(3), Duration::from_secs(4));
        assert_eq!(p.backoff(30), Duration::from_secs(60));
    }

    #[test]
    fn passwords_are_masked_in_urls() {
        assert_eq!(
            redact("amqp://guest:s3cret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
    }

    #[test]
    fn a_key_always_maps_to_the_same_lane() {
        let n = NonZeroUsize::new(7).expect("not zero");
        assert_eq!(lane_of("Order", "o_1", n), lane_of("Order", "o_1", n));
        assert!(lane_of("Order", "o_2", n) < 7);
    }
}
