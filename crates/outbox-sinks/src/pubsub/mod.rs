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
mod readback;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt as _;
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError};
use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;

use config::Target;
pub use config::{DEFAULT_API_URL, EMULATOR_HOST_ENV, PubSubConfig};
pub use readback::PubSubReadBack;

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

/// One event ready to go: its topic id and its message as JSON.
struct Prepared {
    index: usize,
    topic: String,
    json: String,
    /// Its size as a `messages` entry of the protobuf request.
    size: usize,
}

/// One publish request: messages (with their event's index) to one topic.
struct Request {
    topic: String,
    messages: Vec<(usize, String)>,
}

/// Why a publish request failed; `invalid` when Pub/Sub refused it as a whole as invalid
/// (HTTP 400), which says nothing about which message was at fault.
struct Failure {
    error: SinkError,
    invalid: bool,
}

impl From<SinkError> for Failure {
    fn from(error: SinkError) -> Self {
        Self {
            error,
            invalid: false,
        }
    }
}

/// The JSON of one message of the REST API.
#[derive(serde::Serialize)]
struct WireMessage<'a> {
    data: String,
    attributes: &'a BTreeMap<String, String>,
    #[serde(rename = "orderingKey")]
    ordering_key: &'a str,
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

    /// The message of `event`, or why Pub/Sub cannot take it.
    fn prepare(&self, index: usize, event: &Event) -> Result<Prepared, SinkError> {
        let topic = self.topic.render(event);
        if let Some(problem) = topic_name_problem(&topic) {
            return Err(SinkError::rejected(format!(
                "topic template `{}` renders to `{topic}` for this event, which is not a Pub/Sub \
                 topic id: {problem}",
                self.topic
            )));
        }
        let (attributes, data) = attributes(event, &self.format)?;
        if data.len() > self.max_payload {
            let whose = if self.max_payload < MAX_REQUEST_BYTES {
                "sink.max_payload"
            } else {
                "Pub/Sub's message limit"
            };
            return Err(SinkError::rejected(format!(
                "payload of {} bytes exceeds the limit of {} bytes ({whose})",
                data.len(),
                self.max_payload
            )));
        }
        let ordering_key =
            crate::cloud::ordering_key(&event.aggregate_id, MAX_ORDERING_KEY_BYTES, |c: char| {
                !c.is_control()
            });
        let mut size = field_len(data.len()) + field_len(ordering_key.len());
        for (name, value) in &attributes {
            size += field_len(field_len(name.len()) + field_len(value.len()));
        }
        let size = field_len(size);
        let request = field_len(self.topic_path(&topic).len()) + size;
        if request > MAX_REQUEST_BYTES {
            return Err(SinkError::rejected(format!(
                "message of {request} bytes (payload, attributes, ordering key) exceeds Pub/Sub's \
                 limit of {MAX_REQUEST_BYTES} bytes per publish request"
            )));
        }
        let json = serde_json::to_string(&WireMessage {
            data: base64::engine::general_purpose::STANDARD.encode(&data),
            attributes: &attributes,
            ordering_key: &ordering_key,
        })
        .map_err(|e| SinkError::rejected("cannot encode the message as JSON").with_source(e))?;
        Ok(Prepared {
            index,
            topic,
            json,
            size,
        })
    }

    /// The bearer token for Google, `None` for an emulator.
    async fn token(&self) -> Result<Option<Arc<gcp_auth::Token>>, SinkError> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        auth.token(&[SCOPE]).await.map(Some).map_err(|e| {
            SinkError::unavailable(format!(
                "cannot get an access token for {} from Application Default Credentials",
                self.place
            ))
            .with_source(e)
        })
    }

    /// A request to `url` with the access token, if any.
    async fn request(
        &self,
        method: reqwest::Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, SinkError> {
        let builder = self.client.request(method, url);
        Ok(match self.token().await? {
            // `bearer_auth` marks the header sensitive: it never shows in Debug output.
            Some(token) => builder.bearer_auth(token.as_str()),
            None => builder,
        })
    }

    /// Publishes the messages of one request; `Ok` once Pub/Sub returned an id for each.
    async fn post(&self, topic: &str, messages: &[(usize, String)]) -> Result<(), Failure> {
        let mut body =
            String::with_capacity(16 + messages.iter().map(|(_, m)| m.len() + 1).sum::<usize>());
        body.push_str("{\"messages\":[");
        for (i, (_, json)) in messages.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(json);
        }
        body.push_str("]}");
        let response = self
            .request(reqwest::Method::POST, &self.topic_url(topic, ":publish"))
            .await?
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error(e))?;
        let status = response.status();
        let answer = response
            .bytes()
            .await
            .map_err(|e| self.transport_error(e))?;
        if !status.is_success() {
            return Err(Failure {
                error: classify(status, &answer, &self.topic_path(topic), &self.place),
                invalid: status == StatusCode::BAD_REQUEST,
            });
        }
        #[derive(serde::Deserialize)]
        struct Published {
            #[serde(rename = "messageIds", default)]
            message_ids: Vec<String>,
        }
        match serde_json::from_slice::<Published>(&answer) {
            Ok(published) if published.message_ids.len() == messages.len() => Ok(()),
            Ok(published) => Err(SinkError::transient(format!(
                "{} answered {} message ids for {} messages published to `{}`",
                self.place,
                published.message_ids.len(),
                messages.len(),
                self.topic_path(topic)
            ))
            .into()),
            Err(e) => Err(SinkError::transient(format!(
                "{} answered the publish to `{}` with something else than message ids: {}",
                self.place,
                self.topic_path(topic),
                snippet(&answer)
            ))
            .with_source(e)
            .into()),
        }
    }

    /// Sends one request; on an invalid-request refusal of several messages, sends each alone
    /// so that only the offending ones are rejected (a refused request published nothing).
    async fn send(&self, request: Request) -> Vec<(usize, Delivery)> {
        match self.post(&request.topic, &request.messages).await {
            Ok(()) => request.messages.iter().map(|(i, _)| (*i, Ok(()))).collect(),
            Err(failure) if failure.invalid && request.messages.len() > 1 => {
                tracing::debug!(
                    topic = %request.topic,
                    messages = request.messages.len(),
                    error = %failure.error.report(),
                    "Pub/Sub refused a request as invalid; sending its messages one by one"
                );
                let topic = request.topic.as_str();
                futures::stream::iter(request.messages.into_iter().map(|message| async move {
                    let result = self.post(topic, std::slice::from_ref(&message)).await;
                    (message.0, result.map_err(|f| f.error))
                }))
                .buffer_unordered(self.max_concurrency)
                .collect()
                .await
            }
            Err(failure) => request
                .messages
                .iter()
                .map(|(i, _)| (*i, Err(failure.error.clone())))
                .collect(),
        }
    }

    /// A request that got no HTTP answer: the service is unreachable (or the answer was lost).
    fn transport_error(&self, e: reqwest::Error) -> SinkError {
        let text = if e.is_connect() {
            format!("cannot connect to {}", self.place)
        } else if e.is_timeout() {
            format!("no answer from {} within {:?}", self.place, self.timeout)
        } else {
            format!("lost the connection to {}", self.place)
        };
        SinkError::unavailable(text).with_source(e)
    }
}

