//! NATS JetStream sink (feature `nats`).
//!
//! Each event becomes one JetStream message:
//!
//! | part | value |
//! | --- | --- |
//! | subject | the `destination` template rendered for the event |
//! | headers | `id`, `event_type`, `aggregate_type`, `aggregate_id`, the row's own headers, and `Nats-Msg-Id` = event id |
//! | body | the payload bytes exactly |
//!
//! With `format = "cloudevents-binary"` the headers are the CloudEvents attributes instead,
//! per the NATS binding (1.0.3): `ce-specversion`, `ce-id`, `ce-source`, `ce-type`,
//! `ce-subject`, `ce-time`, `ce-datacontenttype`, the extensions as `ce-<name>`, values
//! percent-encoded ([`BINDING`]); with `"cloudevents-structured"` the body is the JSON
//! envelope and the one header `Content-Type: application/cloudevents+json`. `Nats-Msg-Id`
//! is sent in every format.
//!
//! `Nats-Msg-Id` lets JetStream drop a republished event (after a relay crash) within the
//! stream's duplicate window; consumers still deduplicate by `id` beyond it.
//!
//! A batch is sent without waiting in between, then all acknowledgements are awaited
//! together, so a batch costs about one round trip. An event counts as delivered only once
//! JetStream acknowledged storing it.
//!
//! | failure | kind |
//! | --- | --- |
//! | not connected, acknowledgement timed out, connection lost mid-batch | `Unavailable` (the whole batch, when every event is affected) |
//! | message larger than the server's `max_payload` (or the configured one) | `Rejected`, naming the size and the limit |
//! | message larger than the stream's `max_msg_size` | `Rejected` |
//! | rendered subject is not a valid subject, header cannot be carried | `Rejected` |
//! | no stream captures the subject, any other JetStream error | `Transient` |

mod config;
mod readback;
mod scratch;
mod subject;

use std::fmt;
use std::num::NonZeroUsize;
use std::str::FromStr;

use async_nats::connection::State;
use async_nats::jetstream::context::{
    CreateStreamErrorKind, GetStreamByNameErrorKind, GetStreamErrorKind, PublishAckFuture,
    PublishError, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{ConnectErrorKind, HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures::future::join_all;
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError};

pub use config::NatsConfig;
pub use readback::NatsReadBack;

/// The CloudEvents NATS protocol binding (version 1.0.3; 1.0.2 and older knew only the
/// structured mode, from before NATS 2.2 had headers): every attribute, `datacontenttype`
/// included, in a header prefixed `ce-`, its value percent-encoded as in the HTTP binding;
/// structured mode as `Content-Type: application/cloudevents+json`.
pub const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: Some("ce-datacontenttype"),
    structured_content_type: Some("Content-Type"),
    percent_encode: true,
};

/// Publishes events to NATS JetStream; built from a [`NatsConfig`].
pub struct NatsSink {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    destination: Destination,
    stream: String,
    url: String,
    max_payload: Option<NonZeroUsize>,
    format: MessageFormat,
}

