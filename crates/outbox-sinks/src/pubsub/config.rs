//! [`PubSubConfig`]: the `[sink]` table for `kind = "pubsub"`.

use std::fmt;
use std::num::NonZeroUsize;
use std::time::Duration;

use outbox_core::cloudevents::{Format, MessageFormat};
use outbox_core::{Destination, SinkError};
use reqwest::Url;
use serde::Deserialize;

use super::{MAX_REQUEST_BYTES, PubSubSink, topic_name_problem};
use crate::ConfigError;

/// The environment variable the Google Cloud client libraries read for the emulator's
/// address (`host:port`); honoured when `endpoint` is not set.
pub const EMULATOR_HOST_ENV: &str = "PUBSUB_EMULATOR_HOST";

/// The Pub/Sub API on Google Cloud.
pub const DEFAULT_API_URL: &str = "https://pubsub.googleapis.com";

/// Settings of the Google Cloud Pub/Sub sink.
///
/// ```toml
/// [sink]
/// kind = "pubsub"
/// project = "my-project"
/// topic = "outbox.event.{aggregate_type}"   # the topic id, a template
/// # endpoint = "127.0.0.1:8085"            # the emulator (else $PUBSUB_EMULATOR_HOST, else Google)
/// ```
///
/// Where the messages go, first match wins: `endpoint` (an emulator, plain HTTP, no
/// credentials); `api_url` (Google's API at that address, with credentials); the
/// environment variable `PUBSUB_EMULATOR_HOST` (an emulator); Google's API at
/// `https://pubsub.googleapis.com` with Application Default Credentials.
#[derive(Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PubSubConfig {
    /// The Google Cloud project id that owns the topics (`my-project`). Required.
    pub project: String,
    /// Topic id template (the last part of `projects/<project>/topics/<topic>`); may use
    /// `{aggregate_type}`, `{event_type}` and `{aggregate_id}`. A topic id starts with a
    /// letter, has 3 to 255 characters out of letters, digits and `-._~%+`, and does not
    /// start with `goog`; an event whose topic renders otherwise is rejected (dead-lettered)
    /// with the reason. Topics are not created by the sink: create them (and the
    /// subscriptions) beforehand. Default `outbox.event.{aggregate_type}`.
    pub topic: Destination,
    /// Address of a Pub/Sub emulator, `host:port` (e.g. `127.0.0.1:8085`): plain HTTP, no
    /// credentials. Wins over the environment variable `PUBSUB_EMULATOR_HOST`, which is
    /// honoured when this is not set. Unset (and no such variable): Google Cloud.
    pub endpoint: Option<String>,
    /// Base URL of Google's Pub/Sub API, used with credentials; for a locational endpoint
    /// such as `https://europe-west1-pubsub.googleapis.com` (Google recommends one region for
    /// ordered publishing) or a Private Service Connect address. `https://` only (plain
    /// `http://` only to a loopback address). Wins over `PUBSUB_EMULATOR_HOST`; cannot be
    /// combined with `endpoint`. Default `https://pubsub.googleapis.com`.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::optional_url")]
    pub api_url: Option<String>,
    /// Longest wait for one publish request, from connecting to the end of the answer. No
    /// answer in time counts as the service being unavailable (the batch is retried; the
    /// messages may then arrive twice). Default `10s`.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Most publish requests in flight at once (a batch is one request per topic and per
    /// 1000 messages or 10 MB). Default `16`.
    pub max_concurrency: NonZeroUsize,
    /// Largest payload to send, in bytes; larger events are rejected (dead-lettered) with
    /// their size and the limit. Pub/Sub's own limit of 10 MB (10,000,000 bytes) per publish
    /// request, attributes and ordering key included, always applies; this can only lower
    /// it. Default: Pub/Sub's limit.
    pub max_payload: Option<NonZeroUsize>,
    /// The message format: `plain` (the attributes above, the default), `cloudevents-binary` (the
    /// attributes as `ce-` attributes and `content-type`, the payload as data) or
    /// `cloudevents-structured` (the JSON envelope as data), per the draft CloudEvents Pub/Sub
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

