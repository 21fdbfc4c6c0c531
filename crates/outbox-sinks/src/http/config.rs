//! [`HttpConfig`]: the `[sink]` table for `kind = "http"`.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::Duration;

use outbox_core::cloudevents::{Format, MessageFormat};
use outbox_core::{Destination, SinkError};
use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::HttpSink;
use super::signature::Signer;
use crate::{ConfigError, Secret};

/// Settings of the HTTP webhook sink.
///
/// ```toml
/// [sink]
/// kind = "http"
/// url = "https://hooks.example.com/outbox/{aggregate_type}"
/// secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
/// timeout = "10s"
/// max_concurrency = 64
/// headers = { "x-api-key" = "..." }
/// ```
#[derive(Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Endpoint URL, `http://` or `https://`. It is also the destination template: it may use
    /// `{aggregate_type}`, `{event_type}` and `{aggregate_id}` in its path and query (not in
    /// the scheme, host or port); the values are percent-encoded. Required.
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::url")]
    pub url: String,
    /// Signing secret. When set, every request carries `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature` per the Standard Webhooks spec. `whsec_<base64>` is the standard
    /// form (the base64 part is the key); any other string is used as raw key bytes. Never
    /// printed.
    pub secret: Option<Secret>,
    /// Longest wait for one request, from connecting to the end of the response headers.
    /// A connect timeout counts as the endpoint being unavailable, a response timeout as a
    /// transient failure (retried). Default `10s`.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Most requests in flight at once. Default `64`.
    pub max_concurrency: NonZeroUsize,
    /// Most events in one request. Default `1`: one `POST` per event, the payload as body.
    /// Above 1 the sink sends the events of a batch that go to the same URL together, as
    /// JSON lines (`application/x-ndjson`, one line per event in the file sink's format), or
    /// with `format = "cloudevents-structured"` as a CloudEvents JSON batch
    /// (`application/cloudevents-batch+json`). At most 1000; not with
    /// `cloudevents-binary`, which has one event per request by definition.
    pub events_per_request: NonZeroUsize,
    /// Extra headers sent with every request (an API key, say). Names starting with
    /// `outbox-` or `webhook-` are reserved. A `content-type` here replaces the default
    /// `application/octet-stream` (a row's own `content-type` header still wins).
    #[serde(serialize_with = "outbox_core::redact::serde_redacted::values")]
    pub headers: BTreeMap<String, String>,
    /// With `https://`: path of a PEM file of CAs to verify the endpoint with, INSTEAD of the
    /// system's roots (a private CA).
    pub tls_ca: Option<PathBuf>,
    /// With `https://`: path of a client certificate (PEM) for endpoints that verify clients
    /// (mutual TLS); `tls_key` too.
    pub tls_cert: Option<PathBuf>,
    /// Path of the client certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// The message format: `plain` (the `outbox-` headers, the default),
    /// `cloudevents-binary` (`ce-` headers, the payload as body) or `cloudevents-structured`
    /// (a JSON envelope as body), per the CloudEvents HTTP binding (`docs/sinks.md`,
    /// "CloudEvents").
    pub format: Format,
    /// CloudEvents `source`, a template like `url`'s placeholders (values not
    /// percent-encoded). Default `urn:outbox:{aggregate_type}`. Only used by the CloudEvents
    /// formats.
    pub cloudevents_source: String,
    /// CloudEvents `datacontenttype` of an event without a `content-type` header. Default
    /// `application/json`. Only used by the CloudEvents formats.
    pub cloudevents_content_type: String,
}

impl std::fmt::Debug for HttpConfig {
    /// The URL redacted and header values masked: an `Authorization` or API key header is a
    /// secret, and `Debug` output ends up in logs and `outbox check-config`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: BTreeMap<&str, &str> =
            self.headers.keys().map(|k| (k.as_str(), "***")).collect();
        f.debug_struct("HttpConfig")
            .field("url", &outbox_core::redact::redact_url(&self.url))
            .field("secret", &self.secret)
            .field("timeout", &self.timeout)
            .field("max_concurrency", &self.max_concurrency)
            .field("events_per_request", &self.events_per_request)
            .field("headers", &headers)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .field("cloudevents_content_type", &self.cloudevents_content_type)
            .finish()
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            secret: None,
            timeout: Duration::from_secs(10),
            max_concurrency: NonZeroUsize::new(64).expect("64 is not zero"),
            events_per_request: NonZeroUsize::MIN,
            headers: BTreeMap::new(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            format: Format::Plain,
            cloudevents_source: crate::cloudevents::default_source(),
            cloudevents_content_type: crate::cloudevents::default_content_type(),
        }
    }
}