/// The server URLs without their user info, and the user and password of the first that has
/// them (percent-decoded).
fn split_credentials(servers: &[String]) -> (Vec<String>, Option<(String, String)>) {
    let mut credentials = None;
    let stripped = servers
        .iter()
        .map(|server| match url::Url::parse(server) {
            Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
                let decode = |s: &str| {
                    percent_encoding::percent_decode_str(s)
                        .decode_utf8_lossy()
                        .into_owned()
                };
                credentials.get_or_insert_with(|| {
                    (
                        decode(parsed.username()),
                        decode(parsed.password().unwrap_or_default()),
                    )
                });
                let _ = parsed.set_username("");
                let _ = parsed.set_password(None);
                parsed.to_string().trim_end_matches('/').to_owned()
            }
            _ => server.clone(),
        })
        .collect();
    (stripped, credentials)
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("url", &self.url)
            .field("destination", &self.destination.template())
            .field("stream", &self.stream)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl NatsSink {
    /// The name of the stream events land in: an existing stream that covered the subjects
    /// when the sink was built, or the one it created.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    async fn connect(config: NatsConfig) -> Result<Self, SinkError> {
        let format = config
            .message_format()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let (client, jetstream, url) = connect_client(&config).await?;
        let subjects = config
            .resolved_stream_subjects()
            .ok_or_else(|| SinkError::rejected("sink.stream_subjects: cannot be derived"))?;
        let stream = find_or_create_stream(&jetstream, &config, &subjects, &url).await?;
        tracing::info!(%url, %stream, destination = %config.destination, "NATS JetStream sink ready");
        Ok(Self {
            client,
            jetstream,
            destination: config.destination,
            stream,
            url,
            max_payload: config.max_payload,
            format,
        })
    }

    fn ensure_connected(&self) -> Result<(), SinkError> {
        match self.client.connection_state() {
            State::Connected => Ok(()),
            state => Err(SinkError::unavailable(format!(
                "NATS connection to {} is {state}",
                self.url
            ))),
        }
    }

    /// The subject, headers and body of `event`'s message, or why it can never be sent.
    fn prepare(&self, event: &Event) -> Result<(String, HeaderMap, Bytes), SinkError> {
        let subject = self.destination.render(event);
        if let Some(problem) = subject::publish_subject_problem(&subject) {
            return Err(SinkError::rejected(format!(
                "subject `{subject}` (destination `{}`) {problem}",
                self.destination
            )));
        }

        let mut headers = HeaderMap::new();
        let mut headers_len = 0;
        let mut invalid = None;
        let encoded = self.format.encode(event, &BINDING, |name, value| {
            if invalid.is_some() {
                return;
            }
            match (HeaderName::from_str(name), HeaderValue::from_str(value)) {
                (Ok(n), Ok(v)) => {
                    headers_len += name.len() + value.len() + 4; // "name: value\r\n"
                    headers.append(n, v);
                }
                (Err(_), _) => {
                    invalid = Some(format!(
                        "header name `{name}` cannot be carried by NATS (control character, \
                         non-ASCII or `:`)"
                    ));
                }
                (_, Err(_)) => {
                    invalid = Some(format!(
                        "header `{name}` has a value NATS cannot carry (a line break)"
                    ));
                }
            }
        });
        let body = encoded
            .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?
            .body;
        if let Some(reason) = invalid {
            return Err(SinkError::rejected(reason));
        }
        let id = event.id.to_string();
        headers_len += "Nats-Msg-Id".len() + id.len() + 4;
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        headers_len += "NATS/1.0\r\n\r\n".len();

        let server_limit = self.client.server_info().max_payload;
        let limit = match self.max_payload {
            Some(configured) if server_limit == 0 => configured.get(),
            Some(configured) => configured.get().min(server_limit),
            None => server_limit,
        };
        let size = body.len() + headers_len;
        if limit > 0 && size > limit {
            return Err(SinkError::rejected(format!(
                "message of {size} bytes (payload {} + headers {headers_len}) exceeds the \
                 limit of {limit} bytes (server max_payload {server_limit})",
                body.len()
            )));
        }
        Ok((subject, headers, body))
    }
}