/// The attributes (the message headers) and data of `event`'s message in `format`, or the
/// limit one breaks.
fn attributes(
    event: &Event,
    format: &MessageFormat,
) -> Result<(BTreeMap<String, String>, Bytes), SinkError> {
    let mut attributes = BTreeMap::new();
    let mut count = 0;
    let mut problem: Option<String> = None;
    let encoded = format.encode(event, &BINDING, |name, value| {
        count += 1;
        if problem.is_some() {
            return;
        }
        problem = if name.is_empty() {
            Some("a header with an empty name cannot be a Pub/Sub attribute".to_owned())
        } else if name.len() > MAX_ATTRIBUTE_KEY_BYTES {
            Some(format!(
                "header name `{}` of {} bytes exceeds Pub/Sub's limit of \
                 {MAX_ATTRIBUTE_KEY_BYTES} bytes per attribute key",
                shorten(name),
                name.len()
            ))
        } else if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
            Some(format!(
                "header `{}` of {} bytes exceeds Pub/Sub's limit of \
                 {MAX_ATTRIBUTE_VALUE_BYTES} bytes per attribute value",
                shorten(name),
                value.len()
            ))
        } else if name.starts_with("goog") {
            Some(format!(
                "header `{}` cannot be a Pub/Sub attribute: keys starting with `goog` are \
                 reserved (a Pub/Sub limit)",
                shorten(name)
            ))
        } else {
            None
        };
        if problem.is_none() {
            // `for_each_header` already drops row headers named like contract headers; a
            // row header named twice would lose one value in the attribute map.
            if let Some(first) = attributes.insert(name.to_owned(), value.to_owned())
                && first != value
            {
                problem = Some(format!(
                    "header `{}` appears twice with different values; Pub/Sub attributes \
                     are a map with one value per key",
                    shorten(name)
                ));
            }
        }
    });
    let data = encoded
        .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?
        .body;
    if let Some(problem) = problem {
        return Err(SinkError::rejected(problem));
    }
    if count > MAX_ATTRIBUTES {
        return Err(SinkError::rejected(format!(
            "{count} headers (the 4 contract headers included) exceed Pub/Sub's limit of \
             {MAX_ATTRIBUTES} attributes per message"
        )));
    }
    Ok((attributes, data))
}

