//! [`JetStreamConsumer`] (feature `nats`): a durable JetStream pull-consumer loop.
//!
//! - **Ack after commit.** A message is acknowledged (double ack: confirmed by the server)
//!   only after the handler returned `Ok`, i.e. after its inbox transaction committed. A
//!   crash between commit and ack redelivers the message after `ack_wait`; the inbox then
//!   reports a duplicate and the handler should return `Ok` again, which acks it.
//! - **Per-key order with concurrency.** Messages go through the shared [lanes](crate::lane):
//!   `policy.lanes` at once, one at a time per key `(aggregate_type, aggregate_id)`. At
//!   most `policy.max_in_flight` messages are unacknowledged (`max_ack_pending`).
//! - **Failures.** A handler error is retried in place with backoff (sending `+WPI` "in
//!   progress" every `ack_wait / 2` so JetStream does not redeliver meanwhile), so later
//!   messages of the same key wait: order holds across retries. After
//!   `policy.max_attempts` attempts (JetStream's delivery count included) the message is
//!   terminated (`+TERM`), which makes JetStream publish a
//!   `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>` advisory; the message
//!   stays in the stream (subject to its retention) and can be replayed from there.
//! - A message without the contract headers is terminated at once.
//! - **Shutdown.** When the token is cancelled the loop stops pulling; the messages being
//!   handled finish and are acked, the rest are nak'ed for redelivery.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::InboxMessage;
use crate::lane::{
    BoxError, ConsumerError, ConsumerOrder, ConsumerReport, LanePolicy, Lanes, MessageHandler,
    Settle,
};

/// Broker headers that are not the row's own.
const SKIP_HEADERS: &[&str] = &["Nats-Msg-Id"];

const BROKER: &str = "NATS";

/// Config and runner of one durable pull consumer.
#[derive(Debug, Clone)]
pub struct JetStreamConsumer {
    /// Server URL, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The stream to consume (must exist: the relay's NATS sink creates it).
    pub stream: String,
    /// Durable consumer name: restarts resume where the last run acknowledged.
    pub durable: String,
    /// Only subjects matching this filter; empty for the whole stream.
    pub filter_subject: String,
    /// How long JetStream waits for an ack before redelivering (a crashed consumer's
    /// messages come back after this). Default 30 s.
    pub ack_wait: Duration,
    /// Lanes, in-flight bound, attempts and backoff.
    pub policy: LanePolicy,
    /// The durable's `max_ack_pending`: unacknowledged messages over ALL instances sharing
    /// the durable. `None` (default): `max_in_flight`. The trade-off (docs/inbox.md, "NATS
    /// JetStream"): after an instance dies, its unacknowledged messages keep their slots
    /// until `ack_wait`, so with the default a dead instance that held the whole window
    /// stalls the durable for up to `ack_wait`. Without the order gate, set it to
    /// `instances × (max_in_flight + max_in_flight / 4)` and a dead instance's messages only
    /// hold themselves. With the gate keep the default: a larger window lets two instances
    /// fill their lanes with messages held for predecessors waiting in each other's pull
    /// buffer, until `gap_timeout`.
    pub max_ack_pending: Option<usize>,
    /// Per-aggregate order across crashes and instances (`None`: per-key order within this
    /// instance only). Build it with the inbox's `order_gate`; see [`ConsumerOrder`].
    pub ordered: Option<ConsumerOrder>,
}

impl JetStreamConsumer {
    /// A consumer of `stream` named `durable`, with `ack_wait` 30 s and the default
    /// [`LanePolicy`] (4 lanes, 256 in flight, 10 attempts, backoff 1 s doubling to 60 s).
    pub fn new(
        url: impl Into<String>,
        stream: impl Into<String>,
        durable: impl Into<String>,
    ) -> Self {
        Self {
            url: url.into(),
            stream: stream.into(),
            durable: durable.into(),
            filter_subject: String::new(),
            ack_wait: Duration::from_secs(30),
            policy: LanePolicy::default(),
            max_ack_pending: None,
            ordered: None,
        }
    }

    /// Messages asked for per pull: a quarter of `max_in_flight`, at most 64 (they wait in
    /// the client's buffer, without keep-alives, until the lanes take them).
    fn pull_batch(&self) -> usize {
        (self.policy.max_in_flight.get() / 4).clamp(1, 64)
    }

    /// The durable's `max_ack_pending` (see the field).
    pub fn max_ack_pending(&self) -> usize {
        self.max_ack_pending
            .unwrap_or(self.policy.max_in_flight.get())
    }

