//! [`JetStreamConsumer`] (feature `nats`): a durable JetStream pull-consumer loop.
//!
//! - **Ack after commit.** A message is acknowledged (double ack: confirmed by the server)
//!   only after the handler returned `Ok`, i.e. after its inbox transaction committed. A
//!   crash between commit and ack redelivers the message after `ack_wait`; the inbox then
//!   reports a duplicate and the handler should return `Ok` again, which acks it.
//! - **Per-key order with concurrency.** Messages are routed by `(aggregate_type,
//!   aggregate_id)` to one of `lanes` ordered lanes; each lane handles one message at a time.
//!   At most `max_in_flight` messages are unacknowledged (`max_ack_pending`).
//! - **Failures.** A handler error naks the message with a backoff delay (`backoff_base ×
//!   2^(delivery-1)`, capped at `backoff_max`); on its `max_deliver`-th failed delivery it is
//!   terminated (`+TERM`), which makes JetStream publish a
//!   `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>` advisory; the message
//!   stays in the stream (subject to its retention) and can be replayed from there. No local
//!   dead-letter table is written. While a failed message waits for redelivery, later
//!   messages of the same key are not held back (see `docs/inbox.md`).
//! - A message without the contract headers is terminated at once: no retry can fix it.
//! - **Shutdown.** When the token is cancelled the loop stops pulling, lets every lane finish
//!   the messages it already holds, and returns.

use std::collections::hash_map::DefaultHasher;
use std::fmt::Display;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures::StreamExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::InboxMessage;

/// Broker headers that are not the row's own.
const SKIP_HEADERS: &[&str] = &["Nats-Msg-Id"];

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
    /// Ordered lanes handling messages concurrently (messages of one key share a lane).
    pub lanes: NonZeroUsize,
    /// Most unacknowledged messages at once (the consumer's `max_ack_pending`).
    pub max_in_flight: NonZeroUsize,
    /// How long JetStream waits for an ack before redelivering.
    pub ack_wait: Duration,
    /// Deliveries of one message before it is terminated.
    pub max_deliver: u32,
    /// First nak delay; doubles per delivery.
    pub backoff_base: Duration,
    /// Largest nak delay.
    pub backoff_max: Duration,
}

/// Why the loop could not run.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Connecting to the server failed.
    #[error("cannot connect to NATS")]
    Connect(#[source] async_nats::ConnectError),
    /// The stream or consumer could not be found or created, or pulling failed.
    #[error("JetStream refused: {0}")]
    JetStream(String),
}

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// Messages handled and acknowledged.
    pub acked: u64,
    /// Handler failures answered with a nak (to be redelivered).
    pub nacked: u64,
    /// Messages terminated (after `max_deliver`, or not following the contract).
    pub terminated: u64,
}

#[derive(Default)]
struct Counters {
    acked: AtomicU64,
    nacked: AtomicU64,
    terminated: AtomicU64,
}

