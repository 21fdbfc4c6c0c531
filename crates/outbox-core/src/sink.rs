//! The [`Sink`] trait: where events are published, and how a publish can fail.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;

use crate::Event;

/// How a publish failed, which decides what the relay does next (see
/// [`crate::policy::RetryPolicy::on_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkErrorKind {
    /// The broker cannot be reached or did not answer (connection refused, timeout, closed
    /// connection). Says nothing about the event: no attempt is counted, the event is released
    /// untouched and the relay pauses before the next batch.
    Unavailable,
    /// The broker refused this event for a reason that may pass (HTTP 429/5xx, a transient
    /// JetStream error). Counts as a failed attempt; retried with backoff, dead-lettered after
    /// `max_attempts`.
    Transient,
    /// The broker will never accept this event as it is (larger than its size limit, HTTP 4xx,
    /// an invalid subject). Dead-lettered at once with the reason.
    Rejected,
}

/// A publish failure: a kind (what to do) and a message (what happened, for humans).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct SinkError {
    kind: SinkErrorKind,
    message: String,
    #[source]
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

impl Clone for SinkError {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            message: self.message.clone(),
            source: self.source.clone(),
        }
    }
}

impl SinkError {
    /// A failure of the given kind.
    pub fn new(kind: SinkErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }
    /// The broker could not be reached; see [`SinkErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(SinkErrorKind::Unavailable, message)
    }
    /// A failure that may pass; see [`SinkErrorKind::Transient`].
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(SinkErrorKind::Transient, message)
    }
    /// The event can never be accepted; see [`SinkErrorKind::Rejected`].
    pub fn rejected(message: impl Into<String>) -> Self {
        Self::new(SinkErrorKind::Rejected, message)
    }
    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }
    /// What kind of failure this is.
    pub fn kind(&self) -> SinkErrorKind {
        self.kind
    }
    /// The message plus every cause in the chain, on one line (for logs and `last_error`).
    pub fn report(&self) -> String {
        let mut out = self.message.clone();
        let mut cause = self
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static));
        while let Some(e) = cause {
            let text = e.to_string();
            if !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cause = e.source();
        }
        out
    }
}

/// The result of publishing one event: `Ok` once the broker acknowledged it.
pub type Delivery = Result<(), SinkError>;

/// Publishes events to a broker.
///
/// Contract:
/// - `publish` returns one [`Delivery`] per input event, in input order, and returns `Ok(())`
///   for an event only after the broker acknowledged it durably (JetStream ack, Kafka delivery
///   report, publisher confirm, 2xx). `Err` for the whole call means no event of the batch may
///   be assumed published.
/// - The events of one call are independent: when ordering is on, the relay never passes two
///   events of the same aggregate in one call, so a sink may publish them all concurrently and
///   await the acknowledgements together.
/// - At-least-once: the same event may be published again after a crash or an unacknowledged
///   publish. Every message carries the event id so consumers can deduplicate.
pub trait Sink: Send + Sync + 'static {
    /// Short, stable name for logs and metric labels (`nats`, `http`, `stdout`, ...).
    fn name(&self) -> &'static str;

    /// Publishes `batch`; see the trait documentation for the contract.
    fn publish<'a>(
        &'a self,
        batch: &'a [Event],
    ) -> impl Future<Output = Result<Vec<Delivery>, SinkError>> + Send + 'a;

    /// Checks that the broker is reachable and configured (stream exists, endpoint answers).
    fn healthcheck(&self) -> impl Future<Output = Result<(), SinkError>> + Send;
}

pub use crate::future::BoxFuture;

/// Object-safe form of [`Sink`], implemented for every `Sink`; lets the binary choose a sink at
/// run time (`Box<dyn DynSink>` is itself a [`Sink`]).
pub trait DynSink: Send + Sync + 'static {
    /// See [`Sink::name`].
    fn dyn_name(&self) -> &'static str;
    /// See [`Sink::publish`].
    fn dyn_publish<'a>(
        &'a self,
        batch: &'a [Event],
    ) -> BoxFuture<'a, Result<Vec<Delivery>, SinkError>>;
    /// See [`Sink::healthcheck`].
    fn dyn_healthcheck(&self) -> BoxFuture<'_, Result<(), SinkError>>;
}

impl<T: Sink> DynSink for T {
    fn dyn_name(&self) -> &'static str {
        self.name()
    }
    fn dyn_publish<'a>(
        &'a self,
        batch: &'a [Event],
    ) -> BoxFuture<'a, Result<Vec<Delivery>, SinkError>> {
        Box::pin(self.publish(batch))
    }
    fn dyn_healthcheck(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(self.healthcheck())
    }
}

