//! [`RedisConfig`]: the `[sink]` table for `kind = "redis"`.

use std::fmt;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use outbox_core::cloudevents::{Format, MessageFormat};
use outbox_core::{Destination, SinkError};
use redis::IntoConnectionInfo as _;
use serde::Deserialize;

use super::RedisSink;
use crate::ConfigError;
use crate::secret::redact_url;

/// Settings of the Redis Streams sink.
///
/// ```toml
/// [sink]
/// kind = "redis"
/// url = "redis://127.0.0.1:6379"
/// destination = "outbox.event.{aggregate_type}"   # the stream key
/// maxlen = 1000000                                # XADD ... MAXLEN ~ 1000000
/// ```
///
/// `Debug` shows the URL with its password masked.
#[derive(Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// Server URL: `redis://[[user]:password@]host[:port][/db]`, `rediss://…` (TLS), or
    /// `redis+unix:///path/to/redis.sock[?db=N]`. The password is never printed. Default
    /// `redis://127.0.0.1:6379`.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::url")]
    pub url: String,
    /// Stream key template; may use `{aggregate_type}`, `{event_type}` and `{aggregate_id}`.
    /// Default `outbox.event.{aggregate_type}`.
    pub destination: Destination,
    /// Trim each stream to about this many entries on every `XADD` (`MAXLEN ~ N`: Redis trims
    /// whole macro nodes, so a stream may hold somewhat more). Unset: streams grow until
    /// consumers trim them (`XTRIM`, `XDEL`). Trimming drops the oldest entries whether or not
    /// every consumer group has read them.
    pub maxlen: Option<NonZeroUsize>,
    /// Largest payload (and header value) to send, in bytes. The server's own
    /// `proto-max-bulk-len` (read with `CONFIG GET` when allowed, else Redis' default 512 MiB)
    /// always applies; this can only lower it. Larger events are rejected (dead-lettered)
    /// with their size and the limit. Default: the server's limit.
    pub max_payload: Option<NonZeroUsize>,
    /// Longest wait for the TCP connection and the Redis handshake. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait for the answers to one pipelined batch (and to `PING`). No answer in time
    /// counts as the server being unavailable. Default `10s`.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// With `rediss://`: path of a PEM file of CAs to verify the server with (instead of the
    /// system's roots).
    pub tls_ca: Option<PathBuf>,
    /// With `rediss://`: path of a client certificate (PEM) for servers that verify clients
    /// (`tls-auth-clients`); `tls_key` too.
    pub tls_cert: Option<PathBuf>,
    /// Path of the client certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// The message format: `plain` (the fields above, the default), `cloudevents-binary` (the
    /// attributes as `ce-` fields and `content-type`, the payload in `payload`) or
    /// `cloudevents-structured` (the JSON envelope in `payload`); Redis has no CloudEvents
    /// binding, so these follow the HTTP binding's names (`docs/sinks.md`, "CloudEvents").
    pub format: Format,
    /// CloudEvents `source`, a template with `{aggregate_type}`, `{event_type}` and
    /// `{aggregate_id}`. Default `urn:outbox:{aggregate_type}`. Only used by the
    /// CloudEvents formats.
    pub cloudevents_source: String,
    /// CloudEvents `datacontenttype` of an event without a `content-type` header. Default
    /// `application/json`. Only used by the CloudEvents formats.
    pub cloudevents_content_type: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            destination: Destination::default(),
            maxlen: None,
            max_payload: None,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("destination", &self.destination.template())
            .field("maxlen", &self.maxlen)
            .field("max_payload", &self.max_payload)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .field("cloudevents_content_type", &self.cloudevents_content_type)
            .finish()
    }
}