/// The largest `events_per_request`.
pub(super) const MAX_EVENTS_PER_REQUEST: usize = 1000;

/// The parts of a validated config that the sink needs.
pub(super) struct Validated {
    pub(super) url: Destination,
    pub(super) origin: Url,
    pub(super) signer: Option<Signer>,
    pub(super) headers: reqwest::header::HeaderMap,
    /// The CAs of `tls_ca` (empty: the system's roots).
    pub(super) roots: Vec<reqwest::Certificate>,
    /// The client certificate and key of `tls_cert` / `tls_key`.
    pub(super) identity: Option<reqwest::Identity>,
    /// `format` and the CloudEvents keys.
    pub(super) format: MessageFormat,
}

impl HttpConfig {
    /// Checks every value without touching the network; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.checked().map(drop)
    }

    pub(super) fn checked(&self) -> Result<Validated, ConfigError> {
        if self.url.is_empty() {
            return Err(ConfigError::new(
                "url",
                "must be set (e.g. `https://hooks.example.com/outbox/{event_type}`)",
            ));
        }
        let url =
            Destination::parse(&self.url).map_err(|e| ConfigError::new("url", e.to_string()))?;
        let first = super::render_url(
            &url,
            &crate::broker::sample_event("Order", "o_1", "order.placed"),
        )
        .map_err(|e| ConfigError::new("url", e))?;
        let second = super::render_url(
            &url,
            &crate::broker::sample_event("Invoice", "i_2", "invoice.paid"),
        )
        .map_err(|e| ConfigError::new("url", e))?;
        let origin = first.origin();
        if origin != second.origin() {
            return Err(ConfigError::new(
                "url",
                "placeholders may only appear in the path and query, not in the scheme, host or port",
            ));
        }
        let mut origin_url = first.clone();
        origin_url.set_path("/");
        origin_url.set_query(None);
        origin_url.set_fragment(None);

        let signer = match &self.secret {
            None => None,
            Some(secret) => Some(
                Signer::from_secret(secret.expose()).map_err(|e| ConfigError::new("secret", e))?,
            ),
        };
        if self.timeout.is_zero() {
            return Err(ConfigError::new("timeout", "must be greater than 0"));
        }
        if self.events_per_request.get() > MAX_EVENTS_PER_REQUEST {
            return Err(ConfigError::new(
                "events_per_request",
                format!("must be at most {MAX_EVENTS_PER_REQUEST}"),
            ));
        }
        if self.events_per_request.get() > 1 && self.format == Format::CloudeventsBinary {
            return Err(ConfigError::new(
                "events_per_request",
                "must be 1 with format = \"cloudevents-binary\" (one event per request by \
                 definition); use \"cloudevents-structured\" or \"plain\" to batch",
            ));
        }

        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in &self.headers {
            let key = format!("headers.{name}");
            let lower = name.to_ascii_lowercase();
            if lower.starts_with("outbox-") || lower.starts_with("webhook-") {
                return Err(ConfigError::new(
                    key,
                    "names starting with `outbox-` or `webhook-` are reserved for the message",
                ));
            }
            if lower.starts_with("ce-") && self.format != Format::Plain {
                return Err(ConfigError::new(
                    key,
                    "names starting with `ce-` are the CloudEvents attributes of the message \
                     (sink.format)",
                ));
            }
            let header_name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ConfigError::new(key.clone(), "is not a valid HTTP header name"))?;
            let header_value = HeaderValue::from_str(value).map_err(|_| {
                ConfigError::new(key, "has a value that is not a valid HTTP header value")
            })?;
            headers.append(header_name, header_value);
        }
        let (roots, identity) = self.tls(origin_url.scheme() == "https")?;
        let format = crate::cloudevents::message_format(
            self.format,
            &self.cloudevents_source,
            &self.cloudevents_content_type,
        )?;
        Ok(Validated {
            url,
            origin: origin_url,
            signer,
            headers,
            roots,
            identity,
            format,
        })
    }

    /// The TLS files, read and parsed. Refused without `https://`: they would be unused.
    fn tls(
        &self,
        https: bool,
    ) -> Result<(Vec<reqwest::Certificate>, Option<reqwest::Identity>), ConfigError> {
        if !crate::tls::files_in_use(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            https,
            "https://",
        )? {
            return Ok((Vec::new(), None));
        }
        let read = crate::tls::read;
        let roots = match &self.tls_ca {
            Some(ca) => {
                reqwest::Certificate::from_pem_bundle(&read("tls_ca", ca)?).map_err(|e| {
                    ConfigError::new(
                        "tls_ca",
                        format!("`{}` is not a PEM CA file: {e}", ca.display()),
                    )
                })?
            }
            None => Vec::new(),
        };
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let mut pem = read("tls_cert", cert)?;
                pem.push(b'\n');
                pem.extend(read("tls_key", key)?);
                Some(reqwest::Identity::from_pem(&pem).map_err(|e| {
                    ConfigError::new(
                        "tls_cert",
                        format!(
                            "`{}` with its key is not a usable certificate: {e}",
                            cert.display()
                        ),
                    )
                })?)
            }
            _ => None,
        };
        Ok((roots, identity))
    }

    /// Validates and prepares the HTTP client. Does not contact the endpoint (see
    /// [`HttpSink`]'s healthcheck for that): a webhook receiver being down at start-up is
    /// an ordinary outage, not a configuration error.
    pub async fn build(self) -> Result<HttpSink, SinkError> {
        let validated = self
            .checked()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        HttpSink::new(self, validated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<HttpConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn a_minimal_table_gets_defaults() {
        let config = parse("url = \"http://127.0.0.1:8080/hooks\"").expect("parses");
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(config.max_concurrency.get(), 64);
        assert!(config.secret.is_none());
    }

    #[test]
    fn every_field_parses_and_the_secret_never_prints() {
        let config = parse(
            r#"
            url = "https://hooks.example.com/outbox/{aggregate_type}?type={event_type}"
            secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            timeout = "3s"
            max_concurrency = 8
            headers = { "x-api-key" = "k1", "content-type" = "application/json" }
            "#,
        )
        .expect("parses");
        assert_eq!(config.validate(), Ok(()));
        let debug = format!("{config:?}");
        assert!(!debug.contains("MfKQ9r8"), "{debug}");
        let validated = config.checked().expect("valid");
        assert_eq!(validated.origin.as_str(), "https://hooks.example.com/");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        crate::error::assert_unparsable::<HttpConfig>(
            "url = \"http://x\"\ndestination = \"y\"",
            "unknown field `destination`",
        );
    }

    #[test]
    fn validation_names_the_offending_key() {
        let cases = [
            ("", "sink.url: must be set"),
            ("url = \"ftp://x/y\"", "sink.url: "),
            ("url = \"not a url\"", "sink.url: "),
            (
                "url = \"http://x/{tenant}\"",
                "sink.url: unknown placeholder",
            ),
            (
                "url = \"http://{aggregate_type}.example.com/\"",
                "sink.url: placeholders may only",
            ),
            ("url = \"http://x\"\nsecret = \"whsec_!!\"", "sink.secret: "),
            (
                "url = \"http://x\"\nsecret = \"\"",
                "sink.secret: must not be empty",
            ),
            (
                "url = \"http://x\"\ntimeout = \"0s\"",
                "sink.timeout: must be greater than 0",
            ),
            (
                "url = \"http://x\"\nheaders = { \"outbox-id\" = \"1\" }",
                "sink.headers.outbox-id: ",
            ),
            (
                "url = \"http://x\"\nformat = \"cloudevents-binary\"\nheaders = { \"ce-id\" = \"1\" }",
                "sink.headers.ce-id: ",
            ),
            (
                "url = \"http://x\"\nformat = \"cloudevents-structured\"\ncloudevents_source = \"\"",
                "sink.cloudevents_source: must not be empty",
            ),
            (
                "url = \"http://x\"\nevents_per_request = 1001",
                "sink.events_per_request: must be at most 1000",
            ),
            (
                "url = \"http://x\"\nevents_per_request = 10\nformat = \"cloudevents-binary\"",
                "sink.events_per_request: must be 1 with format",
            ),
            (
                "url = \"http://x\"\nheaders = { \"bad name\" = \"1\" }",
                "sink.headers.bad name: ",
            ),
            (
                "url = \"http://x\"\nheaders = { \"x-a\" = \"a\\nb\" }",
                "sink.headers.x-a: ",
            ),
        ];
        crate::error::assert_refusals(&cases, HttpConfig::validate);
    }

    #[test]
    fn a_secret_is_never_part_of_an_error() {
        let config = parse("url = \"http://x\"\nsecret = \"whsec_sup3r-secret!\"").expect("parses");
        let err = config.validate().expect_err("bad base64");
        assert!(!err.to_string().contains("sup3r"), "{err}");
    }

    #[test]
    fn zero_concurrency_is_refused_while_parsing() {
        let err = parse("url = \"http://x\"\nmax_concurrency = 0").expect_err("zero");
        assert!(err.to_string().contains("max_concurrency"), "{err}");
    }
}