/// Connects with the config's credentials (never inside the server URLs: the client logs its
/// server addresses at debug level). Returns the client, its JetStream context and the
/// redacted URL for messages.
async fn connect_client(
    config: &NatsConfig,
) -> Result<(async_nats::Client, jetstream::Context, String), SinkError> {
    let (servers, user_password) = split_credentials(&config.servers());
    let url = outbox_core::redact::redact_url(&config.url);
    let mut options = async_nats::ConnectOptions::new()
        .name("outbox-relay")
        .connection_timeout(config.connect_timeout);
    if let Some((user, password)) = user_password {
        options = options.user_and_password(user, password);
    }
    if let Some(token) = &config.token {
        options = options.token(token.expose().to_owned());
    }
    if let Some(path) = &config.credentials {
        options = options.credentials_file(path).await.map_err(|e| {
            SinkError::rejected(format!(
                "cannot read NATS credentials file `{}`",
                path.display()
            ))
            .with_source(e)
        })?;
    }
    if let Some(seed) = &config.nkey_seed {
        // Checked here too (not only in `validate`): async-nats logs an error of its own and
        // says only "authentication" for a seed it cannot read.
        config::user_key_pair(seed).map_err(|e| SinkError::rejected(e.to_string()))?;
        options = options.nkey(seed.expose().trim().to_owned());
    }
    crate::tls::choose_crypto_provider();
    if let Some(ca) = &config.tls_ca {
        options = options.add_root_certificates(ca.clone()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    let client = options.connect(servers.as_slice()).await.map_err(|e| {
        let message = format!("cannot connect to NATS at {url}");
        match e.kind() {
            ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
                SinkError::rejected(format!("{message}: credentials refused")).with_source(e)
            }
            ConnectErrorKind::ServerParse | ConnectErrorKind::Tls => {
                SinkError::rejected(message).with_source(e)
            }
            _ => SinkError::unavailable(message).with_source(e),
        }
    })?;
    let jetstream = jetstream::ContextBuilder::new()
        .timeout(config.ack_timeout)
        .build(client.clone());
    Ok((client, jetstream, url))
}

/// `outbox doctor`'s check: connects and looks the stream up, creating nothing.
async fn check(config: &NatsConfig) -> Result<String, SinkError> {
    config
        .validate()
        .map_err(|e| SinkError::rejected(e.to_string()))?;
    let (_client, js, url) = connect_client(config).await?;
    let subjects = config
        .resolved_stream_subjects()
        .ok_or_else(|| SinkError::rejected("sink.stream_subjects: cannot be derived"))?;
    for subject in &subjects {
        match js.stream_by_subject(subject.as_str()).await {
            Ok(name) => {
                return Ok(format!(
                    "nats sink reachable at {url}; stream `{name}` captures `{subject}`"
                ));
            }
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {}
            Err(e) => {
                return Err(SinkError::unavailable(format!(
                    "cannot look up the JetStream stream for `{subject}` on {url}"
                ))
                .with_source(e));
            }
        }
    }
    Ok(format!(
        "nats sink reachable at {url}; no stream captures {subjects:?} yet: the relay creates `{}` at start",
        config.stream
    ))
}

/// Uses the stream that already captures `subjects`, or creates `config.stream`.
async fn find_or_create_stream(
    js: &jetstream::Context,
    config: &NatsConfig,
    subjects: &[String],
    url: &str,
) -> Result<String, SinkError> {
    for subject in subjects {
        match js.stream_by_subject(subject.as_str()).await {
            Ok(name) => {
                if name != config.stream {
                    tracing::info!(stream = %name, %subject, "using the existing stream that captures the subjects");
                }
                return Ok(name);
            }
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {}
            Err(e) => {
                return Err(SinkError::unavailable(format!(
                    "cannot look up the JetStream stream for `{subject}` on {url}"
                ))
                .with_source(e));
            }
        }
    }

    let stream_config = jetstream::stream::Config {
        name: config.stream.clone(),
        subjects: subjects.to_vec(),
        duplicate_window: config.duplicate_window,
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    match js.create_stream(stream_config).await {
        Ok(_) => {
            tracing::info!(stream = %config.stream, ?subjects, "created JetStream stream");
            Ok(config.stream.clone())
        }
        Err(e) => Err(match e.kind() {
            CreateStreamErrorKind::JetStreamUnavailable => SinkError::rejected(format!(
                "JetStream is not enabled on {url} (start nats-server with -js)"
            )),
            CreateStreamErrorKind::TimedOut => SinkError::unavailable(format!(
                "creating JetStream stream `{}` on {url} timed out",
                config.stream
            )),
            CreateStreamErrorKind::JetStream(js_err)
                if js_err.error_code() == ErrorCode::STREAM_NAME_EXIST =>
            {
                SinkError::rejected(format!(
                    "JetStream stream `{}` already exists on {url} but does not capture \
                     {subjects:?}: add the subjects to it, or set sink.stream or \
                     sink.stream_subjects",
                    config.stream
                ))
            }
            _ => SinkError::rejected(format!(
                "cannot create JetStream stream `{}` with subjects {subjects:?} on {url}",
                config.stream
            ))
            .with_source(e),
        }),
    }
}

/// Maps a failure to hand a message to the client (before any acknowledgement).
fn send_error(subject: &str, e: PublishError) -> SinkError {
    match e.kind() {
        PublishErrorKind::MaxPayloadExceeded => SinkError::rejected(format!(
            "message to `{subject}` exceeds the server's max_payload"
        ))
        .with_source(e),
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
            SinkError::unavailable(format!("could not hand the message to `{subject}` to NATS"))
                .with_source(e)
        }
        PublishErrorKind::Other if is_subject_error(&e) => {
            SinkError::rejected(format!("`{subject}` is not a valid NATS subject")).with_source(e)
        }
        _ => SinkError::transient(format!("publishing to `{subject}` failed")).with_source(e),
    }
}

/// Maps a failed JetStream acknowledgement.
fn ack_error(subject: &str, e: PublishError) -> SinkError {
    match e.kind() {
        PublishErrorKind::TimedOut => SinkError::unavailable(format!(
            "no JetStream acknowledgement for `{subject}` in time"
        ))
        .with_source(e),
        PublishErrorKind::BrokenPipe => SinkError::unavailable(format!(
            "the NATS connection closed before `{subject}` was acknowledged"
        ))
        .with_source(e),
        PublishErrorKind::StreamNotFound => {
            SinkError::transient(format!("no JetStream stream captures subject `{subject}`"))
                .with_source(e)
        }
        PublishErrorKind::MaxPayloadExceeded => SinkError::rejected(format!(
            "message to `{subject}` exceeds the server's max_payload"
        ))
        .with_source(e),
        _ if jetstream_code(&e) == Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
            SinkError::rejected(format!(
                "message to `{subject}` is larger than the stream's max_msg_size"
            ))
            .with_source(e)
        }
        _ => SinkError::transient(format!("JetStream refused the message to `{subject}`"))
            .with_source(e),
    }
}

