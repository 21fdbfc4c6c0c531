//! [`RabbitMqConfig`]: the `[sink]` table for `kind = "rabbitmq"`.

use std::fmt;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::str::FromStr as _;
use std::time::Duration;

use lapin::uri::AMQPUri;
use outbox_core::cloudevents::{Format, MessageFormat};
use outbox_core::{Destination, SinkError};
use serde::Deserialize;

use super::RabbitMqSink;
use crate::ConfigError;
use crate::secret::redact_url;

/// The longest exchange name or routing key AMQP 0-9-1 can carry (a `shortstr`).
pub(super) const MAX_SHORT_STRING: usize = 255;

/// The most publishing channels.
pub(super) const MAX_CHANNELS: usize = 64;

/// Settings of the RabbitMQ sink.
///
/// ```toml
/// [sink]
/// kind = "rabbitmq"
/// url = "amqp://outbox:s3cret@rabbit.internal:5672/%2f"
/// exchange = "outbox"                            # declared durable topic if missing
/// destination = "outbox.event.{aggregate_type}"  # the routing key
/// ```
///
/// `Debug` shows the URL with its password masked.
#[derive(Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RabbitMqConfig {
    /// Broker URL: `amqp://user:password@host:port/vhost` (the vhost percent-encoded: `%2f`
    /// is `/`), or `amqps://` for TLS. Query parameters `heartbeat`, `frame_max`,
    /// `channel_max` and `auth_mechanism` are honoured. The password is never printed.
    /// Default `amqp://guest:guest@127.0.0.1:5672/%2f`.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::url")]
    pub url: String,
    /// Exchange to publish to. Default `outbox`. The empty string is the default exchange,
    /// which routes by queue name (the routing key must then be a queue's name).
    pub exchange: String,
    /// Declare `exchange` as a durable `topic` exchange when the sink starts (a no-op when it
    /// already exists so; an error when it exists with another type). `false`: only check that
    /// it exists, and refuse to start when it does not. Default `true`.
    pub declare_exchange: bool,
    /// Routing key template; may use `{aggregate_type}`, `{event_type}` and `{aggregate_id}`.
    /// Default `outbox.event.{aggregate_type}`. A rendered key over 255 bytes is rejected.
    pub destination: Destination,
    /// Publish with the `mandatory` flag: a message that no queue receives is returned by the
    /// broker and dead-lettered with the reason ("no queue bound for routing key ..."), instead
    /// of being dropped silently. Set `false` only when losing unroutable messages is
    /// intended. Default `true`.
    pub mandatory: bool,
    /// Largest message body to send, in bytes; larger events are rejected (dead-lettered)
    /// with their size. Set it to the broker's `max_message_size` (16 MiB by default since
    /// RabbitMQ 4.0, 128 MiB in 3.8–3.13). When the broker's limit is lower anyway, the
    /// broker refuses the message and the sink learns its limit from the refusal. Default
    /// `16777216` (16 MiB).
    pub max_message_size: NonZeroUsize,
    /// Channels the sink publishes on, over its one connection; a batch is spread over them
    /// and every confirm is awaited together. The broker runs each channel as its own
    /// process, so more channels can use more of a many-core broker's cores (on the 2-core
    /// benchmark machine 4 channels drained no faster than 1: `docs/benchmarks.md`). At most
    /// 64. Default `1`.
    pub channels: NonZeroUsize,
    /// Longest wait for the TCP connection and the AMQP handshake. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait for the broker to confirm a batch (publisher confirms). No confirm in time
    /// counts as the broker being unavailable (a blocked connection, say, during a memory or
    /// disk alarm). Default `10s`.
    #[serde(with = "humantime_serde")]
    pub confirm_timeout: Duration,
    /// With `amqps://`: path of a PEM file of CAs to verify the broker with (instead of the
    /// system's roots).
    pub tls_ca: Option<PathBuf>,
    /// With `amqps://`: path of a client certificate (PEM) for brokers that verify clients
    /// (`ssl_options.verify = verify_peer`); `tls_key` too.
    pub tls_cert: Option<PathBuf>,
    /// Path of the client certificate's private key (PEM, PKCS#8).
    pub tls_key: Option<PathBuf>,
    /// The message format: `plain` (the headers above, the default), `cloudevents-binary` (`ce-`
    /// headers, `datacontenttype` as the `content_type` property, the payload as body) or
    /// `cloudevents-structured` (a JSON envelope as body), per the CloudEvents RabbitMQ
    /// binding (`docs/sinks.md`, "CloudEvents").
    pub format: Format,
    /// CloudEvents `source`, a template with `{aggregate_type}`, `{event_type}` and
    /// `{aggregate_id}`. Default `urn:outbox:{aggregate_type}`. Only used by the
    /// CloudEvents formats.
    pub cloudevents_source: String,
    /// CloudEvents `datacontenttype` of an event without a `content-type` header. Default
    /// `application/json`. Only used by the CloudEvents formats.
    pub cloudevents_content_type: String,
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
            exchange: "outbox".to_owned(),
            declare_exchange: true,
            destination: Destination::default(),
            mandatory: true,
            max_message_size: NonZeroUsize::new(16 * 1024 * 1024).expect("16 MiB is not zero"),
            channels: NonZeroUsize::MIN,
            connect_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(10),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
        }
    }
}

