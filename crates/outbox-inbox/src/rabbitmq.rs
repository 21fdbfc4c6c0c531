//! [`QueueConsumer`] (feature `rabbitmq`): a RabbitMQ queue consumer with manual acks.
//!
//! - **Ack after commit.** The queue is consumed with manual acknowledgement; `basic.ack`
//!   goes out only after the handler returned `Ok`. A crash (or a lost connection) between
//!   commit and ack makes the broker requeue the message; the inbox then reports a duplicate.
//! - **Bounded concurrency.** `basic.qos` prefetch = `policy.max_in_flight`: the broker never
//!   has more unacknowledged messages out to this consumer. The shared [lanes](crate::lane)
//!   handle `policy.lanes` at once, one at a time per key `(aggregate_type, aggregate_id)`,
//!   in delivery order.
//! - **Failures.** Retried in place with backoff; later messages of the key wait. After
//!   `policy.max_attempts` the message is `basic.nack`ed with `requeue = false`, which hands
//!   it to the queue's **dead-letter exchange** (`x-dead-letter-exchange`, set as a queue
//!   argument or a policy) with an `x-death` header. Without a dead-letter exchange RabbitMQ
//!   discards it: configure one (see `docs/inbox.md`). The loop checks the queue exists
//!   (passive declare) but does not declare it.
//! - A message without the contract headers is nacked (dead-lettered) at once.
//! - **Shutdown.** Cancel the token: consuming stops, handlers in progress finish and ack,
//!   messages not yet handled are requeued when the channel closes.

use std::sync::Arc;

use futures::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use crate::InboxMessage;
use crate::lane::{
    BoxError, ConsumerError, ConsumerOrder, ConsumerReport, LanePolicy, Lanes, MessageHandler,
    Settle,
};

const BROKER: &str = "RabbitMQ";

/// Config and runner of one queue consumer.
#[derive(Debug, Clone)]
pub struct QueueConsumer {
    /// Broker URL, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`.
    pub url: String,
    /// The queue to consume (must exist, bound to the relay's exchange).
    pub queue: String,
    /// Consumer tag shown in the management UI.
    pub tag: String,
    /// Lanes, prefetch (`max_in_flight`), attempts and backoff.
    pub policy: LanePolicy,
    /// Per-aggregate order across crashes and instances (`None`: per-key order within this
    /// instance only). Build it with the inbox's `order_gate`; see [`ConsumerOrder`].
    pub ordered: Option<ConsumerOrder>,
}

impl QueueConsumer {
    /// A consumer of `queue` with the default [`LanePolicy`].
    pub fn new(url: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            queue: queue.into(),
            tag: "outbox-inbox".to_owned(),
            policy: LanePolicy::default(),
            ordered: None,
        }
    }

    /// Runs until `shutdown` is cancelled, calling `handler` for each message (see
    /// [`MessageHandler`]), and returns what it did.
    pub async fn run<H: MessageHandler>(
        &self,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let connection = Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .map_err(|e| ConsumerError::connect(BROKER, &self.url, e))?;
        let refused = |what: &str| {
            let what = format!("{what} (queue {})", self.queue);
            move |e: lapin::Error| ConsumerError::broker(BROKER, what, e)
        };
        let channel = connection
            .create_channel()
            .await
            .map_err(refused("open a channel"))?;
        let queue = ShortString::from(self.queue.as_str());
        channel
            .queue_declare(
                queue.clone(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(refused("find the queue"))?;
        let prefetch = u16::try_from(self.policy.max_in_flight.get()).unwrap_or(u16::MAX);
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(refused("set the prefetch"))?;
        let tag = ShortString::from(self.tag.as_str());
        let mut consumer = channel
            .basic_consume(
                queue,
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(refused("consume"))?;

        let lanes = Lanes::start(
            &self.policy,
            self.ordered.clone(),
            Arc::new(RabbitSettle),
            handler,
            &shutdown,
        );
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => break,
                next = consumer.next() => next,
            };
            let delivery = match next {
                Some(Ok(d)) => d,
                Some(Err(e)) => {
                    let _ = lanes.finish().await;
                    return Err(ConsumerError::broker(BROKER, "keep consuming", e));
                }
                None => break,
            };
            let parsed = parse(&delivery);
            if !lanes.offer(delivery, parsed, 0, &shutdown).await {
                break;
            }
        }
        let _ = channel
            .basic_cancel(tag, BasicCancelOptions::default())
            .await;
        let report = lanes.finish().await;
        // Closing the channel requeues every message this consumer did not ack.
        let _ = channel.close(200, "outbox: shutdown".into()).await;
        let _ = connection.close(200, "outbox: shutdown".into()).await;
        Ok(report)
    }
}

/// The headers table as the sink wrote it (long strings), back into a message.
fn parse(delivery: &Delivery) -> Result<InboxMessage, String> {
    let table = delivery.properties.headers().as_ref();
    let headers: Vec<(&str, &str)> = table
        .into_iter()
        .flat_map(|t| t.inner())
        .filter_map(|(name, value)| {
            let value = match value {
                AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?,
                AMQPValue::ShortString(s) => s.as_str(),
                _ => return None, // `x-death` and other broker bookkeeping
            };
            Some((name.as_str(), value))
        })
        .collect();
    // A CloudEvent in binary mode (sink.format) carries `datacontenttype` in the
    // `content_type` property.
    let content_type = headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("ce-id"))
        .then(|| delivery.properties.content_type().as_ref())
        .flatten()
        .map(|ct| ("content-type", ct.as_str()));
    InboxMessage::from_headers(
        headers.into_iter().chain(content_type),
        &[],
        delivery.data.clone().into(),
    )
    .map_err(|e| e.to_string())
}

/// Acks and nacks deliveries.
struct RabbitSettle;

impl Settle for RabbitSettle {
    type Handle = Delivery;

    async fn ack(&self, delivery: Delivery) -> Result<(), BoxError> {
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map(drop)
            .map_err(Into::into)
    }

    async fn dead_letter(
        &self,
        delivery: Delivery,
        _: Option<&InboxMessage>,
        _reason: &str,
    ) -> Result<(), BoxError> {
        // The reason is logged by the lanes; AMQP's nack carries none (`x-death` says
        // `rejected`).
        delivery
            .acker
            .nack(BasicNackOptions {
                requeue: false,
                multiple: false,
            })
            .await
            .map(drop)
            .map_err(Into::into)
    }

    async fn release(&self, _delivery: Delivery) {
        // Requeued by the broker when the channel closes.
    }
}