fn jetstream_code(e: &PublishError) -> Option<ErrorCode> {
    let source = std::error::Error::source(e)?;
    source
        .downcast_ref::<jetstream::Error>()
        .map(jetstream::Error::error_code)
}

fn is_subject_error(e: &PublishError) -> bool {
    std::error::Error::source(e)
        .is_some_and(|s| s.downcast_ref::<async_nats::SubjectError>().is_some())
}

/// One event of a batch on its way: refused before sending, or waiting for its ack.
enum InFlight {
    Refused(SinkError),
    Sent(String, PublishAckFuture),
}

impl Sink for NatsSink {
    fn name(&self) -> &'static str {
        "nats"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        self.ensure_connected()?;

        let mut in_flight = Vec::with_capacity(batch.len());
        for event in batch {
            let item = match self.prepare(event) {
                Err(e) => InFlight::Refused(e),
                Ok((subject, headers, body)) => {
                    let publish = PublishMessage::build().payload(body).headers(headers);
                    match self.jetstream.send_publish(subject.clone(), publish).await {
                        Ok(ack) => InFlight::Sent(subject, ack),
                        Err(e) => InFlight::Refused(send_error(&subject, e)),
                    }
                }
            };
            in_flight.push(item);
        }

        let deliveries = join_all(in_flight.into_iter().map(|item| async move {
            match item {
                InFlight::Refused(e) => Err(e),
                InFlight::Sent(subject, ack) => match ack.await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(ack_error(&subject, e)),
                },
            }
        }))
        .await;
        crate::broker::collapse_unavailable(deliveries)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.ensure_connected()?;
        match self.jetstream.get_stream(&self.stream).await {
            Ok(_) => Ok(()),
            Err(e) => Err(match e.kind() {
                GetStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    SinkError::transient(format!(
                        "JetStream stream `{}` does not exist on {} (deleted after the sink \
                         was built?)",
                        self.stream, self.url
                    ))
                }
                _ => SinkError::unavailable(format!(
                    "cannot read JetStream stream `{}` on {}",
                    self.stream, self.url
                ))
                .with_source(e),
            }),
        }
    }
}

/// nats-server's default `max_payload` (1 MiB): the claim-check threshold when
/// `max_payload` is not configured (the server's own may be lower; it is learned only on
/// connect).
const NATS_DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

crate::build_sink!(
    NatsConfig,
    "nats",
    |config, event| format!("NATS subject {}", config.destination.render(event)),
    message_limit: |c| c.max_payload.map_or(NATS_DEFAULT_MAX_PAYLOAD, std::num::NonZeroUsize::get),
    destination: destination,
    check: check,
    read_back: readback::read_back,
    scratch: scratch::scratch,
    remove_scratch: scratch::remove_scratch
);
