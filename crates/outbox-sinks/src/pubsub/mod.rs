//! Google Cloud Pub/Sub sink (feature `pubsub`), over Pub/Sub's REST API.
//!
//! Each event becomes one Pub/Sub message, published with
//! `POST {base}/v1/projects/{project}/topics/{topic}:publish`:
//!
//! | part | value |
//! | --- | --- |
//! | topic | `projects/<project>/topics/<topic>`, the `topic` template rendered for the event |
//! | `data` | the payload bytes exactly (base64 in the JSON body, as the REST API wants) |
//! | `attributes` | `id` (the event id), `event_type`, `aggregate_type`, `aggregate_id`, then the row's own headers, names unchanged |
//! | `orderingKey` | `aggregate_id` when it is a legal key (1 to 1024 bytes, no control character, not starting with `sha256:`), else `sha256:<hex>` of it |
//!
//! With `format = "cloudevents-binary"` the attributes are the CloudEvents attributes instead
//! (`ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-subject`, `ce-time`,
//! `content-type` = `datacontenttype`, the extensions as `ce-<name>`, values as they are) and
//! `data` stays the payload; with `"cloudevents-structured"` the one attribute is
//! `content-type: application/cloudevents+json` and `data` is the JSON envelope, per the
//! draft CloudEvents Pub/Sub binding ([`BINDING`]). The limits below apply to these as well.
//!
//! Pub/Sub does not deduplicate on publish: a republished event (after a relay crash or an
//! unanswered request) is a second message with the same `id` attribute. Consumers
//! deduplicate by `id` (the inbox does).
//!
//! A batch is grouped by topic, one request per topic and per 1000 messages or 10 MB; the
//! requests run concurrently (at most `max_concurrency`) and every message id Pub/Sub
//! returns acknowledges its event. A request is all or nothing: if Pub/Sub refuses one as
//! invalid (HTTP 400), its messages are sent again one per request, so that only the
//! offending event is rejected.
//!
//! Pub/Sub's limits are checked before sending; an event over one is rejected (dead-lettered)
//! with a reason naming the limit, and the rest of its batch still flows:
//!
//! | limit | value |
//! | --- | --- |
//! | one publish request (data, attributes, ordering key and protobuf framing) | 10 MB (10,000,000 bytes), so also one message |
//! | payload | `max_payload` when set |
//! | attributes per message | 100 (the 4 contract headers included) |
//! | attribute key / value | 256 / 1024 bytes; a key must not be empty or start with `goog`; a header name may appear only once |
//! | topic id | 3 to 255 characters, starts with a letter, letters, digits and `-._~%+` only, not starting with `goog` |
//!
//! | failure | kind |
//! | --- | --- |
//! | connection refused, DNS failure, no answer within `timeout`, connection lost | `Unavailable` (the whole batch when every request failed so) |
//! | no access token from Application Default Credentials; HTTP 401 or 403 | `Unavailable`, with what to fix (nothing is dead-lettered over credentials) |
//! | HTTP 408, 429, 5xx, or a gRPC status `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`, `DEADLINE_EXCEEDED` | `Transient` (retried with backoff) |
//! | HTTP 404 (topic or project not found), 400 and any other 4xx | `Rejected`, naming the topic |
//! | over a limit above, an illegal topic id | `Rejected`, before sending |
//!
//! Ordering: the relay never passes two events of one aggregate in one `publish` call, and
//! retries a failed event before it hands over the later events of its aggregate. Each REST
//! publish is therefore independent, and nothing has to be "resumed" after a failure (the
//! client libraries pause an ordering key after a failed publish because they pipeline
//! several messages of one key; this sink never does).

mod config;
mod message;
mod readback;
mod rest;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError};
use reqwest::StatusCode;

use config::Target;
pub use config::{DEFAULT_API_URL, EMULATOR_HOST_ENV, PubSubConfig};
use message::{Prepared, field_len, topic_name_problem};
pub use readback::PubSubReadBack;
use rest::{Request, describe_error};

/// The draft CloudEvents Pub/Sub binding: every attribute in a message attribute prefixed
/// `ce-`, values as they are; `datacontenttype`, and structured mode's
/// `application/cloudevents+json`, in the attribute `content-type`.
pub const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: Some("content-type"),
    structured_content_type: Some("content-type"),
    percent_encode: false,
};

