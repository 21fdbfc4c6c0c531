//! RabbitMQ sink (feature `rabbitmq`): AMQP 0-9-1 with publisher confirms.
//!
//! Each event becomes one message published to `exchange`:
//!
//! | part | value |
//! | --- | --- |
//! | routing key | the `destination` template rendered for the event |
//! | body | the payload bytes exactly |
//! | `message_id` property | the event id (UUID text): the consumer's deduplication key |
//! | `headers` table | `id`, `event_type`, `aggregate_type`, `aggregate_id`, then the row's own headers, as long strings |
//! | `delivery_mode` | 2 (persistent) |
//! | `type` property | the event type (when it fits AMQP's 255 bytes) |
//! | `timestamp` property | when the producer wrote the event (seconds) |
//! | `content_type` property | the row's `content-type` header, when it has one |
//! | `app_id` property | `outbox` |
//!
//! With `format = "cloudevents-binary"` the `headers` table holds the CloudEvents attributes
//! instead (`ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-subject`, `ce-time`, the
//! extensions as `ce-<name>`, long strings) and `content_type` is `datacontenttype`; with
//! `"cloudevents-structured"` the body is the JSON envelope, `content_type` is
//! `application/cloudevents+json` and the table is empty ([`BINDING`]). The other properties
//! are the same in every format.
//!
//! The sink publishes on `channels` channels (default 1) of one connection, all in confirm
//! mode; messages are `mandatory`. A batch is spread over the channels and published without
//! waiting in between, then every confirm is awaited together. An event counts as delivered
//! only on `basic.ack` for a message that was routed to at least one queue (for persistent
//! messages in durable queues the broker acks after writing them to disk). RabbitMQ does not
//! deduplicate: a republished event is a second message with the same `message_id`.
//!
//! | outcome | kind |
//! | --- | --- |
//! | `basic.ack` | delivered |
//! | `basic.return` (mandatory, no queue bound for the routing key) | `Rejected`: "no queue bound for routing key X", never a silent drop |
//! | `basic.nack` (queue overflow with `reject-publish`, broker internal error) | `Transient` |
//! | body over `max_message_size` (or the broker's limit, learned from its refusal), routing key or header name over 255 bytes | `Rejected`, naming the size or the key |
//! | exchange deleted after start, publish permission refused | `Transient` |
//! | connection refused or lost, connection closed by the broker, no confirm within `confirm_timeout` | `Unavailable` (the whole batch, when every event is affected); the next call reconnects |
//!
//! The connection and channel are re-established lazily: a publish or healthcheck that finds
//! them closed reconnects first (one attempt, bounded by `connect_timeout`).

mod config;
mod link;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::join_all;
use lapin::options::BasicPublishOptions;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation};
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError};

use config::MAX_SHORT_STRING;
pub use config::RabbitMqConfig;
use link::{Link, SetupError, amqp_error};

use crate::secret::redact_url;

/// `delivery_mode` of a persistent message.
const PERSISTENT: u8 = 2;

/// The CloudEvents binding for RabbitMQ (AMQP 0-9-1), as the CloudEvents SDKs read it (the
/// Python SDK's `cloudevents.core.bindings.rabbitmq`, Knative's eventing-rabbitmq): every
/// attribute in the `headers` table prefixed `ce-`, values as they are; `datacontenttype`,
/// and structured mode's `application/cloudevents+json`, in the `content_type` property.
/// (The AMQP 1.0 binding's `cloudEvents_` / `cloudEvents:` application properties are for
/// AMQP 1.0 clients.)
pub const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: None,
    structured_content_type: None,
    percent_encode: false,
};

/// Publishes events to a RabbitMQ exchange; built from a [`RabbitMqConfig`].
pub struct RabbitMqSink {
    url: String,
    shown_url: String,
    tls: lapin::tcp::OwnedTLSConfig,
    exchange: String,
    declare_exchange: bool,
    destination: Destination,
    mandatory: bool,
    max_message_size: usize,
    /// The broker's own `max_message_size` once a refusal revealed it (0: not known).
    broker_limit: AtomicUsize,
    channels: usize,
    connect_timeout: Duration,
    confirm_timeout: Duration,
    format: MessageFormat,
    link: tokio::sync::Mutex<Option<Link>>,
}

impl fmt::Debug for RabbitMqSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqSink")
            .field("url", &self.shown_url)
            .field("exchange", &self.exchange)
            .field("destination", &self.destination.template())
            .field("mandatory", &self.mandatory)
            .finish_non_exhaustive()
    }
}