impl fmt::Debug for RabbitMqConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqConfig")
            .field("url", &redact_url(&self.url))
            .field("exchange", &self.exchange)
            .field("declare_exchange", &self.declare_exchange)
            .field("destination", &self.destination.template())
            .field("mandatory", &self.mandatory)
            .field("channels", &self.channels)
            .field("max_message_size", &self.max_message_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .field("cloudevents_content_type", &self.cloudevents_content_type)
            .finish()
    }
}

impl RabbitMqConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.message_format()?;
        self.uri().map(drop)?;
        self.tls().map(drop)?;
        if self.exchange.len() > MAX_SHORT_STRING {
            return Err(ConfigError::new(
                "exchange",
                format!("must be at most {MAX_SHORT_STRING} bytes"),
            ));
        }
        if self.exchange.starts_with("amq.") && self.declare_exchange {
            return Err(ConfigError::new(
                "exchange",
                "names starting with `amq.` are reserved by the broker: use an existing one \
                 with declare_exchange = false, or another name",
            ));
        }
        if self.exchange.is_empty() && self.declare_exchange {
            return Err(ConfigError::new(
                "declare_exchange",
                "the default exchange (exchange = \"\") cannot be declared: set \
                 declare_exchange = false",
            ));
        }
        let sample =
            self.destination
                .render(&crate::broker::sample_event("Order", "o_1", "order.placed"));
        if sample.len() > MAX_SHORT_STRING {
            return Err(ConfigError::new(
                "destination",
                format!(
                    "renders to a routing key of {} bytes for a sample event (at most \
                     {MAX_SHORT_STRING})",
                    sample.len()
                ),
            ));
        }
        if self.channels.get() > MAX_CHANNELS {
            return Err(ConfigError::new(
                "channels",
                format!("must be at most {MAX_CHANNELS}"),
            ));
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("confirm_timeout", self.confirm_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(key, "must be greater than 0"));
            }
        }
        Ok(())
    }

    /// The parsed URL (its parse errors never repeat the password).
    pub(super) fn uri(&self) -> Result<AMQPUri, ConfigError> {
        let url = self.url.trim();
        if url.is_empty() {
            return Err(ConfigError::new("url", "must not be empty"));
        }
        let shown = redact_url(url);
        AMQPUri::from_str(url).map_err(|e| {
            ConfigError::new(
                "url",
                format!(
                    "`{shown}` is not a valid AMQP URL ({})",
                    e.replace(url, &shown)
                ),
            )
        })
    }

    /// The TLS files, read (default: the system's roots, no client certificate). Refused
    /// without `amqps://`: they would be silently unused.
    pub(super) fn tls(&self) -> Result<lapin::tcp::OwnedTLSConfig, ConfigError> {
        let mut tls = lapin::tcp::OwnedTLSConfig::default();
        if !crate::tls::files_in_use(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.url.trim().starts_with("amqps://"),
            "amqps://",
        )? {
            return Ok(tls);
        }
        let read = crate::tls::read;
        if let Some(ca) = &self.tls_ca {
            tls.cert_chain = Some(String::from_utf8(read("tls_ca", ca)?).map_err(|_| {
                ConfigError::new("tls_ca", format!("`{}` is not PEM text", ca.display()))
            })?);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            tls.identity = Some(lapin::tcp::OwnedIdentity::PKCS8 {
                pem: read("tls_cert", cert)?,
                key: read("tls_key", key)?,
            });
        }
        Ok(tls)
    }

    /// The checked `format`, `cloudevents_source` and `cloudevents_content_type`.
    pub(super) fn message_format(&self) -> Result<MessageFormat, ConfigError> {
        crate::cloudevents::message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
    }

    /// Validates, connects, declares (or checks) the exchange and opens a channel with
    /// publisher confirms.
    ///
    /// Errors: an invalid config, refused credentials, or an exchange that is missing (with
    /// `declare_exchange = false`) or of another type are
    /// [`Rejected`](outbox_core::SinkErrorKind::Rejected) (retrying cannot help); an
    /// unreachable broker is [`Unavailable`](outbox_core::SinkErrorKind::Unavailable).
    pub async fn build(self) -> Result<RabbitMqSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        RabbitMqSink::connect(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RabbitMqConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn an_empty_table_gives_working_defaults() {
        let config = parse("").expect("defaults");
        assert_eq!(config, RabbitMqConfig::default());
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.exchange, "outbox");
        assert!(config.declare_exchange && config.mandatory);
        assert_eq!(config.max_message_size.get(), 16 * 1024 * 1024);
    }

    #[test]
    fn every_field_parses_from_toml_and_the_password_never_prints() {
        let config = parse(
            r#"
            url = "amqps://relay:s3cret@rabbit.internal:5671/prod?heartbeat=10"
            exchange = "events"
            declare_exchange = false
            destination = "{aggregate_type}.{event_type}"
            mandatory = false
            max_message_size = 134217728
            connect_timeout = "2s"
            confirm_timeout = "30s"
            "#,
        )
        .expect("valid toml");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.confirm_timeout, Duration::from_secs(30));
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(
            debug.contains("amqps://relay:***@rabbit.internal:5671/prod"),
            "{debug}"
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        crate::error::assert_unparsable::<RabbitMqConfig>(
            "routing_key = \"x\"",
            "unknown field `routing_key`",
        );
    }

    #[test]
    fn validation_names_the_offending_key_without_the_password() {
        let long = "x".repeat(256);
        let cases = [
            ("url = \"\"".to_owned(), "sink.url: must not be empty"),
            (
                "url = \"http://guest:pw@h\"".to_owned(),
                "sink.url: `http://guest:***@h` is not a valid AMQP URL",
            ),
            (
                "url = \"amqp://guest:pw@h:notaport\"".to_owned(),
                "sink.url: `amqp://guest:***@h:notaport`",
            ),
            (
                format!("exchange = \"{long}\""),
                "sink.exchange: must be at most 255",
            ),
            (
                "exchange = \"amq.topic\"".to_owned(),
                "sink.exchange: names starting",
            ),
            ("exchange = \"\"".to_owned(), "sink.declare_exchange: "),
            (
                format!("destination = \"{long}.{{aggregate_type}}\""),
                "sink.destination: renders to a routing key of",
            ),
            (
                "channels = 65".to_owned(),
                "sink.channels: must be at most 64",
            ),
            (
                "confirm_timeout = \"0s\"".to_owned(),
                "sink.confirm_timeout: must be greater than 0",
            ),
        ];
        for (text, expected) in &cases {
            let err = parse(text).expect("parses").validate().expect_err(text);
            assert!(err.to_string().starts_with(expected), "{text}: {err}");
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
    }

    #[test]
    fn existing_reserved_and_default_exchanges_are_allowed_without_declaring() {
        for exchange in ["amq.topic", ""] {
            let config = RabbitMqConfig {
                exchange: exchange.to_owned(),
                declare_exchange: false,
                ..RabbitMqConfig::default()
            };
            assert_eq!(config.validate(), Ok(()), "{exchange:?}");
        }
    }
}
