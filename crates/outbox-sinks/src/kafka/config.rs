//! [`KafkaConfig`]: the `[sink]` table for `kind = "kafka"`.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use outbox_core::cloudevents::{Format, MessageFormat};
use outbox_core::{Destination, SinkError};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use serde::{Deserialize, Deserializer};

use super::KafkaSink;
use super::topic;
use crate::ConfigError;

/// The smallest and largest `message.max.bytes` librdkafka accepts.
const MESSAGE_MAX_BYTES_RANGE: (u32, u32) = (1_000, 1_000_000_000);

/// librdkafka settings the sink sets itself, and the config key to use instead (or why they
/// are fixed).
const RESERVED: &[(&str, &str)] = &[
    ("bootstrap.servers", "set `sink.brokers` instead"),
    ("metadata.broker.list", "set `sink.brokers` instead"),
    (
        "enable.idempotence",
        "always `true`: the sink relies on the idempotent producer for per-key order",
    ),
    (
        "acks",
        "always `all`: an event counts as published only once every in-sync replica has it",
    ),
    ("request.required.acks", "always `all` (see `acks`)"),
    ("message.timeout.ms", "set `sink.delivery_timeout` instead"),
    ("delivery.timeout.ms", "set `sink.delivery_timeout` instead"),
    ("message.max.bytes", "set `sink.max_message_bytes` instead"),
    (
        "transactional.id",
        "transactions are not used: the outbox row is the transaction",
    ),
];

/// Settings of the Kafka sink.
///
/// ```toml
/// [sink]
/// kind = "kafka"
/// brokers = "127.0.0.1:9092"
/// destination = "outbox.event.{aggregate_type}"   # the topic
/// create_topics = false          # true: create a missing topic on first use
///
/// [sink.settings]                # any librdkafka producer setting
/// "linger.ms" = "5"
/// "compression.type" = "lz4"
/// ```
///
/// The producer is always idempotent with `acks=all`. Topics must exist before events are
/// published to them, unless `create_topics = true`: many brokers (and tansu) do not create
/// topics on produce, and a Kafka cluster's defaults for auto-created topics are rarely what
/// production wants.
#[derive(Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap brokers, comma-separated `host:port` (`bootstrap.servers`). Default
    /// `127.0.0.1:9092`.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::url")]
    pub brokers: String,
    /// Topic template; may use `{aggregate_type}`, `{event_type}` and `{aggregate_id}`.
    /// Default `outbox.event.{aggregate_type}`. An event whose rendered topic is not a legal
    /// Kafka topic name (letters, digits, `.`, `_`, `-`; at most 249 characters) is rejected
    /// and dead-lettered, never silently rewritten.
    pub destination: Destination,
    /// Extra librdkafka producer settings (`"linger.ms" = "5"`, `"compression.type" =
    /// "lz4"`, `"client.id" = "..."`). Values may be strings, integers or booleans. Checked
    /// against librdkafka when the config is validated. The settings the sink owns
    /// (`bootstrap.servers`, `enable.idempotence`, `acks`, `message.timeout.ms`,
    /// `message.max.bytes`, `transactional.id`) are refused with the key to use instead.
    /// Values of keys naming a password, secret or key never print. Default: none.
    #[serde(deserialize_with = "settings_map")]
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::settings")]
    pub settings: BTreeMap<String, String>,
    /// Largest message to send, in bytes (librdkafka's `message.max.bytes`). A larger event
    /// (payload + key + headers) is rejected (dead-lettered) with its size and this limit,
    /// and the rest of the batch flows. Keep it at or below the broker's `message.max.bytes`
    /// and the topics' `max.message.bytes`; a broker that still refuses a message as too
    /// large also gets it dead-lettered. Default `1000000`.
    pub max_message_bytes: NonZeroU32,
    /// Longest wait for a message's delivery report (`message.timeout.ms`), retries included.
    /// A message not acknowledged in time counts as the broker being unavailable. Keep it
    /// below `relay.publish_timeout` so the sink, not the relay, reports the outage.
    /// Default `20s`.
    #[serde(with = "humantime_serde")]
    pub delivery_timeout: Duration,
    /// Longest wait for a metadata request: the healthcheck, checking that a topic exists,
    /// creating one. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub metadata_timeout: Duration,
    /// Create a topic the first time an event goes to it and it does not exist (admin API,
    /// `CreateTopics`). Default `false`: a missing topic is a transient failure (retried,
    /// then dead-lettered after `relay.max_attempts`) whose reason names the topic.
    pub create_topics: bool,
    /// Partitions of a topic this sink creates. Default: the broker's default
    /// (`num.partitions`).
    pub topic_partitions: Option<NonZeroU32>,
    /// Replication factor of a topic this sink creates. Default: the broker's default
    /// (`default.replication.factor`).
    pub topic_replication_factor: Option<NonZeroU32>,
    /// The message format: `plain` (the record above, the default), `cloudevents-binary`
    /// (attributes as `ce_` headers and `content-type`, the payload as value) or
    /// `cloudevents-structured` (a JSON envelope as value), per the CloudEvents Kafka binding
    /// (`docs/sinks.md`, "CloudEvents").
    pub format: Format,
    /// CloudEvents `source`, a template like `destination`. Default
    /// `urn:outbox:{aggregate_type}`. Only used by the CloudEvents formats.
    pub cloudevents_source: String,
    /// CloudEvents `datacontenttype` of an event without a `content-type` header. Default
    /// `application/json`. Only used by the CloudEvents formats.
    pub cloudevents_content_type: String,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".to_owned(),
            destination: Destination::default(),
            settings: BTreeMap::new(),
            max_message_bytes: NonZeroU32::new(1_000_000).expect("not zero"),
            delivery_timeout: Duration::from_secs(20),
            metadata_timeout: Duration::from_secs(5),
            create_topics: false,
            topic_partitions: None,
            topic_replication_factor: None,
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
        }
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let settings: BTreeMap<&str, &str> = self
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), if is_secret(k) { "***" } else { v.as_str() }))
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("destination", &self.destination.template())
            .field("settings", &settings)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("metadata_timeout", &self.metadata_timeout)
            .field("create_topics", &self.create_topics)
            .field("topic_partitions", &self.topic_partitions)
            .field("topic_replication_factor", &self.topic_replication_factor)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .field("cloudevents_content_type", &self.cloudevents_content_type)
            .finish()
    }
}

