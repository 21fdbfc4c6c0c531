//! [`NatsConfig`]: the `[sink]` table for `kind = "nats"`.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use outbox_core::cloudevents::{Format, MessageFormat};
use outbox_core::{Destination, SinkError};
use serde::Deserialize;

use super::NatsSink;
use super::subject;
use crate::{ConfigError, Secret};

/// Settings of the NATS JetStream sink.
///
/// ```toml
/// [sink]
/// kind = "nats"
/// url = "nats://127.0.0.1:4222"
/// destination = "outbox.event.{aggregate_type}"
/// stream = "OUTBOX"            # created only if no stream covers the subjects yet
/// ```
///
/// On [`build`](Self::build) the sink looks for an existing stream that captures
/// `stream_subjects` and publishes into it (whatever its name). Only when no stream covers
/// them does it create `stream` with those subjects, file storage and the configured
/// `duplicate_window`. It never changes an existing stream.
#[derive(Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// Server URL, e.g. `nats://127.0.0.1:4222` (`nats://`, `tls://`, `ws://`, `wss://`).
    /// Several servers of one cluster may be given separated by commas. Default
    /// `nats://127.0.0.1:4222`.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::url")]
    pub url: String,
    /// Subject template; may use `{aggregate_type}`, `{event_type}` and `{aggregate_id}`.
    /// Default `outbox.event.{aggregate_type}`. An event whose rendered subject is not a valid
    /// NATS subject (a space or an empty token in `aggregate_id`, say) is rejected and
    /// dead-lettered, never silently rewritten.
    pub destination: Destination,
    /// Name of the JetStream stream to create when no existing stream covers
    /// `stream_subjects`. Default `OUTBOX`.
    pub stream: String,
    /// Subjects of the stream to create (and to look an existing stream up by). Default:
    /// derived from `destination`: its literal prefix up to the last `.` before the first
    /// placeholder, plus `>` (`outbox.event.{aggregate_type}` gives `outbox.event.>`), or the
    /// destination itself when it has no placeholder. Must be set explicitly when the
    /// destination starts with a placeholder.
    pub stream_subjects: Option<Vec<String>>,
    /// JetStream deduplication window of the stream this sink creates: a message whose
    /// `Nats-Msg-Id` (the event id) was stored within this window is stored only once.
    /// Default `2m`. Not applied to an existing stream.
    #[serde(with = "humantime_serde")]
    pub duplicate_window: Duration,
    /// Largest message (payload plus headers) to send, in bytes. The server's own
    /// `max_payload` always applies; this can only lower it. Larger events are rejected
    /// (dead-lettered) with their size and the limit. Default: the server's limit.
    pub max_payload: Option<NonZeroUsize>,
    /// Authentication token. Never printed. Mutually exclusive with `credentials` and
    /// `nkey_seed`.
    pub token: Option<Secret>,
    /// Path of a NATS `.creds` file (user JWT and NKey seed), for servers in operator (JWT)
    /// mode. Mutually exclusive with `token` and `nkey_seed`.
    pub credentials: Option<PathBuf>,
    /// A user NKey seed (`SU...`), for servers that list the user's public NKey
    /// (`authorization { users = [ { nkey: "U..." } ] }`): the client signs the server's nonce
    /// with it. Usually given as `nkey_seed_file` (the path of a file holding the seed, as
    /// `nk -gen user` writes it). Never printed. Mutually exclusive with `token` and
    /// `credentials`.
    pub nkey_seed: Option<Secret>,
    /// Path of a PEM file of CA certificates to verify the server with (instead of the
    /// system's roots). Setting it requires TLS, whatever the URL's scheme.
    pub tls_ca: Option<PathBuf>,
    /// Path of a client certificate (PEM) for servers that verify clients (`tls_key` too).
    pub tls_cert: Option<PathBuf>,
    /// Path of the client certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Longest wait for the TCP + NATS handshake when connecting. Default `5s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait for JetStream to acknowledge a message (and for stream management
    /// requests). A publish not acknowledged in time counts as the broker being unavailable.
    /// Default `10s`.
    #[serde(with = "humantime_serde")]
    pub ack_timeout: Duration,
    /// The message format: `plain` (the headers above, the default), `cloudevents-binary` (`ce-`
    /// headers, the payload as body) or `cloudevents-structured` (a JSON envelope as body), per
    /// the CloudEvents NATS binding (`docs/sinks.md`, "CloudEvents").
    pub format: Format,
    /// CloudEvents `source`, a template with `{aggregate_type}`, `{event_type}` and
    /// `{aggregate_id}`. Default `urn:outbox:{aggregate_type}`. Only used by the
    /// CloudEvents formats.
    pub cloudevents_source: String,
    /// CloudEvents `datacontenttype` of an event without a `content-type` header. Default
    /// `application/json`. Only used by the CloudEvents formats.
    pub cloudevents_content_type: String,
}