    /// Runs until `shutdown` is cancelled, calling `handler` for each message (see
    /// [`MessageHandler`]), and returns what it did.
    pub async fn run<H: MessageHandler>(
        &self,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let client = async_nats::connect(&self.url)
            .await
            .map_err(|e| ConsumerError::connect(BROKER, &self.url, e))?;
        let js = jetstream::new(client);
        let stream = js.get_stream(&self.stream).await.map_err(|e| {
            ConsumerError::broker(BROKER, format!("open stream {}", self.stream), e)
        })?;
        let config = pull::Config {
            durable_name: Some(self.durable.clone()),
            filter_subject: self.filter_subject.clone(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            // The lanes count deliveries and terminate; JetStream's own limit would
            // stop redelivering silently.
            max_deliver: -1,
            max_ack_pending: i64::try_from(self.max_ack_pending()).unwrap_or(i64::MAX),
            ..Default::default()
        };
        let mut consumer: jetstream::consumer::PullConsumer = stream
            .get_or_create_consumer(&self.durable, config.clone())
            .await
            .map_err(|e| {
                ConsumerError::broker(BROKER, format!("create consumer {}", self.durable), e)
            })?;
        // An existing durable keeps the settings it was created with; the loop times its
        // keep-alives from its own, so a changed `ack_wait` or `max_in_flight` is applied to
        // the durable (or refused by the server with its reason), never silently ignored.
        let existing = &consumer.cached_info().config;
        if existing.ack_wait != config.ack_wait
            || existing.max_ack_pending != config.max_ack_pending
            || existing.max_deliver != config.max_deliver
        {
            tracing::info!(
                durable = %self.durable,
                ack_wait = ?config.ack_wait,
                max_ack_pending = config.max_ack_pending,
                "updating the durable consumer to the configured settings"
            );
            consumer = stream.update_consumer(config).await.map_err(|e| {
                ConsumerError::broker(
                    BROKER,
                    format!(
                        "update consumer {} to ack_wait {:?} and max_ack_pending {}",
                        self.durable,
                        self.ack_wait,
                        self.max_ack_pending()
                    ),
                    e,
                )
            })?;
        }
        // Pulled messages wait in the client's buffer until the lanes take them, without
        // keep-alives: keep that buffer small.
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(self.pull_batch())
            .heartbeat(Duration::from_secs(15))
            .messages()
            .await
            .map_err(|e| ConsumerError::broker(BROKER, "pull messages", e))?;

        let settle = Arc::new(JetStreamSettle {
            ack_wait: self.ack_wait,
        });
        let lanes = Lanes::start(
            &self.policy,
            self.ordered.clone(),
            settle,
            handler,
            &shutdown,
        );
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => break,
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(m)) => m,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "JetStream pull failed; retrying");
                    continue;
                }
                None => break,
            };
            let headers = message
                .headers
                .as_ref()
                .map(|h| {
                    h.iter()
                        .filter_map(|(n, v)| Some((n.as_ref(), v.first()?.as_str())))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            // The NATS CloudEvents binding percent-encodes `ce-` header values.
            let parsed = InboxMessage::from_percent_encoded_headers(
                headers,
                SKIP_HEADERS,
                message.payload.clone(),
            )
            .map_err(|e| e.to_string());
            let delivered = message.info().map_or(1, |i| i.delivered);
            let earlier = u32::try_from(delivered.saturating_sub(1)).unwrap_or(u32::MAX);
            if !lanes.offer(message, parsed, earlier, &shutdown).await {
                break;
            }
        }
        drop(messages);
        Ok(lanes.finish().await)
    }
}

/// Acks, terminates and naks JetStream messages.
struct JetStreamSettle {
    ack_wait: Duration,
}

impl Settle for JetStreamSettle {
    type Handle = jetstream::Message;

    async fn ack(&self, message: jetstream::Message) -> Result<(), BoxError> {
        message.double_ack().await
    }

    async fn dead_letter(
        &self,
        message: jetstream::Message,
        _: Option<&InboxMessage>,
        _reason: &str,
    ) -> Result<(), BoxError> {
        message.ack_with(AckKind::Term).await
    }

    async fn release(&self, message: jetstream::Message) {
        let _ = message.ack_with(AckKind::Nak(None)).await;
    }

    fn keep_alive_every(&self) -> Option<Duration> {
        Some(self.ack_wait / 2)
    }

    async fn keep_alive(&self, message: &jetstream::Message) {
        let _ = message.ack_with(AckKind::Progress).await;
    }

    fn keep_alive_owned(
        &self,
        message: &jetstream::Message,
    ) -> Option<futures::future::BoxFuture<'static, ()>> {
        let message = message.clone();
        Some(Box::pin(async move {
            let _ = message.ack_with(AckKind::Progress).await;
        }))
    }
}
