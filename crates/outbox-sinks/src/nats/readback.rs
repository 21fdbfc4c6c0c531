//! `outbox verify` for NATS JetStream: for each of the sink's stream subjects, the stream that
//! captures it is read with an **ordered consumer** (ephemeral, no acknowledgements, one
//! replica, gone when the read ends) filtered by that subject and starting at a time. It
//! takes nothing from the stream's own consumers: a limits-retention stream keeps every
//! message whoever reads it. Streams with `workqueue` or `interest` retention remove what
//! their consumers acknowledged, so they are refused rather than reported as losses.
//!
//! Only headers are fetched (`headers_only`), unless the format is CloudEvents structured
//! (the event id is in the body). A stream whose first sequence is above 1 has removed its
//! oldest messages (limits, `max_age`, a purge): what was sent before its first message is
//! reported as expired, not lost.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::context::GetStreamByNameErrorKind;
use async_nats::jetstream::stream::RetentionPolicy;
use async_nats::jetstream::{self};
use futures::StreamExt;
use outbox_core::cloudevents::Format;
use outbox_core::verify::{Identity, Lane, ReadBackError, ReadMessage, ReadOutcome, Trimmed};
use outbox_core::{Destination, SinkErrorKind};

use super::NatsConfig;
use crate::read_back::Read;

/// The longest wait for the next message while the consumer says more are pending.
const IDLE_LIMIT: Duration = Duration::from_secs(30);
/// How often (in messages) the progress is reported.
const PROGRESS_EVERY: u64 = 5_000;

/// Reads a JetStream sink's streams back.
pub struct NatsReadBack {
    jetstream: jetstream::Context,
    url: String,
    destination: Destination,
    /// Stream name → the sink's subjects it captures.
    streams: BTreeMap<String, Vec<String>>,
    headers_only: bool,
}

impl std::fmt::Debug for NatsReadBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsReadBack")
            .field("url", &self.url)
            .field("streams", &self.streams)
            .finish_non_exhaustive()
    }
}

/// Connects and finds the streams; refuses a stream whose consumers take its messages.
pub(super) async fn read_back(config: &NatsConfig) -> Result<NatsReadBack, ReadBackError> {
    config
        .validate()
        .map_err(|e| ReadBackError::refused(e.to_string()))?;
    // The JetStream context keeps its own handle on the connection.
    let (_client, jetstream, url) =
        super::connect_client(config)
            .await
            .map_err(|e| match e.kind() {
                SinkErrorKind::Unavailable => ReadBackError::unreachable(e.report()),
                _ => ReadBackError::refused(e.report()),
            })?;
    let subjects = config
        .resolved_stream_subjects()
        .ok_or_else(|| ReadBackError::refused("sink.stream_subjects: cannot be derived"))?;
    let mut streams: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for subject in &subjects {
        let name = match jetstream.stream_by_subject(subject.as_str()).await {
            Ok(name) => name,
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => {
                return Err(ReadBackError::refused(format!(
                    "no JetStream stream on {url} captures `{subject}` (sink.stream_subjects): nothing was delivered there, or the stream was deleted"
                )));
            }
            Err(e) => {
                return Err(ReadBackError::unreachable(format!(
                    "cannot look up the JetStream stream for `{subject}` on {url}: {e}"
                )));
            }
        };
        let stream = jetstream.get_stream(&name).await.map_err(|e| {
            ReadBackError::refused(format!("cannot read stream `{name}` on {url}: {e}"))
        })?;
        match stream.cached_info().config.retention {
            RetentionPolicy::Limits => {}
            other => {
                return Err(ReadBackError::unsupported(format!(
                    "JetStream stream `{name}` on {url} has {} retention: it removes messages once its consumers acknowledged them, so it cannot be read back to check delivery; its consumers can check it with the canary's probes (`[canary]`, a consumer-side canary: docs/operations.md#canary)",
                    match other {
                        RetentionPolicy::WorkQueue => "workqueue",
                        _ => "interest",
                    }
                )));
            }
        }
        streams.entry(name).or_default().push(subject.clone());
    }
    Ok(NatsReadBack {
        jetstream,
        url,
        destination: config.destination.clone(),
        streams,
        headers_only: config.format != Format::CloudeventsStructured,
    })
}