/// Pub/Sub's limit on one publish request, and so on one message: 10 MB.
pub const MAX_REQUEST_BYTES: usize = 10_000_000;
/// Pub/Sub's limit on the messages of one publish request.
pub const MAX_MESSAGES_PER_REQUEST: usize = 1000;
/// Pub/Sub's limit on the attributes of one message.
pub const MAX_ATTRIBUTES: usize = 100;
/// Pub/Sub's limit on an attribute key, in bytes.
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 256;
/// Pub/Sub's limit on an attribute value, in bytes.
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;
/// Pub/Sub's limit on an ordering key, in bytes.
pub const MAX_ORDERING_KEY_BYTES: usize = 1024;
/// The OAuth scope the sink asks Application Default Credentials for.
pub const SCOPE: &str = "https://www.googleapis.com/auth/pubsub";

/// How much of an error answer goes into a failure reason.
const REASON_BYTES: usize = 300;

/// Publishes events to Google Cloud Pub/Sub topics; built from a [`PubSubConfig`].
pub struct PubSubSink {
    client: reqwest::Client,
    /// `http://host:port` (an emulator) or `https://pubsub.googleapis.com`, no trailing `/`.
    base: String,
    /// The service in messages: `Pub/Sub emulator at 127.0.0.1:8085`.
    place: String,
    project: String,
    topic: Destination,
    /// Application Default Credentials (Google), `None` for an emulator.
    auth: Option<Arc<dyn gcp_auth::TokenProvider>>,
    timeout: Duration,
    max_concurrency: usize,
    max_payload: usize,
    format: MessageFormat,
}