impl JetStreamConsumer {
    /// A consumer of `stream` named `durable`, with defaults: 4 lanes, 256 in flight,
    /// `ack_wait` 30 s, `max_deliver` 10, backoff 1 s doubling to 60 s.
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
            lanes: NonZeroUsize::new(4).expect("not zero"),
            max_in_flight: NonZeroUsize::new(256).expect("not zero"),
            ack_wait: Duration::from_secs(30),
            max_deliver: 10,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
        }
    }

    /// The nak delay after the `delivered`-th failed delivery.
    pub fn backoff(&self, delivered: u32) -> Duration {
        let factor = 2u32.saturating_pow(delivered.saturating_sub(1).min(20));
        self.backoff_base
            .saturating_mul(factor)
            .min(self.backoff_max)
    }

    /// Runs until `shutdown` is cancelled, calling `handler` for each message. The handler
    /// should run its side effect through the inbox and return `Ok` for both `Processed`
    /// and `Duplicate`; `Err` means "not done, redeliver".
    pub async fn run<H, Fut, E>(
        &self,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError>
    where
        H: Fn(InboxMessage) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Display + Send + 'static,
    {
        let client = async_nats::connect(&self.url)
            .await
            .map_err(ConsumerError::Connect)?;
        let js = jetstream::new(client);
        let js_err = |e: &dyn Display| ConsumerError::JetStream(e.to_string());
        let stream = js.get_stream(&self.stream).await.map_err(|e| js_err(&e))?;
        let consumer: jetstream::consumer::PullConsumer = stream
            .get_or_create_consumer(
                &self.durable,
                pull::Config {
                    durable_name: Some(self.durable.clone()),
                    filter_subject: self.filter_subject.clone(),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: self.ack_wait,
                    max_deliver: i64::from(self.max_deliver),
                    max_ack_pending: i64::try_from(self.max_in_flight.get()).unwrap_or(i64::MAX),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| js_err(&e))?;
        let mut messages = consumer.messages().await.map_err(|e| js_err(&e))?;

        let handler = Arc::new(handler);
        let counters = Arc::new(Counters::default());
        let lane_capacity = (self.max_in_flight.get() / self.lanes.get()).max(1);
        let mut senders = Vec::with_capacity(self.lanes.get());
        let mut lanes = Vec::with_capacity(self.lanes.get());
        for _ in 0..self.lanes.get() {
            let (tx, rx) = mpsc::channel(lane_capacity);
            senders.push(tx);
            lanes.push(tokio::spawn(lane(
                rx,
                Arc::clone(&handler),
                Arc::clone(&counters),
                self.clone(),
            )));
        }

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
            let parsed = InboxMessage::from_headers(headers, SKIP_HEADERS, message.payload.clone());
            let parsed = match parsed {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(subject = %message.subject, error = %e, "terminating a message that does not follow the contract");
                    let _ = message.ack_with(AckKind::Term).await;
                    counters.terminated.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            let mut hasher = DefaultHasher::new();
            (&parsed.aggregate_type, &parsed.aggregate_id).hash(&mut hasher);
            let lane = usize::try_from(hasher.finish() % self.lanes.get() as u64).unwrap_or(0);
            tokio::select! {
                () = shutdown.cancelled() => break,
                sent = senders[lane].send((message, parsed)) => {
                    if sent.is_err() { break; }
                }
            }
        }
        drop(messages);
        drop(senders);
        for lane in lanes {
            let _ = lane.await;
        }
        Ok(ConsumerReport {
            acked: counters.acked.load(Ordering::Relaxed),
            nacked: counters.nacked.load(Ordering::Relaxed),
            terminated: counters.terminated.load(Ordering::Relaxed),
        })
    }
}

/// One ordered lane: handles its messages one at a time, in arrival order.
async fn lane<H, Fut, E>(
    mut rx: mpsc::Receiver<(jetstream::Message, InboxMessage)>,
    handler: Arc<H>,
    counters: Arc<Counters>,
    config: JetStreamConsumer,
) where
    H: Fn(InboxMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + Send + 'static,
{
    while let Some((message, parsed)) = rx.recv().await {
        let id = parsed.id;
        match handler(parsed).await {
            Ok(()) => match message.double_ack().await {
                Ok(()) => {
                    counters.acked.fetch_add(1, Ordering::Relaxed);
                }
                // Committed but not acked: redelivered after ack_wait, then a duplicate.
                Err(e) => {
                    tracing::warn!(%id, error = %e, "ack failed; the message will be redelivered")
                }
            },
            Err(e) => {
                let delivered = message
                    .info()
                    .map(|i| u32::try_from(i.delivered).unwrap_or(u32::MAX))
                    .unwrap_or(1);
                if delivered >= config.max_deliver {
                    tracing::error!(%id, delivered, error = %e, "handler failed on the last delivery; terminating");
                    let _ = message.ack_with(AckKind::Term).await;
                    counters.terminated.fetch_add(1, Ordering::Relaxed);
                } else {
                    let delay = config.backoff(delivered);
                    tracing::warn!(%id, delivered, ?delay, error = %e, "handler failed; nak with delay");
                    let _ = message.ack_with(AckKind::Nak(Some(delay))).await;
                    counters.nacked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_delivery_up_to_the_cap() {
        let c = JetStreamConsumer::new("nats://x", "S", "d");
        assert_eq!(c.backoff(1), Duration::from_secs(1));
        assert_eq!(c.backoff(3), Duration::from_secs(4));
        assert_eq!(c.backoff(30), Duration::from_secs(60));
    }
}
