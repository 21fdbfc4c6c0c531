//! HTTP webhook sink (feature `http`).
//!
//! Each event becomes one `POST` to the `url` template rendered for the event (placeholder
//! values percent-encoded):
//!
//! | part | value |
//! | --- | --- |
//! | body | the payload bytes exactly |
//! | `outbox-id`, `outbox-event_type`, `outbox-aggregate_type`, `outbox-aggregate_id` | the contract headers |
//! | `outbox-<name>` | each of the row's own headers |
//! | `content-type` | the row's `content-type` header if it has one, else a configured one, else `application/octet-stream` |
//! | `webhook-id`, `webhook-timestamp`, `webhook-signature` | with a `secret`: per Standard Webhooks; the id is the event id, so a receiver's idempotency check works across retries |
//!
//! The events of a batch are sent concurrently (at most `max_concurrency` at once) and the
//! results come back in input order. Redirects are not followed.
//!
//! | outcome | kind |
//! | --- | --- |
//! | 2xx | delivered |
//! | 408, 429, 5xx, no response within `timeout`, connection lost mid-request | `Transient` (retried with backoff) |
//! | connection refused, DNS failure, connect timeout | `Unavailable` (the whole batch when every request failed so) |
//! | 3xx and any other 4xx | `Rejected` (dead-lettered) with the status and the first 200 bytes of the response body |
//! | header name that HTTP cannot carry, or a value with a control character | `Rejected` |
//!
//! Header values go as their UTF-8 bytes: non-ASCII text (an aggregate id `Zürich-1`) is
//! carried as is; receivers read the header's bytes as UTF-8 (`WebhookReceiver` does).
//!
//! With `format = "cloudevents-binary"` the `outbox-` headers are replaced by the CloudEvents
//! HTTP binding's: `ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-subject`, `ce-time`,
//! the extensions as `ce-<name>` (values percent-encoded as that binding requires) and
//! `content-type` = `datacontenttype`; the body stays the payload. With
//! `"cloudevents-structured"` the body is the JSON envelope and `content-type` is
//! `application/cloudevents+json`. The `webhook-` signature headers are the same in every
//! format (signing the body as sent).

mod batched;
mod config;
mod signature;

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};

pub use config::HttpConfig;
use signature::Signer;

/// The CloudEvents HTTP protocol binding: every attribute in a header prefixed `ce-`, its
/// value percent-encoded (space, `"`, `%`, non-ASCII); `datacontenttype` in `content-type`;
/// structured mode as `content-type: application/cloudevents+json`.
pub const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: Some("content-type"),
    structured_content_type: Some("content-type"),
    percent_encode: true,
};

/// How much of an error response's body goes into the failure reason.
const REASON_BODY_BYTES: usize = 200;
/// How much of a response body is read (and dropped) so the connection can be reused.
const DRAIN_BODY_BYTES: usize = 64 * 1024;

/// Delivers events as HTTP webhooks; built from an [`HttpConfig`].
pub struct HttpSink {
    client: reqwest::Client,
    url: Destination,
    origin: Url,
    signer: Option<Signer>,
    static_headers: HeaderMap,
    format: MessageFormat,
    max_concurrency: usize,
    events_per_request: usize,
    timeout: Duration,
}