/// Why `name` is not a Pub/Sub topic id, or `None` when it is one.
pub(crate) fn topic_name_problem(name: &str) -> Option<String> {
    let length = name.chars().count();
    if !(3..=255).contains(&length) {
        return Some(format!(
            "it must have 3 to 255 characters, not {length} (a Pub/Sub limit)"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Some("it must start with a letter".to_owned());
    }
    if name.starts_with("goog") {
        return Some("it must not start with `goog`".to_owned());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '%' | '+')))
    {
        return Some(format!(
            "`{}` is not allowed (letters, digits and `-._~%+` only)",
            c.escape_default()
        ));
    }
    None
}

/// The size of a length-delimited protobuf field (1-byte tag) of `len` bytes.
fn field_len(len: usize) -> usize {
    let mut varint = 1;
    let mut rest = len >> 7;
    while rest > 0 {
        varint += 1;
        rest >>= 7;
    }
    1 + varint + len
}

/// At most 60 characters of `text`, for messages.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// The start of an answer body as text, for messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(REASON_BYTES)]);
    text.trim().to_owned()
}

/// `HTTP 404 NOT_FOUND: Topic not found` from an error answer of the REST API.
fn describe_error(status: StatusCode, body: &[u8]) -> (String, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Answer {
        error: Detail,
    }
    #[derive(serde::Deserialize)]
    struct Detail {
        #[serde(default)]
        message: String,
        #[serde(default)]
        status: Option<String>,
    }
    match serde_json::from_slice::<Answer>(body) {
        Ok(Answer { error }) => {
            let code = error.status.clone().unwrap_or_default();
            let mut text = format!("HTTP {}", status.as_u16());
            if !code.is_empty() {
                text.push(' ');
                text.push_str(&code);
            }
            if !error.message.is_empty() {
                text.push_str(": ");
                text.push_str(&shorten_bytes(&error.message, REASON_BYTES));
            }
            (text, error.status)
        }
        Err(_) => {
            let body = snippet(body);
            if body.is_empty() {
                (format!("HTTP {status}"), None)
            } else {
                (format!("HTTP {status}: {body}"), None)
            }
        }
    }
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn shorten_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The failure for an error answer to a publish to `topic_path`.
fn classify(status: StatusCode, body: &[u8], topic_path: &str, place: &str) -> SinkError {
    let (text, code) = describe_error(status, body);
    let retryable_code = matches!(
        code.as_deref(),
        Some(
            "UNAVAILABLE"
                | "RESOURCE_EXHAUSTED"
                | "ABORTED"
                | "INTERNAL"
                | "DEADLINE_EXCEEDED"
                | "CANCELLED"
        )
    );
    if status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || status.is_server_error()
        || retryable_code
    {
        SinkError::transient(format!(
            "{place} could not take the publish to `{topic_path}` now ({text})"
        ))
    } else if status == StatusCode::UNAUTHORIZED {
        SinkError::unavailable(format!(
            "{place} refused the credentials ({text}); check the Application Default \
             Credentials (GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default \
             login`, or the service account of the machine)"
        ))
    } else if status == StatusCode::FORBIDDEN {
        SinkError::unavailable(format!(
            "{place} denied the publish to `{topic_path}` ({text}); the account needs \
             `pubsub.topics.publish` on the topic (role roles/pubsub.publisher)"
        ))
    } else if status == StatusCode::NOT_FOUND {
        SinkError::rejected(format!(
            "topic `{topic_path}` not found on {place} ({text}); create the topic (and its \
             subscriptions) first"
        ))
    } else {
        SinkError::rejected(format!(
            "{place} refused the publish to `{topic_path}` ({text})"
        ))
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
        let deliveries = deliveries
            .into_iter()
            .map(|d| d.unwrap_or_else(|| Err(SinkError::transient("event was not attempted"))))
            .collect();
        crate::collapse_unavailable(deliveries)
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