impl NatsReadBack {
    async fn read_all(&self, call: Read<'_>) -> Result<ReadOutcome, ReadBackError> {
        let mut out = ReadOutcome::default();
        // What each subject's consumer has pending, for the progress total.
        let mut consumers = Vec::new();
        // The ephemeral consumers, deleted once read (after a failed read the server removes
        // them at their inactivity threshold).
        let mut readers = Vec::new();
        for (name, subjects) in &self.streams {
            let mut stream = self.jetstream.get_stream(name).await.map_err(|e| {
                ReadBackError::failed(format!("reading stream `{name}` on {}: {e}", self.url))
            })?;
            let state = stream
                .info()
                .await
                .map_err(|e| {
                    ReadBackError::failed(format!(
                        "reading stream `{name}`'s state on {}: {e}",
                        self.url
                    ))
                })?
                .state
                .clone();
            if state.first_sequence > 1 && state.messages > 0 {
                out.trimmed.push(Trimmed {
                    destination: None,
                    retained_from: state.first_timestamp,
                    detail: format!(
                        "JetStream stream `{name}` no longer holds its first {} message(s) (limits, max_age or a purge): its oldest message is sequence {}, stored {}",
                        state.first_sequence - 1,
                        state.first_sequence,
                        outbox_core::admin::when(state.first_timestamp)
                    ),
                });
            }
            for subject in subjects {
                let consumer = stream
                    .create_consumer(OrderedConfig {
                        filter_subject: subject.clone(),
                        deliver_policy: DeliverPolicy::ByStartTime { start_time: call.since },
                        headers_only: self.headers_only,
                        description: Some("outbox verify (ephemeral, reads only)".to_owned()),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| {
                        ReadBackError::refused(format!(
                            "cannot create a reader (an ordered consumer) on stream `{name}` for `{subject}` on {}: {e}",
                            self.url
                        ))
                    })?;
                let pending = consumer.cached_info().num_pending;
                readers.push((stream.clone(), consumer.cached_info().name.clone()));
                consumers.push((name.clone(), subject.clone(), consumer, pending));
            }
        }
        let total: u64 = consumers.iter().map(|c| c.3).sum();
        call.progress.advance(0, Some(total));
        let mut read = 0_u64;
        for (name, subject, consumer, pending) in consumers {
            let lane = u32::try_from(out.lanes.len()).unwrap_or(u32::MAX);
            let mut count = 0_u64;
            if pending > 0 {
                let mut messages = consumer.messages().await.map_err(|e| {
                    ReadBackError::failed(format!(
                        "reading stream `{name}` ({subject}) on {}: {e}",
                        self.url
                    ))
                })?;
                loop {
                    let next = tokio::time::timeout(IDLE_LIMIT, messages.next())
                        .await
                        .map_err(|_| {
                            ReadBackError::unreachable(format!(
                                "no message from stream `{name}` ({subject}) on {} for {}s while {} were still pending",
                                self.url,
                                IDLE_LIMIT.as_secs(),
                                pending.saturating_sub(count)
                            ))
                        })?;
                    let Some(message) = next else { break };
                    let message = message.map_err(|e| {
                        ReadBackError::failed(format!(
                            "reading stream `{name}` ({subject}) on {}: {e}",
                            self.url
                        ))
                    })?;
                    let info = message.info().map_err(|e| {
                        ReadBackError::failed(format!("a message without its metadata: {e}"))
                    })?;
                    let (sequence, left, stored) =
                        (info.stream_sequence, info.pending, info.published);
                    let header = |h: &str| {
                        message
                            .headers
                            .as_ref()
                            .and_then(|hs| hs.get(h))
                            .map(|v| v.as_str().to_owned())
                    };
                    out.messages.push(ReadMessage {
                        identity: Identity::read(header, &message.payload),
                        lane,
                        offset: sequence,
                        stored_at: Some(stored),
                    });
                    count += 1;
                    read += 1;
                    if read.is_multiple_of(PROGRESS_EVERY) {
                        call.progress.advance(read, Some(total));
                    }
                    if left == 0 {
                        break;
                    }
                }
            }
            out.lanes.push(Lane {
                name: format!("stream `{name}`, subject `{subject}`"),
                messages: count,
            });
        }
        call.progress.advance(read, Some(total.max(read)));
        for (stream, name) in readers {
            let _ = stream.delete_consumer(&name).await;
        }
        Ok(out)
    }
}

// The connection stays open for the next read (the canary reads at every probe interval);
// `read_all` deletes its consumers.
crate::read_back::impl_read_back!(
    NatsReadBack,
    describe: |r| {
        let streams: Vec<String> = r
            .streams
            .iter()
            .map(|(name, subjects)| format!("stream `{name}` ({})", subjects.join(", ")))
            .collect();
        format!("NATS JetStream at {}, {}", r.url, streams.join(", "))
    },
    destination: destination,
);