impl fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSink")
            .field("url", &self.url.template())
            .field("signed", &self.signer.is_some())
            .field("max_concurrency", &self.max_concurrency)
            .field("events_per_request", &self.events_per_request)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    fn new(config: HttpConfig, validated: config::Validated) -> Result<Self, SinkError> {
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("outbox/", env!("CARGO_PKG_VERSION")));
        if !validated.roots.is_empty() {
            builder = builder.tls_certs_only(validated.roots);
        }
        if let Some(identity) = validated.identity {
            builder = builder.identity(identity);
        }
        let client = builder
            .build()
            .map_err(|e| SinkError::rejected("cannot set up the HTTP client").with_source(e))?;
        Ok(Self {
            client,
            url: validated.url,
            origin: validated.origin,
            signer: validated.signer,
            static_headers: validated.headers,
            format: validated.format,
            max_concurrency: config.max_concurrency.get(),
            events_per_request: config.events_per_request.get(),
            timeout: config.timeout,
        })
    }

    /// The request headers and body of `event`, or why HTTP cannot carry them.
    fn request(&self, event: &Event) -> Result<(HeaderMap, Bytes), SinkError> {
        let mut headers = self.static_headers.clone();
        let plain = self.format.is_plain();
        let mut content_type = None;
        let mut invalid = None;
        let encoded = self
            .format
            .encode(event, &BINDING, |name, value| {
                if invalid.is_some() {
                    return;
                }
                // Plain: the message headers prefixed `outbox-`; CloudEvents: the binding's
                // names as they are (the `content-type` among them sets the content type).
                if !plain && name == "content-type" {
                    content_type = HeaderValue::from_bytes(value.as_bytes()).ok();
                    return;
                }
                let header_name = if plain {
                    HeaderName::from_bytes(format!("outbox-{name}").as_bytes())
                } else {
                    HeaderName::from_bytes(name.as_bytes())
                };
                match (
                    header_name,
                    // The UTF-8 bytes as they are (non-ASCII is legal "obs-text" in HTTP/1.1
                    // and in HTTP/2): an aggregate id `Zürich-1` arrives as those UTF-8 bytes,
                    // not dead-lettered. Only control characters (a line break) cannot be
                    // carried.
                    HeaderValue::from_bytes(value.as_bytes()),
                ) {
                    (Ok(n), Ok(v)) => {
                        if plain && name.eq_ignore_ascii_case("content-type") {
                            content_type = Some(v.clone());
                        }
                        headers.append(n, v);
                    }
                    (Err(_), _) => {
                        invalid = Some(format!(
                            "header name `{name}` is not a valid HTTP header name"
                        ));
                    }
                    (_, Err(_)) => {
                        invalid = Some(format!(
                            "header `{name}` has a value HTTP cannot carry (a control character)"
                        ));
                    }
                }
            })
            .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?;
        if let Some(reason) = invalid {
            return Err(SinkError::rejected(reason));
        }
        match content_type {
            Some(v) => {
                headers.insert(CONTENT_TYPE, v);
            }
            None => {
                if !headers.contains_key(CONTENT_TYPE) {
                    headers.insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static("application/octet-stream"),
                    );
                }
            }
        }
        self.sign(&mut headers, &event.id.to_string(), &encoded.body);
        Ok((headers, encoded.body))
    }

    /// With a `secret`: adds the Standard Webhooks headers for a request `id` with `body`.
    fn sign(&self, headers: &mut HeaderMap, id: &str, body: &[u8]) {
        let Some(signer) = &self.signer else {
            return;
        };
        let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
        let signature = signer.sign(id, timestamp, body);
        for (name, value) in [
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", timestamp.to_string()),
            ("webhook-signature", signature),
        ] {
            let value = HeaderValue::from_str(&value)
                .expect("ids, digits and base64 are valid header values");
            headers.insert(HeaderName::from_static(name), value);
        }
    }

    /// Delivers one event.
    async fn deliver(&self, event: &Event) -> Delivery {
        let url = render_url(&self.url, event).map_err(SinkError::rejected)?;
        let (headers, body) = self.request(event)?;
        self.post(url, headers, body).await
    }

    /// Sends one request; `Ok` on a 2xx answer.
    async fn post(&self, url: Url, headers: HeaderMap, body: Bytes) -> Delivery {
        let response = self
            .client
            .post(url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| self.request_error(&url, e))?;
        let status = response.status();
        if status.is_success() {
            read_prefix(response, DRAIN_BODY_BYTES).await;
            return Ok(());
        }
        let body = read_prefix(response, REASON_BODY_BYTES).await;
        Err(classify(status, &url, &body))
    }

    fn request_error(&self, url: &Url, e: reqwest::Error) -> SinkError {
        // reqwest's message names the URL with its query (`?token=...`): the redacted one is
        // in our own message already.
        let e = e.without_url();
        if e.is_connect() {
            SinkError::unavailable(format!("cannot connect to {}", redact(url))).with_source(e)
        } else if e.is_timeout() {
            SinkError::transient(format!(
                "no response from {} within {:?}",
                redact(url),
                self.timeout
            ))
            .with_source(e)
        } else {
            SinkError::transient(format!("request to {} failed", redact(url))).with_source(e)
        }
    }
}

/// The failure for a non-2xx response.
fn classify(status: StatusCode, url: &Url, body: &[u8]) -> SinkError {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut reason = format!("HTTP {status} from {}", redact(url));
    if !text.is_empty() {
        reason.push_str(": ");
        reason.push_str(text);
    }
    if status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || status.is_server_error()
    {
        SinkError::transient(reason)
    } else {
        if status.is_redirection() {
            reason.push_str(" (redirects are not followed: point sink.url at the final address)");
        }
        SinkError::rejected(reason)
    }
}