impl Default for PubSubConfig {
    fn default() -> Self {
        Self {
            project: String::new(),
            topic: Destination::default(),
            endpoint: None,
            api_url: None,
            timeout: Duration::from_secs(10),
            max_concurrency: NonZeroUsize::new(16).expect("16 is not zero"),
            max_payload: None,
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
        }
    }
}

impl fmt::Debug for PubSubConfig {
    /// No secrets live here (credentials come from Application Default Credentials), but an
    /// `api_url` with a user and password in it is shown masked all the same.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubConfig")
            .field("project", &self.project)
            .field("topic", &self.topic.template())
            .field("endpoint", &self.endpoint)
            .field(
                "api_url",
                &self.api_url.as_deref().map(outbox_core::redact::redact_url),
            )
            .field("timeout", &self.timeout)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_payload", &self.max_payload)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .field("cloudevents_content_type", &self.cloudevents_content_type)
            .finish()
    }
}

/// Where the sink sends its requests, decided at build time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// An emulator at `host:port`: plain HTTP, no credentials. `from_env` says whether the
    /// address came from `PUBSUB_EMULATOR_HOST`.
    Emulator { host: String, from_env: bool },
    /// Google's API at this base URL (no trailing `/`), with an OAuth token.
    Google { base: String },
}

impl PubSubConfig {
    /// Checks every value without touching the network or the environment; the error names
    /// the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.message_format()?;
        let project = self.project.trim();
        if project.is_empty() {
            return Err(ConfigError::new(
                "project",
                "must be set (the Google Cloud project id, e.g. `my-project`)",
            ));
        }
        if let Some(c) = project
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':')))
        {
            return Err(ConfigError::new(
                "project",
                format!(
                    "`{project}` is not a project id (`{}` is not allowed; use the id, e.g. \
                     `my-project`, not a path or a name)",
                    c.escape_default()
                ),
            ));
        }
        for (aggregate_type, aggregate_id, event_type) in [
            ("Order", "o_1", "order.placed"),
            ("Invoice", "i_2", "invoice.paid"),
        ] {
            let sample = crate::broker::sample_event(aggregate_type, aggregate_id, event_type);
            let rendered = self.topic.render(&sample);
            if let Some(problem) = topic_name_problem(&rendered) {
                let hint = if rendered.contains('/') {
                    " (give the topic id only; the project goes in `project`)"
                } else {
                    ""
                };
                return Err(ConfigError::new(
                    "topic",
                    format!(
                        "`{}` renders to `{rendered}` for a sample event, which is not a \
                         Pub/Sub topic id: {problem}{hint}",
                        self.topic
                    ),
                ));
            }
        }
        if let Some(endpoint) = &self.endpoint {
            check_host_port(endpoint).map_err(|e| ConfigError::new("endpoint", e))?;
            if self.api_url.is_some() {
                return Err(ConfigError::new(
                    "api_url",
                    "set either `endpoint` (an emulator, no credentials) or `api_url` (Google, \
                     with credentials), not both",
                ));
            }
        }
        if let Some(api_url) = &self.api_url {
            check_api_url(api_url).map_err(|e| ConfigError::new("api_url", e))?;
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new("timeout", "must be greater than 0"));
        }
        if let Some(max) = self.max_payload
            && max.get() > MAX_REQUEST_BYTES
        {
            return Err(ConfigError::new(
                "max_payload",
                format!(
                    "{} exceeds Pub/Sub's limit of {MAX_REQUEST_BYTES} bytes per message; it can \
                     only lower it",
                    max.get()
                ),
            ));
        }
        Ok(())
    }

    /// Where requests go, given the value of `PUBSUB_EMULATOR_HOST` (`emulator_env`).
    pub(super) fn target(&self, emulator_env: Option<&str>) -> Result<Target, ConfigError> {
        if let Some(endpoint) = &self.endpoint {
            return Ok(Target::Emulator {
                host: endpoint.trim().to_owned(),
                from_env: false,
            });
        }
        if let Some(api_url) = &self.api_url {
            return Ok(Target::Google {
                base: api_url.trim().trim_end_matches('/').to_owned(),
            });
        }
        match emulator_env.map(str::trim) {
            Some(host) if !host.is_empty() => {
                check_host_port(host).map_err(|e| {
                    ConfigError::new(
                        "endpoint",
                        format!("unset, and {EMULATOR_HOST_ENV} is invalid: {e}"),
                    )
                })?;
                Ok(Target::Emulator {
                    host: host.to_owned(),
                    from_env: true,
                })
            }
            _ => Ok(Target::Google {
                base: DEFAULT_API_URL.to_owned(),
            }),
        }
    }

    /// The checked `format`, `cloudevents_source` and `cloudevents_content_type`.
    pub(super) fn message_format(&self) -> Result<MessageFormat, ConfigError> {
        crate::cloudevents::message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
    }

    /// Validates and prepares the HTTP client; with Google as the target, also finds the
    /// Application Default Credentials (no token is fetched yet). Does not contact Pub/Sub
    /// (the healthcheck does): an emulator that is down at start-up is an ordinary outage.
    ///
    /// Errors: an invalid config, or no credentials found, are
    /// [`Rejected`](outbox_core::SinkErrorKind::Rejected) (retrying cannot help).
    pub async fn build(self) -> Result<PubSubSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let env = std::env::var(EMULATOR_HOST_ENV).ok();
        let target = self
            .target(env.as_deref())
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        PubSubSink::new(self, target).await
    }
}