impl Sink for Box<dyn DynSink> {
    fn name(&self) -> &'static str {
        (**self).dyn_name()
    }
    fn publish<'a>(
        &'a self,
        batch: &'a [Event],
    ) -> impl Future<Output = Result<Vec<Delivery>, SinkError>> + Send + 'a {
        (**self).dyn_publish(batch)
    }
    fn healthcheck(&self) -> impl Future<Output = Result<(), SinkError>> + Send {
        (**self).dyn_healthcheck()
    }
}

impl<T: Sink> Sink for Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn publish<'a>(
        &'a self,
        batch: &'a [Event],
    ) -> impl Future<Output = Result<Vec<Delivery>, SinkError>> + Send + 'a {
        (**self).publish(batch)
    }
    fn healthcheck(&self) -> impl Future<Output = Result<(), SinkError>> + Send {
        (**self).healthcheck()
    }
}

/// The `[sink]` section of one broker kind: validated, then built into a sink. The runtime's
/// registry lists one line per implementation (`docs/architecture.md`).
pub trait BuildSink:
    serde::de::DeserializeOwned + std::fmt::Debug + Clone + Send + Sync + 'static
{
    /// The `kind` value that selects it.
    const KIND: &'static str;
    /// Checks what serde cannot; the message names the key (`sink.url: ...`).
    fn validate(&self) -> Result<(), String>;
    /// Connects. An unreachable broker is [`SinkErrorKind::Unavailable`] (the relay waits and
    /// tries again); a configuration mistake is any other kind.
    fn build(&self) -> BoxFuture<'_, Result<Box<dyn DynSink>, SinkError>>;
    /// Where `event` goes, for people: `NATS subject outbox.event.Order`.
    fn describe_destination(&self, event: &Event) -> String;
    /// The largest message this sink sends, in bytes (payload plus headers), when it has a
    /// limit: a claim-check's default threshold (docs/payloads.md). `None`: no limit of its
    /// own (HTTP, stdout, files).
    fn message_limit(&self) -> Option<usize> {
        None
    }
    /// The destination template (topic, subject, routing key, stream), for a subscription's
    /// `destination` to replace; `None` for a kind whose target is a URL or an ARN (give such
    /// a subscription a `[sinks.NAME]` of its own).
    fn destination_mut(&mut self) -> Option<&mut crate::Destination> {
        None
    }
    /// Checks that the broker is reachable and set up for this config **without changing
    /// anything** (`outbox doctor`), and says what it found. The default builds the sink and
    /// runs its healthcheck: a sink whose `build` creates something (a stream, a file)
    /// overrides it.
    fn check(&self) -> BoxFuture<'_, Result<String, SinkError>> {
        Box::pin(async move {
            let sink = self.build().await?;
            sink.dyn_healthcheck().await?;
            Ok(format!("{} sink reachable", Self::KIND))
        })
    }
    /// The same broker with a scratch destination named after `tag` for `outbox crash-test`
    /// (a stream, a topic, a key, a file of its own), which [`remove_scratch`](Self::remove_scratch)
    /// deletes afterwards. The default refuses: the destination cannot be read back, or this
    /// kind has no scratch destination yet.
    fn scratch(&self, tag: &crate::Identifier) -> Result<Self, String> {
        let _ = tag;
        Err(format!(
            "`outbox crash-test` has no scratch destination for sink kind = \"{}\": it needs a destination it can create, read back and delete (nats, kafka, redis, file); for this one, turn on the relay's canary ([canary] in docs/operations.md)",
            Self::KIND
        ))
    }
    /// Deletes the scratch destination of a config made by [`scratch`](Self::scratch);
    /// returns what it removed, for people. Removing what is already gone is not an error.
    fn remove_scratch(&self) -> BoxFuture<'_, Result<String, SinkError>> {
        Box::pin(async move {
            Err(SinkError::rejected(format!(
                "sink kind = \"{}\" has no scratch destination to remove",
                Self::KIND
            )))
        })
    }
    /// Connects a reader of the destination for `outbox verify`, which reads it back without
    /// taking messages from its consumers. The default refuses: the destination is one that
    /// consumers take messages from (a queue, a webhook).
    fn read_back(
        &self,
    ) -> BoxFuture<'_, Result<Box<dyn crate::verify::ReadBack>, crate::verify::ReadBackError>> {
        Box::pin(async move {
            Err(crate::verify::ReadBackError::consumed_destination(
                Self::KIND,
            ))
        })
    }
}