/// Reads at most `limit` bytes of the body (ignoring errors: the status already decided).
async fn read_prefix(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out.truncate(limit);
    out
}

/// The URL for messages, its password and secret query parameters masked.
fn redact(url: &Url) -> String {
    outbox_core::redact::redact_url(url.as_str())
}

/// Renders the URL template for `event`, percent-encoding the placeholder values so that an
/// `aggregate_id` such as `a/b c` stays one path segment.
fn render_url(template: &Destination, event: &Event) -> Result<Url, String> {
    let encoded = Event {
        aggregate_type: percent_encode(&event.aggregate_type),
        aggregate_id: percent_encode(&event.aggregate_id),
        event_type: percent_encode(&event.event_type),
        payload: bytes::Bytes::new(),
        headers: Vec::new(),
        ..*event
    };
    let text = template.render(&encoded);
    let url = Url::parse(&text).map_err(|e| format!("`{text}` is not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("`{text}` must use http or https"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("`{text}` has no host"));
    }
    Ok(url)
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl Sink for HttpSink {
    fn name(&self) -> &'static str {
        "http"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        if self.events_per_request > 1 {
            return crate::broker::collapse_unavailable(self.publish_batched(batch).await);
        }
        // Futures are lazy: collecting them starts nothing; `buffered` runs at most
        // `max_concurrency` at a time and yields results in input order.
        let requests: Vec<_> = batch.iter().map(|event| self.deliver(event)).collect();
        let deliveries: Vec<Delivery> = futures::stream::iter(requests)
            .buffered(self.max_concurrency)
            .collect()
            .await;
        crate::broker::collapse_unavailable(deliveries)
    }

    /// Reachable means the endpoint's host answers HTTP at all: any status counts, only a
    /// refused connection, a DNS failure or a timeout is an error.
    async fn healthcheck(&self) -> Result<(), SinkError> {
        match self.client.head(self.origin.clone()).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let what = if e.is_connect() {
                    "refused the connection or could not be resolved"
                } else if e.is_timeout() {
                    "did not answer in time"
                } else {
                    "did not answer HTTP"
                };
                Err(SinkError::unavailable(format!(
                    "webhook endpoint {} {what} (sink.url `{}`)",
                    redact(&self.origin),
                    outbox_core::redact::redact_url(self.url.template())
                ))
                .with_source(e.without_url()))
            }
        }
    }
}

crate::build_sink!(HttpConfig, "http", |config, event| format!(
    "HTTP POST {}",
    outbox_core::Destination::parse(&config.url)
        .map(|d| d.render(event))
        .unwrap_or_else(|_| config.url.clone())
));

#[cfg(test)]
mod tests {
    use super::*;

    fn event(aggregate_id: &str) -> Event {
        crate::broker::sample_event("Order", aggregate_id, "order.placed")
    }

    #[test]
    fn placeholder_values_are_percent_encoded() {
        let template =
            Destination::parse("http://h/x/{aggregate_type}/{aggregate_id}?t={event_type}")
                .expect("valid");
        let url = render_url(&template, &event("a/b c?d")).expect("valid");
        assert_eq!(
            url.as_str(),
            "http://h/x/Order/a%2Fb%20c%3Fd?t=order.placed"
        );
    }

    #[test]
    fn responses_map_to_kinds() {
        use outbox_core::SinkErrorKind::*;
        let url = Url::parse("http://h/x").expect("valid");
        let kind = |s: u16| classify(StatusCode::from_u16(s).expect("status"), &url, b"").kind();
        assert_eq!(kind(500), Transient);
        assert_eq!(kind(503), Transient);
        assert_eq!(kind(429), Transient);
        assert_eq!(kind(408), Transient);
        assert_eq!(kind(400), Rejected);
        assert_eq!(kind(404), Rejected);
        assert_eq!(kind(301), Rejected);
        let e = classify(StatusCode::BAD_REQUEST, &url, b"  missing field `total`\n");
        assert_eq!(
            e.to_string(),
            "HTTP 400 Bad Request from http://h/x: missing field `total`"
        );
    }

    #[test]
    fn passwords_in_urls_are_not_repeated() {
        let url = Url::parse("https://user:pa55@h/x").expect("valid");
        assert_eq!(redact(&url), "https://user:***@h/x");
    }
}