impl RabbitMqSink {
    async fn connect(config: RabbitMqConfig) -> Result<Self, SinkError> {
        let url = config.url.trim().to_owned();
        let tls = config
            .tls()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let format = config
            .message_format()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let sink = Self {
            shown_url: redact_url(&url),
            tls,
            url,
            exchange: config.exchange,
            declare_exchange: config.declare_exchange,
            destination: config.destination,
            mandatory: config.mandatory,
            max_message_size: config.max_message_size.get(),
            broker_limit: AtomicUsize::new(0),
            channels: config.channels.get(),
            connect_timeout: config.connect_timeout,
            confirm_timeout: config.confirm_timeout,
            format,
            link: tokio::sync::Mutex::new(None),
        };
        let link = sink.open().await.map_err(SetupError::at_startup)?;
        *sink.link.lock().await = Some(link);
        Ok(sink)
    }

    /// The exchange this sink publishes to.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// The largest body this sink sends: the configured `max_message_size`, or the broker's
    /// own limit once a refusal revealed a lower one.
    pub fn max_message_size(&self) -> usize {
        match self.broker_limit.load(Ordering::Relaxed) {
            0 => self.max_message_size,
            broker => broker.min(self.max_message_size),
        }
    }

    /// Routing key, properties and body of one event, or why it cannot be sent.
    fn prepare(&self, event: &Event) -> Result<(ShortString, BasicProperties, Bytes), SinkError> {
        let routing_key = self.destination.render(event);
        let routing_key = ShortString::try_new(routing_key.clone()).map_err(|_| {
            SinkError::rejected(format!(
                "routing key `{routing_key}` is {} bytes, over AMQP's {MAX_SHORT_STRING}",
                routing_key.len()
            ))
        })?;
        let mut headers = FieldTable::default();
        let mut content_type = None;
        let mut invalid = None;
        let plain = self.format.is_plain();
        let encoded = self.format.encode(event, &BINDING, |name, value| {
            match ShortString::try_new(name) {
                Ok(key) => {
                    headers.insert(key, AMQPValue::LongString(LongString::from(value)));
                }
                Err(_) => {
                    invalid.get_or_insert_with(|| {
                        format!("header name `{name}` is over AMQP's {MAX_SHORT_STRING} bytes")
                    });
                }
            }
            if plain && name.eq_ignore_ascii_case("content-type") {
                content_type = ShortString::try_new(value).ok();
            }
        });
        let encoded =
            encoded.map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?;
        if let Some(reason) = invalid {
            return Err(SinkError::rejected(reason));
        }
        if let Some(media) = encoded.content_type {
            content_type = Some(ShortString::try_new(media).map_err(|_| {
                SinkError::rejected(format!(
                    "content type `{media}` is over AMQP's {MAX_SHORT_STRING} bytes"
                ))
            })?);
        }
        let limit = self.max_message_size();
        if encoded.body.len() > limit {
            return Err(SinkError::rejected(format!(
                "message of {} bytes exceeds the limit of {limit} bytes (sink.max_message_size \
                 {}, the broker's max_message_size)",
                encoded.body.len(),
                self.max_message_size
            )));
        }
        let timestamp = u64::try_from(event.created_at.unix_timestamp()).unwrap_or(0);
        let mut properties = BasicProperties::default()
            .with_message_id(ShortString::from(event.id.to_string()))
            .with_delivery_mode(PERSISTENT)
            .with_timestamp(timestamp)
            .with_app_id(ShortString::from("outbox"))
            .with_headers(headers);
        if let Ok(kind) = ShortString::try_new(event.event_type.as_str()) {
            properties = properties.with_type(kind);
        }
        if let Some(content_type) = content_type {
            properties = properties.with_content_type(content_type);
        }
        Ok((routing_key, properties, encoded.body))
    }

    /// Maps a failed publish or confirm of the message to `routing_key` with a body of `size`
    /// bytes.
    fn publish_error(&self, routing_key: &str, size: usize, e: lapin::Error) -> SinkError {
        if let Some(amqp) = amqp_error(&e) {
            let text = amqp.get_message().as_str();
            match amqp.kind() {
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => {
                    if let Some(limit) = refused_size_limit(text) {
                        self.broker_limit.store(limit, Ordering::Relaxed);
                        if size > limit {
                            return SinkError::rejected(format!(
                                "message of {size} bytes exceeds the limit of {limit} bytes \
                                 (the broker's max_message_size)"
                            ))
                            .with_source(e);
                        }
                        return SinkError::unavailable(format!(
                            "the broker closed the channel over another, oversized message \
                             before `{routing_key}` was confirmed"
                        ))
                        .with_source(e);
                    }
                    return SinkError::transient(format!(
                        "RabbitMQ refused the message to `{routing_key}`"
                    ))
                    .with_source(e);
                }
                AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => {
                    return SinkError::transient(format!(
                        "exchange `{}` does not exist on RabbitMQ at {} (deleted after the sink \
                         started?)",
                        self.exchange, self.shown_url
                    ))
                    .with_source(e);
                }
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => {
                    return SinkError::transient(format!(
                        "the RabbitMQ user may not publish to exchange `{}`",
                        self.exchange
                    ))
                    .with_source(e);
                }
                AMQPErrorKind::Soft(_) => {
                    return SinkError::transient(format!(
                        "RabbitMQ closed the channel before `{routing_key}` was confirmed"
                    ))
                    .with_source(e);
                }
                AMQPErrorKind::Hard(_) => {}
            }
        }
        SinkError::unavailable(format!(
            "lost the connection to RabbitMQ at {} before `{routing_key}` was confirmed",
            self.shown_url
        ))
        .with_source(e)
    }

