//! Sinks for the `outbox` relay: where published events go.
//!
//! Each sink lives in its own module behind its own cargo feature and has the same shape:
//!
//! - a config type (`NatsConfig`, `HttpConfig`, `StdoutConfig`, `FileConfig`): serde
//!   `Deserialize` with `deny_unknown_fields`, every field documented and defaulted;
//! - a pure `validate()` that names the offending key (`sink.url: ...`), separate from
//! - an async `build()` that connects and returns the sink;
//! - the sink type, which implements [`outbox_core::Sink`] (publish + healthcheck).
//!
//! There is deliberately no `SinkConfig` enum here: the binary owns the `[sink]` table and
//! its `kind` tag, and wraps these config types in its own enum, so adding a sink never
//! changes this crate's public API.
//!
//! Every sink keeps the message contract of `docs/contract.md`: the destination comes from the
//! [`outbox_core::Destination`] template, the headers from [`outbox_core::message`] (the four
//! contract headers, then the row's own), and the body is the payload bytes exactly. With
//! `format = "cloudevents-binary"` or `"cloudevents-structured"` a sink shapes the message as a
//! CloudEvent instead ([`outbox_core::cloudevents`]), with the names of its protocol's binding
//! (`docs/sinks.md`, "CloudEvents").
//!
//! | feature | module | sink |
//! | --- | --- | --- |
//! | `nats` | [`nats`] | NATS JetStream, with `Nats-Msg-Id` deduplication |
//! | `http` | [`http`] | HTTP webhooks, signed per Standard Webhooks |
//! | `stdout` | [`stdout`] | JSON lines on standard output or appended to a file |
//! | `redis` | [`redis`] | Redis Streams (`XADD`, pipelined per batch) |
//! | `rabbitmq` | [`rabbitmq`] | RabbitMQ (AMQP 0-9-1) with publisher confirms and mandatory routing |
//! | `kafka` | [`kafka`] | Kafka, idempotent producer with `acks=all` (librdkafka, bundled) |
//! | `sqs` | [`sqs`] | Amazon SQS, standard and FIFO queues (`SendMessageBatch`) |
//! | `sns` | [`sns`] | Amazon SNS, standard and FIFO topics (`PublishBatch`) |
//! | `kinesis` | [`kinesis`] | Amazon Kinesis Data Streams (`PutRecords`) |
//! | `pubsub` | [`pubsub`] | Google Cloud Pub/Sub, ordered by `ordering_key` (REST API) |

/// Implements [`outbox_core::BuildSink`] for a sink's config type: its `kind`, and how to
/// describe where an event goes (`|config, event| ...`). `validate` and `build` are the
/// config's own inherent methods. Optional, in this order: `message_limit: |c| bytes` (the
/// largest message it sends, see [`outbox_core::BuildSink::message_limit`]), `destination: field` (the
/// template a subscription may replace), `check: path` (`outbox doctor` without changing
/// anything), `read_back: path` (`outbox verify`'s reader of the destination) or
/// `cannot_read_back: message` (why `outbox verify` cannot read it; without either, the
/// default refusal of a destination that consumers take messages from), then
/// `scratch: path, remove_scratch: path` (`outbox crash-test`'s scratch destination).
macro_rules! build_sink {
    ($config:ty, $kind:literal, |$c:ident, $event:ident| $describe:expr
        $(, message_limit: |$lc:ident| $limit:expr)?
        $(, destination: $field:ident)?
        $(, check: $check:path)?
        $(, read_back: $read_back:path)?
        $(, cannot_read_back: $why:expr)?
        $(, scratch: $scratch:path, remove_scratch: $remove_scratch:path)?
    ) => {
        impl outbox_core::BuildSink for $config {
            const KIND: &'static str = $kind;
            fn validate(&self) -> Result<(), String> {
                <$config>::validate(self).map_err(|e| e.to_string())
            }
            fn build(
                &self,
            ) -> outbox_core::sink::BoxFuture<
                '_,
                Result<Box<dyn outbox_core::DynSink>, outbox_core::SinkError>,
            > {
                Box::pin(async move {
                    <$config>::build(self.clone())
                        .await
                        .map(|s| Box::new(s) as Box<dyn outbox_core::DynSink>)
                })
            }
            fn describe_destination(&self, $event: &outbox_core::Event) -> String {
                let $c = self;
                $describe
            }
            $(
                fn message_limit(&self) -> Option<usize> {
                    let $lc = self;
                    Some($limit)
                }
            )?
            $(
                fn destination_mut(&mut self) -> Option<&mut outbox_core::Destination> {
                    Some(&mut self.$field)
                }
            )?
            $(
                fn check(
                    &self,
                ) -> outbox_core::sink::BoxFuture<'_, Result<String, outbox_core::SinkError>> {
                    Box::pin($check(self))
                }
            )?
            $(
                fn read_back(&self) -> crate::read_back::ReadBackFuture<'_> {
                    Box::pin(async move {
                        $read_back(self)
                            .await
                            .map(|r| Box::new(r) as Box<dyn outbox_core::verify::ReadBack>)
                    })
                }
            )?
            $(
                fn read_back(&self) -> crate::read_back::ReadBackFuture<'_> {
                    Box::pin(async move {
                        Err(outbox_core::verify::ReadBackError::unsupported($why))
                    })
                }
            )?
            $(
                fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
                    $scratch(self, tag)
                }
                fn remove_scratch(
                    &self,
                ) -> outbox_core::sink::BoxFuture<'_, Result<String, outbox_core::SinkError>> {
                    Box::pin($remove_scratch(self))
                }
            )?
        }
    };
}
pub(crate) use build_sink;

// `aws` is the feature that `sqs`, `sns` and `kinesis` each enable.
#[cfg(feature = "aws")]
mod aws;
#[cfg(any(
    feature = "nats",
    feature = "http",
    feature = "redis",
    feature = "rabbitmq",
    feature = "kafka",
    feature = "aws",
    feature = "pubsub"
))]
mod broker;
#[cfg(any(feature = "aws", feature = "pubsub"))]
mod cloud;
mod cloudevents;
mod error;
#[cfg(any(feature = "stdout", feature = "http"))]
mod json_lines;
#[cfg(any(
    feature = "kafka",
    feature = "kinesis",
    feature = "nats",
    feature = "pubsub",
    feature = "redis",
    feature = "stdout"
))]
mod read_back;
mod secret;
#[cfg(any(
    feature = "http",
    feature = "nats",
    feature = "rabbitmq",
    feature = "redis"
))]
mod tls;

/// Declares each sink's module behind its feature, and re-exports its config and sink types.
macro_rules! sink_modules {
    ($($feature:literal => $module:ident { $($export:ident),+ })*) => {$(
        #[cfg(feature = $feature)]
        pub mod $module;
        #[cfg(feature = $feature)]
        pub use $module::{$($export),+};
    )*};
}

sink_modules! {
    "http" => http { HttpConfig, HttpSink }
    "kafka" => kafka { KafkaConfig, KafkaSink }
    "kinesis" => kinesis { KinesisConfig, KinesisSink }
    "nats" => nats { NatsConfig, NatsSink }
    "pubsub" => pubsub { PubSubConfig, PubSubSink }
    "rabbitmq" => rabbitmq { RabbitMqConfig, RabbitMqSink }
    "redis" => redis { RedisConfig, RedisSink }
    "sns" => sns { SnsConfig, SnsSink }
    "sqs" => sqs { SqsConfig, SqsSink }
    "stdout" => stdout { FileConfig, FileSink, StdoutConfig, StdoutSink }
}

pub use error::ConfigError;
pub use secret::Secret;