/// `host:port` with a host and a numeric port, and no scheme or path.
fn check_host_port(value: &str) -> Result<(), String> {
    let value = value.trim();
    if value.contains("://") {
        return Err(format!(
            "`{value}` must be `host:port` without a scheme (e.g. `127.0.0.1:8085`)"
        ));
    }
    let Some((host, port)) = value.rsplit_once(':') else {
        return Err(format!(
            "`{value}` must be `host:port` (e.g. `127.0.0.1:8085`)"
        ));
    };
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) {
        return Err(format!("`{value}` has no valid host"));
    }
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("`{value}` has no valid port"));
    }
    Ok(())
}

/// An `https://` URL (or `http://` to a loopback address) without a path beyond `/`.
fn check_api_url(value: &str) -> Result<(), String> {
    let shown = outbox_core::redact::redact_url(value);
    let url = Url::parse(value.trim()).map_err(|e| format!("`{shown}` is not a URL: {e}"))?;
    let loopback = match url.host_str() {
        Some("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => return Err(format!("`{shown}` has no host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "`{shown}` must use https (the access token would travel in clear text)"
            ));
        }
        other => return Err(format!("`{shown}`: scheme `{other}` is not https")),
    }
    if url.path() != "/" || url.query().is_some() {
        return Err(format!(
            "`{shown}` must be a base URL without a path (e.g. `https://europe-west1-pubsub.googleapis.com`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PubSubConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn a_project_is_enough_and_the_rest_defaults() {
        let config = parse("project = \"my-project\"").expect("parses");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.topic.template(), "outbox.event.{aggregate_type}");
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(config.max_concurrency.get(), 16);
        assert_eq!(config.endpoint, None);
        assert_eq!(config.max_payload, None);
    }

    #[test]
    fn every_field_parses_from_toml() {
        let config = parse(
            r#"
            project = "proj-outbox"
            topic = "orders-{aggregate_type}"
            api_url = "https://europe-west1-pubsub.googleapis.com"
            timeout = "3s"
            max_concurrency = 4
            max_payload = 1048576
            "#,
        )
        .expect("parses");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.max_payload.map(NonZeroUsize::get), Some(1_048_576));
        assert_eq!(
            config.target(Some("127.0.0.1:1")),
            Ok(Target::Google {
                base: "https://europe-west1-pubsub.googleapis.com".to_owned()
            })
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        crate::error::assert_unparsable::<PubSubConfig>(
            "project = \"p-1\"\ndestination = \"x\"",
            "unknown field `destination`",
        );
    }

    #[test]
    fn validation_names_the_offending_key() {
        let cases = [
            ("", "sink.project: must be set"),
            ("project = \"  \"", "sink.project: must be set"),
            (
                "project = \"projects/p\"",
                "sink.project: `projects/p` is not a project id",
            ),
            (
                "project = \"p-1\"\ntopic = \"projects/p-1/topics/orders\"",
                "sink.topic: `projects/p-1/topics/orders` renders",
            ),
            (
                "project = \"p-1\"\ntopic = \"1-{aggregate_type}\"",
                "sink.topic: `1-{aggregate_type}` renders to `1-Order`",
            ),
            (
                "project = \"p-1\"\ntopic = \"goog-{aggregate_type}\"",
                "sink.topic: ",
            ),
            (
                "project = \"p-1\"\ntopic = \"a b {event_type}\"",
                "sink.topic: ",
            ),
            ("project = \"p-1\"\ntopic = \"ab\"", "sink.topic: "),
            (
                "project = \"p-1\"\nendpoint = \"http://127.0.0.1:8085\"",
                "sink.endpoint: `http://127.0.0.1:8085` must be `host:port` without a scheme",
            ),
            (
                "project = \"p-1\"\nendpoint = \"localhost\"",
                "sink.endpoint: ",
            ),
            (
                "project = \"p-1\"\nendpoint = \"localhost:0\"",
                "sink.endpoint: `localhost:0` has no valid port",
            ),
            (
                "project = \"p-1\"\nendpoint = \"h:1\"\napi_url = \"https://x\"",
                "sink.api_url: set either",
            ),
            (
                "project = \"p-1\"\napi_url = \"http://pubsub.example.com\"",
                "sink.api_url: `http://pubsub.example.com` must use https",
            ),
            (
                "project = \"p-1\"\napi_url = \"https://h/v1/projects\"",
                "sink.api_url: ",
            ),
            (
                "project = \"p-1\"\ntimeout = \"0s\"",
                "sink.timeout: must be greater than 0",
            ),
            (
                "project = \"p-1\"\nmax_payload = 10000001",
                "sink.max_payload: 10000001 exceeds",
            ),
        ];
        crate::error::assert_refusals(&cases, PubSubConfig::validate);
    }

    #[test]
    fn an_unknown_placeholder_is_refused_while_parsing() {
        let err = parse("project = \"p-1\"\ntopic = \"t-{tenant}\"").expect_err("placeholder");
        assert!(err.to_string().contains("unknown placeholder"), "{err}");
    }

    #[test]
    fn endpoint_wins_over_the_environment_which_wins_over_google() {
        let mut config = parse("project = \"p-1\"").expect("parses");
        assert_eq!(
            config.target(None),
            Ok(Target::Google {
                base: DEFAULT_API_URL.to_owned()
            })
        );
        assert_eq!(
            config.target(Some(" ")),
            Ok(Target::Google {
                base: DEFAULT_API_URL.to_owned()
            })
        );
        assert_eq!(
            config.target(Some("127.0.0.1:8085")),
            Ok(Target::Emulator {
                host: "127.0.0.1:8085".to_owned(),
                from_env: true
            })
        );
        let err = config.target(Some("http://x:1")).expect_err("bad env");
        assert!(
            err.to_string().contains("PUBSUB_EMULATOR_HOST is invalid"),
            "{err}"
        );
        config.endpoint = Some("localhost:9999".to_owned());
        assert_eq!(
            config.target(Some("127.0.0.1:8085")),
            Ok(Target::Emulator {
                host: "localhost:9999".to_owned(),
                from_env: false
            })
        );
    }

    #[test]
    fn debug_and_serialize_mask_a_password_in_api_url() {
        let config = parse("project = \"p-1\"\napi_url = \"https://user:s3cret@psc.example.com\"")
            .expect("parses");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(debug.contains("user:***@psc.example.com"), "{debug}");
        let text = toml::to_string(&config).expect("serializes");
        assert!(!text.contains("s3cret"), "{text}");
    }
}