impl fmt::Debug for PubSubSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubSink")
            .field("place", &self.place)
            .field("project", &self.project)
            .field("topic", &self.topic.template())
            .field("authenticated", &self.auth.is_some())
            .field("timeout", &self.timeout)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl PubSubSink {
    async fn new(config: PubSubConfig, target: Target) -> Result<Self, SinkError> {
        let format = config
            .message_format()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let (base, place, auth) = match target {
            Target::Emulator { host, from_env } => {
                let place = if from_env {
                    format!("Pub/Sub emulator at {host} (from {EMULATOR_HOST_ENV})")
                } else {
                    format!("Pub/Sub emulator at {host}")
                };
                (format!("http://{host}"), place, None)
            }
            Target::Google { base } => {
                let place = format!("Pub/Sub at {}", outbox_core::redact::redact_url(&base));
                let provider = gcp_auth::provider().await.map_err(|e| {
                    SinkError::rejected(format!(
                        "no Google credentials found for {place} (Application Default \
                         Credentials: set GOOGLE_APPLICATION_CREDENTIALS to a key file, run \
                         `gcloud auth application-default login`, or run on Google Cloud); for \
                         an emulator set sink.endpoint or {EMULATOR_HOST_ENV}"
                    ))
                    .with_source(e)
                })?;
                (base, place, Some(provider))
            }
        };
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("outbox/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| SinkError::rejected("cannot set up the HTTP client").with_source(e))?;
        Ok(Self {
            client,
            base,
            place,
            project: config.project.trim().to_owned(),
            topic: config.topic,
            auth,
            timeout: config.timeout,
            max_concurrency: config.max_concurrency.get(),
            max_payload: config
                .max_payload
                .map_or(MAX_REQUEST_BYTES, std::num::NonZeroUsize::get),
            format,
        })
    }

    /// The largest payload this sink sends, in bytes.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// Where the sink publishes, for people: `Pub/Sub emulator at 127.0.0.1:8085`.
    pub fn place(&self) -> &str {
        &self.place
    }

    /// `projects/<project>/topics/<topic>`.
    fn topic_path(&self, topic: &str) -> String {
        format!("projects/{}/topics/{topic}", self.project)
    }

    /// The URL of `projects/<project>/topics/<topic>` plus `suffix`.
    fn topic_url(&self, topic: &str, suffix: &str) -> String {
        // `%` is legal in a topic id and must not start an escape in the URL path.
        format!(
            "{}/v1/projects/{}/topics/{}{suffix}",
            self.base,
            self.project,
            topic.replace('%', "%25")
        )
    }
}

impl Sink for PubSubSink {
    fn name(&self) -> &'static str {
        "pubsub"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let mut deliveries: Vec<Option<Delivery>> = vec![None; batch.len()];
        // Topics in first-use order, each with its messages in input order.
        let mut topics: Vec<(String, Vec<Prepared>)> = Vec::new();
        for (index, event) in batch.iter().enumerate() {
            match self.prepare(index, event) {
                Err(e) => deliveries[index] = Some(Err(e)),
                Ok(prepared) => match topics.iter_mut().find(|(t, _)| *t == prepared.topic) {
                    Some((_, messages)) => messages.push(prepared),
                    None => topics.push((prepared.topic.clone(), vec![prepared])),
                },
            }
        }
        let mut requests: Vec<Request> = Vec::new();
        for (topic, messages) in topics {
            let overhead = field_len(self.topic_path(&topic).len());
            let mut current = Request {
                topic: topic.clone(),
                messages: Vec::new(),
            };
            let mut bytes = overhead;
            for prepared in messages {
                if !current.messages.is_empty()
                    && (current.messages.len() == MAX_MESSAGES_PER_REQUEST
                        || bytes + prepared.size > MAX_REQUEST_BYTES)
                {
                    requests.push(std::mem::replace(
                        &mut current,
                        Request {
                            topic: topic.clone(),
                            messages: Vec::new(),
                        },
                    ));
                    bytes = overhead;
                }
                bytes += prepared.size;
                current.messages.push((prepared.index, prepared.json));
            }
            if !current.messages.is_empty() {
                requests.push(current);
            }
        }

        let results: Vec<Vec<(usize, Delivery)>> =
            futures::stream::iter(requests.into_iter().map(|r| self.send(r)))
                .buffer_unordered(self.max_concurrency)
                .collect()
                .await;
        for (index, delivery) in results.into_iter().flatten() {
            deliveries[index] = Some(delivery);
        }
        crate::broker::collapse_decided(deliveries, "event was not attempted")
    }

    /// Reads the topic (a fixed `topic`) or lists one topic of the project (a template).
    /// Reachable and authenticated is healthy even when the account may not read topics
    /// (HTTP 403): `roles/pubsub.publisher` may publish but not read topic metadata.
    async fn healthcheck(&self) -> Result<(), SinkError> {
        let (url, what) = if self.topic.is_fixed() {
            let topic = self.topic.template();
            (
                self.topic_url(topic, ""),
                format!("topic `{}`", self.topic_path(topic)),
            )
        } else {
            (
                format!(
                    "{}/v1/projects/{}/topics?pageSize=1",
                    self.base, self.project
                ),
                format!("the topics of project `{}`", self.project),
            )
        };
        let response = self
            .request(reqwest::Method::GET, &url)
            .await?
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let body = response.bytes().await.unwrap_or_default();
        let (text, _) = describe_error(status, &body);
        match status {
            StatusCode::FORBIDDEN => {
                tracing::debug!(%text, "Pub/Sub healthcheck: may not read {what}; reachable and authenticated");
                Ok(())
            }
            StatusCode::UNAUTHORIZED => Err(SinkError::unavailable(format!(
                "{} refused the credentials ({text})",
                self.place
            ))),
            StatusCode::NOT_FOUND => Err(SinkError::transient(format!(
                "{what} does not exist on {} ({text})",
                self.place
            ))),
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                Err(SinkError::unavailable(format!(
                    "{} cannot answer for {what} now ({text})",
                    self.place
                )))
            }
            _ => Err(SinkError::transient(format!(
                "{} refused to read {what} ({text})",
                self.place
            ))),
        }
    }
}

crate::build_sink!(PubSubConfig, "pubsub", |config, event| format!(
    "Pub/Sub topic projects/{}/topics/{}",
    config.project.trim(),
    config.topic.render(event)
), message_limit: |c| c.max_payload.map_or(MAX_REQUEST_BYTES, std::num::NonZeroUsize::get), destination: topic, read_back: readback::read_back);

#[cfg(test)]
mod tests;