impl KafkaConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.message_format()?;
        self.client_config().map(drop)
    }

    /// The checked `format`, `cloudevents_source` and `cloudevents_content_type`.
    pub(super) fn message_format(&self) -> Result<MessageFormat, ConfigError> {
        crate::cloudevents::message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
    }

    /// The librdkafka configuration of the producer, checked by librdkafka itself (which
    /// does not connect anywhere until a client is created from it).
    pub(super) fn client_config(&self) -> Result<ClientConfig, ConfigError> {
        let brokers = self.broker_list()?;

        let sample =
            self.destination
                .render(&crate::broker::sample_event("Order", "o_1", "order.placed"));
        if let Some(problem) = topic::name_problem(&sample) {
            return Err(ConfigError::new(
                "destination",
                format!(
                    "`{}` renders to `{sample}` for a sample event, which {problem}",
                    self.destination
                ),
            ));
        }

        let (min, max) = MESSAGE_MAX_BYTES_RANGE;
        if !(min..=max).contains(&self.max_message_bytes.get()) {
            return Err(ConfigError::new(
                "max_message_bytes",
                format!("must be between {min} and {max} (librdkafka's limits)"),
            ));
        }
        for (key, value) in [
            ("delivery_timeout", self.delivery_timeout),
            ("metadata_timeout", self.metadata_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(key, "must be greater than 0"));
            }
            if value.as_millis() > i32::MAX as u128 {
                return Err(ConfigError::new(key, "must be at most 24 days"));
            }
        }
        for (key, value) in [
            ("topic_partitions", self.topic_partitions),
            ("topic_replication_factor", self.topic_replication_factor),
        ] {
            if value.is_some_and(|v| i32::try_from(v.get()).is_err()) {
                return Err(ConfigError::new(key, "is too large"));
            }
        }

        let mut config = ClientConfig::new();
        for (key, value) in &self.settings {
            let path = format!("settings.\"{key}\"");
            if key.trim().is_empty() {
                return Err(ConfigError::new(path, "setting names must not be empty"));
            }
            if let Some((_, instead)) = RESERVED.iter().find(|(k, _)| k == key) {
                return Err(ConfigError::new(
                    path,
                    format!("is set by the sink: {instead}"),
                ));
            }
            config.set(key, value);
        }
        config
            .set("bootstrap.servers", brokers.join(","))
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "message.timeout.ms",
                self.delivery_timeout.as_millis().to_string(),
            )
            .set("message.max.bytes", self.max_message_bytes.to_string());
        if let Err(e) = config.create_native_config() {
            return Err(match e {
                // Never the value: it may be a password.
                KafkaError::ClientConfig(_, description, key, _) => {
                    let path = if self.settings.contains_key(&key) {
                        format!("settings.\"{key}\"")
                    } else {
                        "settings".to_owned()
                    };
                    ConfigError::new(path, format!("librdkafka refused it: {description}"))
                }
                other => ConfigError::new("settings", other.to_string()),
            });
        }
        Ok(config)
    }

    /// The bootstrap brokers, split at commas and checked.
    fn broker_list(&self) -> Result<Vec<String>, ConfigError> {
        let brokers: Vec<String> = self
            .brokers
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(str::to_owned)
            .collect();
        if brokers.is_empty() {
            return Err(ConfigError::new(
                "brokers",
                "must name at least one broker (`host:port`)",
            ));
        }
        for broker in &brokers {
            let address = broker.split_once("://").map_or(broker.as_str(), |(_, a)| a);
            let port_ok = match address.rsplit_once(':') {
                Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
                None => false,
            };
            if !port_ok || address.chars().any(char::is_whitespace) {
                return Err(ConfigError::new(
                    "brokers",
                    format!("`{broker}` is not `host:port`"),
                ));
            }
        }
        Ok(brokers)
    }

    /// Partitions for a topic this sink creates, `-1` for the broker's default.
    pub(super) fn partitions_for_new_topics(&self) -> i32 {
        self.topic_partitions
            .and_then(|p| i32::try_from(p.get()).ok())
            .unwrap_or(-1)
    }

    /// Replication factor for a topic this sink creates, `-1` for the broker's default.
    pub(super) fn replication_for_new_topics(&self) -> i32 {
        self.topic_replication_factor
            .and_then(|r| i32::try_from(r.get()).ok())
            .unwrap_or(-1)
    }

    /// Validates and creates the producer. Connects lazily: an unreachable broker at
    /// start-up is an ordinary outage that the healthcheck and the first publish report, not
    /// a configuration error.
    ///
    /// Errors: an invalid config (including a setting librdkafka refuses) is
    /// [`Rejected`](outbox_core::SinkErrorKind::Rejected).
    pub async fn build(self) -> Result<KafkaSink, SinkError> {
        let format = self
            .message_format()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let client_config = self
            .client_config()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        KafkaSink::new(self, client_config, format)
    }
}