impl RedisConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.message_format()?;
        self.client().map(drop)
    }

    /// The checked `format`, `cloudevents_source` and `cloudevents_content_type`.
    pub(super) fn message_format(&self) -> Result<MessageFormat, ConfigError> {
        crate::cloudevents::message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
    }

    /// The client for `url` (parsing only; no connection is made).
    pub(super) fn client(&self) -> Result<redis::Client, ConfigError> {
        let url = self.url.trim();
        if url.is_empty() {
            return Err(ConfigError::new("url", "must not be empty"));
        }
        let shown = redact_url(url);
        let tls = url.starts_with("rediss://");
        if !(tls
            || url.starts_with("redis://")
            || url.starts_with("redis+unix://")
            || url.starts_with("unix://"))
        {
            return Err(ConfigError::new(
                "url",
                format!("`{shown}` must start with redis://, rediss:// or redis+unix://"),
            ));
        }
        let info = url.into_connection_info().map_err(|e| {
            // The parser's message may quote the URL, password included: say only what kind
            // of problem it is.
            ConfigError::new(
                "url",
                format!("`{shown}` is not a valid Redis URL ({:?})", e.kind()),
            )
        })?;
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(key, "must be greater than 0"));
            }
        }
        let sample =
            self.destination
                .render(&crate::broker::sample_event("Order", "o_1", "order.placed"));
        if sample.is_empty() {
            return Err(ConfigError::new(
                "destination",
                "renders to an empty stream key for a sample event",
            ));
        }
        let certificates = self.tls_certificates(tls)?;
        crate::tls::choose_crypto_provider();
        match certificates {
            Some(certificates) => redis::Client::build_with_tls(info, certificates),
            None => redis::Client::open(info),
        }
        .map_err(|e| ConfigError::new("url", format!("`{shown}` cannot be used ({:?})", e.kind())))
    }

    /// The CA and client certificate files, read; `None` when none is set. Refused without
    /// `rediss://`: they would be silently unused.
    fn tls_certificates(&self, tls: bool) -> Result<Option<redis::TlsCertificates>, ConfigError> {
        if !crate::tls::files_in_use(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            tls,
            "rediss://",
        )? {
            return Ok(None);
        }
        let read = crate::tls::read;
        let root_cert = self
            .tls_ca
            .as_ref()
            .map(|p| read("tls_ca", p))
            .transpose()?;
        let client_tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("tls_cert", cert)?,
                client_key: read("tls_key", key)?,
            }),
            _ => None,
        };
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// Validates, connects, and reads the server's argument size limit.
    ///
    /// Errors: an invalid config or refused credentials are
    /// [`Rejected`](outbox_core::SinkErrorKind::Rejected) (retrying cannot help); an
    /// unreachable server is [`Unavailable`](outbox_core::SinkErrorKind::Unavailable).
    pub async fn build(self) -> Result<RedisSink, SinkError> {
        let format = self
            .message_format()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let client = self
            .client()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        RedisSink::connect(self, client, format).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RedisConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn an_empty_table_gives_working_defaults() {
        let config = parse("").expect("defaults");
        assert_eq!(config, RedisConfig::default());
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.url, "redis://127.0.0.1:6379");
        assert_eq!(
            config.destination.template(),
            "outbox.event.{aggregate_type}"
        );
        assert_eq!(config.maxlen, None);
    }

    #[test]
    fn every_field_parses_from_toml_and_the_password_never_prints() {
        let config = parse(
            r#"
            url = "redis://app:s3cret@10.0.0.5:6380/2"
            destination = "events:{aggregate_type}"
            maxlen = 100000
            max_payload = 65536
            connect_timeout = "2s"
            response_timeout = "30s"
            "#,
        )
        .expect("valid toml");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.maxlen.map(NonZeroUsize::get), Some(100_000));
        assert_eq!(config.response_timeout, Duration::from_secs(30));
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("redis://app:***@10.0.0.5:6380/2"), "{debug}");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        crate::error::assert_unparsable::<RedisConfig>("stream = \"x\"", "unknown field `stream`");
    }

    #[test]
    fn zero_maxlen_is_refused_while_parsing() {
        let err = parse("maxlen = 0").expect_err("zero");
        assert!(err.to_string().contains("maxlen"), "{err}");
    }

    #[test]
    fn validation_names_the_offending_key_without_the_password() {
        let cases = [
            ("url = \"\"", "sink.url: must not be empty"),
            ("url = \"http://h\"", "sink.url: `http://h` must start with"),
            (
                "url = \"redis://h\"\ntls_ca = \"/ca.pem\"",
                "sink.tls_ca: TLS files are set but `url` is not rediss://",
            ),
            (
                "url = \"rediss://h\"\ntls_ca = \"/no/such/ca.pem\"",
                "sink.tls_ca: cannot read `/no/such/ca.pem`",
            ),
            (
                "url = \"rediss://h\"\ntls_cert = \"/c.pem\"",
                "sink.tls_cert: set `tls_cert` and `tls_key` together",
            ),
            (
                "url = \"redis://:pw@h:notaport\"",
                "sink.url: `redis://:***@h:notaport`",
            ),
            (
                "connect_timeout = \"0s\"",
                "sink.connect_timeout: must be greater than 0",
            ),
            (
                "response_timeout = \"0s\"",
                "sink.response_timeout: must be greater than 0",
            ),
        ];
        for err in crate::error::assert_refusals(&cases, RedisConfig::validate) {
            assert!(!err.contains("pw@"), "{err}");
        }
    }
}