impl std::fmt::Debug for NatsConfig {
    /// The URL redacted (`Debug` output reaches logs and `outbox check-config`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &outbox_core::redact::redact_url(&self.url))
            .field("destination", &self.destination)
            .field("stream", &self.stream)
            .field("stream_subjects", &self.stream_subjects)
            .field("duplicate_window", &self.duplicate_window)
            .field("max_payload", &self.max_payload)
            .field("token", &self.token)
            .field("credentials", &self.credentials)
            .field("nkey_seed", &self.nkey_seed)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("connect_timeout", &self.connect_timeout)
            .field("ack_timeout", &self.ack_timeout)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .field("cloudevents_content_type", &self.cloudevents_content_type)
            .finish()
    }
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            destination: Destination::default(),
            stream: "OUTBOX".to_owned(),
            stream_subjects: None,
            duplicate_window: Duration::from_secs(120),
            max_payload: None,
            token: None,
            credentials: None,
            nkey_seed: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
        }
    }
}

impl NatsConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.message_format()?;
        let servers = self.servers();
        if servers.is_empty() {
            return Err(ConfigError::new("url", "must not be empty"));
        }
        for server in &servers {
            if let Err(e) = server.parse::<async_nats::ServerAddr>() {
                return Err(ConfigError::new("url", format!("`{server}`: {e}")));
            }
        }

        let sample =
            self.destination
                .render(&crate::broker::sample_event("Order", "o_1", "order.placed"));
        if let Some(problem) = subject::publish_subject_problem(&sample) {
            return Err(ConfigError::new(
                "destination",
                format!(
                    "`{}` renders to `{sample}` for a sample event, which {problem}",
                    self.destination
                ),
            ));
        }

        if let Some(problem) = subject::stream_name_problem(&self.stream) {
            return Err(ConfigError::new("stream", problem));
        }

        let subjects = self.resolved_stream_subjects().ok_or_else(|| {
            ConfigError::new(
                "stream_subjects",
                format!(
                    "cannot be derived from destination `{}`, which starts with a placeholder; \
                     set it explicitly",
                    self.destination
                ),
            )
        })?;
        if subjects.is_empty() {
            return Err(ConfigError::new("stream_subjects", "must not be empty"));
        }
        for s in &subjects {
            if let Some(problem) = subject::stream_subject_problem(s) {
                return Err(ConfigError::new(
                    "stream_subjects",
                    format!("`{s}` {problem}"),
                ));
            }
        }
        if !subjects.iter().any(|s| subject::covers(s, &sample)) {
            return Err(ConfigError::new(
                "stream_subjects",
                format!(
                    "{subjects:?} do not cover `{sample}`, the subject of a sample event \
                     under destination `{}`",
                    self.destination
                ),
            ));
        }

        let methods: Vec<&str> = [
            ("token", self.token.is_some()),
            ("credentials", self.credentials.is_some()),
            ("nkey_seed", self.nkey_seed.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect();
        if let [first, second, ..] = methods.as_slice() {
            return Err(ConfigError::new(
                *second,
                format!(
                    "set only one of `token`, `credentials` and `nkey_seed` (both `{first}` and `{second}` are set)"
                ),
            ));
        }
        if let Some(seed) = &self.nkey_seed {
            user_key_pair(seed)?;
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(ConfigError::new(
                "tls_cert",
                "set `tls_cert` and `tls_key` together (a client certificate and its key)",
            ));
        }
        if matches!(&self.token, Some(t) if t.expose().is_empty()) {
            return Err(ConfigError::new("token", "must not be empty"));
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("ack_timeout", self.ack_timeout),
            ("duplicate_window", self.duplicate_window),
        ] {
            if value.is_zero() {
                return Err(ConfigError::new(key, "must be greater than 0"));
            }
        }
        Ok(())
    }

    /// The subjects of the stream: `stream_subjects` as configured, else derived from the
    /// destination. `None` when they cannot be derived.
    pub fn resolved_stream_subjects(&self) -> Option<Vec<String>> {
        match &self.stream_subjects {
            Some(s) => Some(s.clone()),
            None => subject::derived_stream_subject(self.destination.template()).map(|s| vec![s]),
        }
    }

    /// The server URLs, split at commas.
    pub(super) fn servers(&self) -> Vec<String> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The checked `format`, `cloudevents_source` and `cloudevents_content_type`.
    pub(super) fn message_format(&self) -> Result<MessageFormat, ConfigError> {
        crate::cloudevents::message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )
    }

    /// Validates, connects, and finds or creates the stream; see the type documentation.
    ///
    /// Errors: an invalid config, refused credentials or a server without JetStream are
    /// [`Rejected`](outbox_core::SinkErrorKind::Rejected) (retrying cannot help); an
    /// unreachable server is [`Unavailable`](outbox_core::SinkErrorKind::Unavailable).
    pub async fn build(self) -> Result<NatsSink, SinkError> {
        self.validate()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        NatsSink::connect(self).await
    }
}