/// True for settings whose values must never print (`sasl.password`,
/// `ssl.key.password`, `sasl.oauthbearer.client.secret`, `ssl.key.pem`, ...).
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "key",
        "sasl.oauthbearer.config",
        "token",
    ]
    .iter()
    .any(|s| key.contains(s))
}

/// Reads `[sink.settings]`, accepting strings, integers, floats and booleans as values
/// (librdkafka takes every value as a string).
fn settings_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Value {
        Text(String),
        Integer(i64),
        Float(f64),
        Flag(bool),
    }
    let raw = BTreeMap::<String, Value>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::Text(s) => s,
                Value::Integer(i) => i.to_string(),
                Value::Float(f) => f.to_string(),
                Value::Flag(b) => b.to_string(),
            };
            (k, v)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<KafkaConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn an_empty_table_gives_working_defaults() {
        let config = parse("").expect("defaults");
        assert_eq!(config, KafkaConfig::default());
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.partitions_for_new_topics(), -1);
        assert_eq!(config.replication_for_new_topics(), -1);
        let client = config.client_config().expect("valid");
        assert_eq!(client.get("enable.idempotence"), Some("true"));
        assert_eq!(client.get("acks"), Some("all"));
        assert_eq!(client.get("message.timeout.ms"), Some("20000"));
        assert_eq!(client.get("message.max.bytes"), Some("1000000"));
    }

    #[test]
    fn every_field_parses_from_toml() {
        let config = parse(
            r#"
            brokers = "a:9092, b:9093"
            destination = "orders.{aggregate_type}"
            max_message_bytes = 65536
            delivery_timeout = "10s"
            metadata_timeout = "2s"
            create_topics = true
            topic_partitions = 6
            topic_replication_factor = 3

            [settings]
            "linger.ms" = "5"
            "batch.num.messages" = 1000
            "enable.ssl.certificate.verification" = false
            "sasl.password" = "hunter2"
            "#,
        )
        .expect("valid toml");
        assert_eq!(
            config.broker_list(),
            Ok(vec!["a:9092".into(), "b:9093".into()])
        );
        assert_eq!(config.settings["batch.num.messages"], "1000");
        assert_eq!(
            config.settings["enable.ssl.certificate.verification"],
            "false"
        );
        assert_eq!(config.partitions_for_new_topics(), 6);
        assert_eq!(config.replication_for_new_topics(), 3);
        assert!(!format!("{config:?}").contains("hunter2"));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        crate::error::assert_unparsable::<KafkaConfig>(
            "broker = \"x:1\"",
            "unknown field `broker`",
        );
        let err = parse("format = \"cloudevents\"").expect_err("unknown format");
        assert!(
            err.to_string().contains(
                "unknown variant `cloudevents`, expected one of `plain`, `cloudevents-binary`, `cloudevents-structured`"
            ),
            "{err}"
        );
    }

    #[test]
    fn validation_names_the_offending_key() {
        let cases = [
            (
                "brokers = \"\"",
                "sink.brokers: must name at least one broker",
            ),
            (
                "brokers = \"localhost\"",
                "sink.brokers: `localhost` is not `host:port`",
            ),
            ("brokers = \"a:x\"", "sink.brokers: "),
            (
                "destination = \"outbox event {aggregate_type}\"",
                "sink.destination: ",
            ),
            (
                "max_message_bytes = 10",
                "sink.max_message_bytes: must be between",
            ),
            (
                "delivery_timeout = \"0s\"",
                "sink.delivery_timeout: must be greater than 0",
            ),
            (
                "[settings]\n\"acks\" = \"1\"",
                "sink.settings.\"acks\": is set by the sink",
            ),
            (
                "[settings]\n\"message.max.bytes\" = \"5\"",
                "sink.settings.\"message.max.bytes\": is set by the sink: set `sink.max_message_bytes`",
            ),
            (
                "[settings]\n\"linger.mss\" = \"5\"",
                "sink.settings.\"linger.mss\": librdkafka refused it",
            ),
            (
                "[settings]\n\"linger.ms\" = \"soon\"",
                "sink.settings.\"linger.ms\": librdkafka refused it",
            ),
            (
                "format = \"cloudevents-binary\"\ncloudevents_source = \"urn:{tenant}\"",
                "sink.cloudevents_source: unknown placeholder `{tenant}`",
            ),
            (
                "format = \"cloudevents-structured\"\ncloudevents_content_type = \"json\"",
                "sink.cloudevents_content_type: ",
            ),
        ];
        crate::error::assert_refusals(&cases, KafkaConfig::validate);
    }

    #[test]
    fn a_refused_setting_never_echoes_its_value() {
        // An unknown key librdkafka refuses: the message names the key, not the value.
        let config = parse("[settings]\n\"ssl.key.passwordx\" = \"hunter2\"").expect("parses");
        let err = config.validate().expect_err("unknown key");
        assert!(err.to_string().contains("ssl.key.passwordx"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn tls_and_sasl_scram_settings_are_accepted() {
        // librdkafka is built with OpenSSL (rdkafka's `ssl`): without it these are refused.
        let config = parse(
            r#"
            [settings]
            "security.protocol" = "SASL_SSL"
            "sasl.mechanism" = "SCRAM-SHA-512"
            "sasl.username" = "relay"
            "sasl.password" = "hunter2"
            "ssl.ca.location" = "/etc/ssl/certs/ca-certificates.crt"
            "ssl.key.password" = "hunter3"
            "#,
        )
        .expect("parses");
        assert_eq!(config.validate(), Ok(()));
        for mechanism in ["SCRAM-SHA-256", "PLAIN"] {
            let mut other = config.clone();
            other
                .settings
                .insert("sasl.mechanism".into(), mechanism.into());
            assert_eq!(other.validate(), Ok(()), "{mechanism}");
        }
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("hunter3"),
            "{shown}"
        );
        let toml = toml::to_string(&config).expect("serializes");
        assert!(
            !toml.contains("hunter2") && !toml.contains("hunter3"),
            "{toml}"
        );
    }
}