    /// The outcome of one confirmed publish.
    fn confirmation(&self, routing_key: &str, confirmation: Confirmation) -> Delivery {
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(SinkError::rejected(format!(
                "no queue bound for routing key `{routing_key}` on exchange `{}`: RabbitMQ \
                 returned the message ({} {})",
                self.exchange, returned.reply_code, returned.reply_text
            ))),
            Confirmation::Nack(_) => Err(SinkError::transient(format!(
                "RabbitMQ did not take the message to `{routing_key}` (basic.nack: a queue is \
                 full with overflow = reject-publish, or the broker failed to store it)"
            ))),
            Confirmation::NotRequested => Err(SinkError::transient(format!(
                "no publisher confirm for `{routing_key}`: the channel is not in confirm mode"
            ))),
        }
    }
}

/// The limit in a `PRECONDITION_FAILED - message size 1048577 is larger than configured max
/// size 1048576` refusal.
fn refused_size_limit(text: &str) -> Option<usize> {
    let (_, tail) = text.split_once("max size")?;
    tail.trim()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

impl Sink for RabbitMqSink {
    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let channels = self.channels().await.map_err(SetupError::at_runtime)?;
        let options = BasicPublishOptions {
            mandatory: self.mandatory,
            ..BasicPublishOptions::default()
        };

        // Every message of the batch is handed to the connection at once, spread over the
        // channels, and every confirm is awaited together: awaiting each `basic_publish` in
        // turn would wait for lapin's I/O thread to write each frame before preparing the
        // next one. The order in which the frames leave does not matter: the relay never
        // passes two events of one aggregate in one call.
        let exchange = ShortString::from(self.exchange.as_str());
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        let deliveries = join_all(batch.iter().enumerate().map(|(n, event)| {
            let channel = &channels[n % channels.len()];
            let exchange = exchange.clone();
            async move {
                let (routing_key, properties, body) = self.prepare(event)?;
                let key = routing_key.as_str().to_owned();
                let size = body.len();
                let confirm = channel
                    .basic_publish(exchange, routing_key, options, &body, properties)
                    .await
                    .map_err(|e| self.publish_error(&key, size, e))?;
                match tokio::time::timeout_at(deadline, confirm).await {
                    Err(_) => Err(SinkError::unavailable(format!(
                        "no publisher confirm for `{key}` from RabbitMQ at {} within {:?}",
                        self.shown_url, self.confirm_timeout
                    ))),
                    Ok(Err(e)) => Err(self.publish_error(&key, size, e)),
                    Ok(Ok(confirmation)) => self.confirmation(&key, confirmation),
                }
            }
        }))
        .await;
        crate::broker::collapse_unavailable(deliveries)
    }

    /// Reachable and usable: connected (reconnecting if needed) and, unless publishing to the
    /// default exchange, the exchange exists (a passive check: declaring it again would hide a
    /// deleted exchange until the next start).
    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.channels().await.map_err(SetupError::at_runtime)?;
        if self.exchange.is_empty() {
            return Ok(());
        }
        let link = self.link.lock().await;
        match link.as_ref() {
            Some(link) => self
                .exchange_exists(&link.connection)
                .await
                .map_err(SetupError::at_runtime),
            None => Ok(()),
        }
    }
}

crate::build_sink!(RabbitMqConfig, "rabbitmq", |config, event| format!(
    "RabbitMQ routing key {}",
    config.destination.render(event)
), message_limit: |c| c.max_message_size.get(), destination: destination);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_brokers_size_limit_is_read_from_its_refusal() {
        assert_eq!(
            refused_size_limit(
                "PRECONDITION_FAILED - message size 1048577 is larger than configured max size \
                 1048576"
            ),
            Some(1_048_576)
        );
        assert_eq!(
            refused_size_limit("PRECONDITION_FAILED - inequivalent arg"),
            None
        );
    }
}