/// The user key pair of an NKey seed (surrounding whitespace ignored). The error names the
/// key and what is wrong, never the seed.
pub(super) fn user_key_pair(seed: &Secret) -> Result<nkeys::KeyPair, ConfigError> {
    let seed = seed.expose().trim();
    if seed.is_empty() {
        return Err(ConfigError::new("nkey_seed", "must not be empty"));
    }
    let pair = nkeys::KeyPair::from_seed(seed).map_err(|_| {
        ConfigError::new(
            "nkey_seed",
            "is not a valid NKey seed (expected the `SU...` seed of a user key, as `nk -gen user` writes it)",
        )
    })?;
    if pair.key_pair_type() != nkeys::KeyPairType::User {
        return Err(ConfigError::new(
            "nkey_seed",
            format!(
                "is the seed of a key of type {:?}, not of a user key (`SU...`)",
                pair.key_pair_type()
            ),
        ));
    }
    Ok(pair)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NatsConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn an_empty_table_gives_working_defaults() {
        let config = parse("").expect("defaults");
        assert_eq!(config, NatsConfig::default());
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(
            config.resolved_stream_subjects(),
            Some(vec!["outbox.event.>".to_owned()])
        );
    }

    #[test]
    fn every_field_parses_from_toml() {
        let config = parse(
            r#"
            url = "nats://a:4222, nats://b:4222"
            destination = "orders.{aggregate_type}.{event_type}"
            stream = "ORDERS"
            stream_subjects = ["orders.>"]
            duplicate_window = "10m"
            max_payload = 65536
            token = "s3cret"
            connect_timeout = "2s"
            ack_timeout = "30s"
            "#,
        )
        .expect("valid toml");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.servers(), vec!["nats://a:4222", "nats://b:4222"]);
        assert_eq!(config.duplicate_window, Duration::from_secs(600));
        assert!(!format!("{config:?}").contains("s3cret"));
    }

    #[test]
    fn unknown_keys_are_rejected() {
        crate::error::assert_unparsable::<NatsConfig>(
            "urll = \"nats://x\"",
            "unknown field `urll`",
        );
    }

    #[test]
    fn a_bad_placeholder_is_refused_while_parsing() {
        let err = parse("destination = \"outbox.{tenant}\"").expect_err("bad template");
        assert!(err.to_string().contains("tenant"), "{err}");
    }

    #[test]
    fn validation_names_the_offending_key() {
        let cases = [
            ("url = \"\"", "sink.url: must not be empty"),
            ("url = \"http://x\"", "sink.url: "),
            (
                "destination = \"outbox..{aggregate_type}\"",
                "sink.destination: ",
            ),
            ("stream = \"A.B\"", "sink.stream: "),
            (
                "destination = \"{aggregate_type}.x\"",
                "sink.stream_subjects: cannot be derived",
            ),
            (
                "stream_subjects = []",
                "sink.stream_subjects: must not be empty",
            ),
            ("stream_subjects = [\"other.>\"]", "sink.stream_subjects: "),
            ("stream_subjects = [\"a.>.b\"]", "sink.stream_subjects: "),
            (
                "token = \"t\"\ncredentials = \"x.creds\"",
                "sink.credentials: ",
            ),
            (
                "credentials = \"x.creds\"\nnkey_seed = \"SU\"",
                "sink.nkey_seed: set only one of",
            ),
            (
                "token = \"t\"\nnkey_seed = \"SU\"",
                "sink.nkey_seed: set only one of",
            ),
            (
                "nkey_seed = \"SUnotaseed\"",
                "sink.nkey_seed: is not a valid NKey seed",
            ),
            ("nkey_seed = \" \"", "sink.nkey_seed: must not be empty"),
            (
                "ack_timeout = \"0s\"",
                "sink.ack_timeout: must be greater than 0",
            ),
        ];
        crate::error::assert_refusals(&cases, NatsConfig::validate);
    }

    #[test]
    fn an_nkey_seed_must_be_a_users_and_never_prints() {
        let seed = nkeys::KeyPair::new_user().seed().expect("seed");
        let config = parse(&format!("nkey_seed = \"{seed}\\n\"")).expect("parses");
        assert_eq!(config.validate(), Ok(()));
        assert!(!format!("{config:?}").contains(&seed));
        let printed = toml::to_string(&config).expect("serializes");
        assert!(printed.contains("nkey_seed = \"***\""), "{printed}");
        assert!(!printed.contains(&seed), "{printed}");

        let account = nkeys::KeyPair::new_account().seed().expect("seed");
        let err = parse(&format!("nkey_seed = \"{account}\""))
            .expect("parses")
            .validate()
            .expect_err("an account seed");
        let err = err.to_string();
        assert!(
            err.starts_with("sink.nkey_seed: is the seed of a key of type Account"),
            "{err}"
        );
        assert!(!err.contains(&account), "{err}");
    }

    #[test]
    fn a_destination_starting_with_a_placeholder_works_with_explicit_subjects() {
        let config =
            parse("destination = \"{aggregate_type}.events\"\nstream_subjects = [\"*.events\"]")
                .expect("parses");
        assert_eq!(config.validate(), Ok(()));
    }
}
