//! `outbox verify` for Google Cloud Pub/Sub: every topic the expected events name (and, for a
//! template, every topic of the project it could render) is read through a **temporary
//! subscription** of its own: created on the topic, sought to the window's start
//! (`subscriptions.seek` with a time), pulled until nothing published before the read began
//! is left, acknowledged on that subscription only, then deleted (in the background when the
//! read is abandoned midway, as by a caller's timeout). The topic's own subscriptions see
//! nothing of it. The temporary subscription expires by itself after a day unused
//! (`expirationPolicy`), should the process be killed before it deletes it.
//!
//! A new subscription only holds what is published after its creation; a seek to an earlier
//! time brings back older messages only when the **topic** retains them
//! (`messageRetentionDuration` on the topic). A topic without it is refused: reading it would
//! find nothing and call every event lost. A window that starts before `now - retention`
//! reports what was sent before as expired, not lost.
//!
//! The topic is one lane. A subscription without message ordering delivers in no particular
//! order, so the lane is sorted by `publishTime` (Pub/Sub's time of storing each message;
//! the relay publishes an aggregate's next event only after the previous one was
//! acknowledged, so they have increasing publish times); messages of one aggregate with the
//! same publish time (milliseconds) are taken in `aggregate_seq` order, as their order cannot
//! be told. An ordered subscription would give Pub/Sub's own per-key order, but the Pub/Sub
//! emulator cannot seek one (`UNIMPLEMENTED`). A message redelivered to the temporary
//! subscription (same message id) is read once.
//!
//! What the Cloud SDK's emulator (0.8.20) does, as tested: it keeps `messageRetentionDuration`
//! on a topic, and a seek to a time on an unordered subscription brings back exactly what was
//! published since then; a topic without retention gives nothing, sought or not. Unlike
//! Google's service, it also hands a new subscription on a retaining topic the retained
//! messages without any seek; the seek then narrows them to the window.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use outbox_core::verify::{
    Identity, Lane, LedgerEvent, ReadBack, ReadBackError, ReadMessage, ReadOutcome, ReadProgress,
    Trimmed,
};
use outbox_core::{SinkError, SinkErrorKind};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{PubSubConfig, PubSubSink, describe_error};
use crate::read_back::Read;

/// Messages per pull (the API's maximum).
const PULL_MAX: usize = 1000;
/// Without a message published before the read began for this long, the topic is read (a
/// pull that returns at once may come back empty while Pub/Sub still holds messages).
const QUIET_END: Duration = Duration::from_secs(5);
/// Pause after a pull that brought nothing new.
const EMPTY_PAUSE: Duration = Duration::from_millis(200);
/// How often (in messages) the progress is reported.
const PROGRESS_EVERY: u64 = 5_000;
/// What `outbox verify` needs, for refusals.
const PERMISSIONS: &str = "pubsub.topics.get and pubsub.topics.attachSubscription on the topic, pubsub.subscriptions.create, .consume and .delete on the project (roles/pubsub.editor, or roles/pubsub.subscriber with roles/pubsub.viewer)";

/// Reads a Pub/Sub sink's topics back.
#[derive(Clone)]
pub struct PubSubReadBack {
    sink: Arc<PubSubSink>,
}

impl std::fmt::Debug for PubSubReadBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubReadBack")
            .field("sink", &self.sink)
            .finish()
    }
}

/// Builds the sink's client (the same endpoint and credentials) and checks that Pub/Sub
/// answers: the topic (a fixed `topic`, which must retain messages) or the project's topics
/// (a template).
pub(super) async fn read_back(config: &PubSubConfig) -> Result<PubSubReadBack, ReadBackError> {
    let sink = config
        .clone()
        .build()
        .await
        .map_err(|e| ReadBackError::refused(e.report()))?;
    let readback = PubSubReadBack {
        sink: Arc::new(sink),
    };
    let sink = &readback.sink;
    let (url, what) = if sink.topic.is_fixed() {
        let topic = sink.topic.template();
        (
            sink.topic_url(topic, ""),
            format!("topic `{}`", sink.topic_path(topic)),
        )
    } else {
        (
            format!(
                "{}/v1/projects/{}/topics?pageSize=1",
                sink.base, sink.project
            ),
            format!("the topics of project `{}`", sink.project),
        )
    };
    let (status, body) = readback.call(Method::GET, &url, None).await?;
    if !status.is_success() && status != StatusCode::NOT_FOUND {
        return Err(readback.refusal(status, &body, &format!("reading {what}")));
    }
    // A fixed topic without retention is refused now, before anything is read.
    if sink.topic.is_fixed()
        && status.is_success()
        && retention(&serde_json::from_slice(&body).unwrap_or_default()).is_none()
    {
        return Err(readback.keeps_nothing(sink.topic.template()));
    }
    Ok(readback)
}

/// One message of a pull answer.
#[derive(Deserialize)]
struct Received {
    #[serde(rename = "ackId")]
    ack_id: String,
    message: Message,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    data: String,
    #[serde(default)]
    attributes: std::collections::HashMap<String, String>,
    #[serde(rename = "messageId", default)]
    message_id: String,
    #[serde(rename = "publishTime", default)]
    publish_time: String,
}

#[derive(Deserialize)]
struct Pulled {
    #[serde(rename = "receivedMessages", default)]
    received: Vec<Received>,
}

/// A topic's retention, `None` when it keeps no messages: `"600s"`, `"86400.5s"`.
fn retention(topic: &serde_json::Value) -> Option<time::Duration> {
    let text = topic["messageRetentionDuration"].as_str()?;
    let seconds: f64 = text.strip_suffix('s')?.parse().ok()?;
    (seconds > 0.0).then(|| time::Duration::seconds_f64(seconds))
}

impl PubSubReadBack {
    /// One request: the status and the body, or unreachable.
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, bytes::Bytes), ReadBackError> {
        let mut request = self
            .sink
            .request(method, url)
            .await
            .map_err(|e| self.sink_error(&e))?;
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.sink_error(&self.sink.transport_error(e)))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|e| self.sink_error(&self.sink.transport_error(e)))?;
        Ok((status, body))
    }

    fn sink_error(&self, e: &SinkError) -> ReadBackError {
        match e.kind() {
            SinkErrorKind::Unavailable if e.to_string().contains("access token") => {
                ReadBackError::refused(e.report())
            }
            SinkErrorKind::Unavailable => ReadBackError::unreachable(e.report()),
            _ => ReadBackError::failed(e.report()),
        }
    }

    /// The error of an answer other than success to `doing`.
    fn refusal(&self, status: StatusCode, body: &[u8], doing: &str) -> ReadBackError {
        let (text, _) = describe_error(status, body);
        let message = format!("{} refused {doing} ({text})", self.sink.place);
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                ReadBackError::refused(format!("{message}; `outbox verify` needs {PERMISSIONS}"))
            }
            StatusCode::NOT_FOUND => ReadBackError::refused(message),
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                ReadBackError::unreachable(message)
            }
            _ => ReadBackError::failed(message),
        }
    }

    /// The refusal of a topic without message retention.
    fn keeps_nothing(&self, topic: &str) -> ReadBackError {
        ReadBackError::unsupported(format!(
            "Pub/Sub topic `{}` on {} keeps no messages (no message retention on the topic): a subscription made now cannot be sought back to the window's start, so `outbox verify` would find nothing and cannot check it. Set the topic's message retention to cover the windows you verify (e.g. `gcloud pubsub topics update {topic} --message-retention-duration=7d`); retention on a subscription (retain_acked_messages) does not help a new one",
            self.sink.topic_path(topic),
            self.sink.place
        ))
    }

    fn subscription_url(&self, name: &str, suffix: &str) -> String {
        format!(
            "{}/v1/projects/{}/subscriptions/{name}{suffix}",
            self.sink.base, self.sink.project
        )
    }

    /// The topics to read: those the expected events name and, for a template, every topic
    /// of the project it could render.
    async fn topics(&self, expected: &[LedgerEvent]) -> Result<BTreeSet<String>, ReadBackError> {
        let mut topics: BTreeSet<String> =
            expected.iter().map(|e| self.destination_of(e)).collect();
        if self.sink.topic.is_fixed() {
            topics.insert(self.sink.topic.template().to_owned());
            return Ok(topics);
        }
        let prefix = format!("projects/{}/topics/", self.sink.project);
        let mut token = String::new();
        loop {
            let mut url = format!(
                "{}/v1/projects/{}/topics?pageSize=1000",
                self.sink.base, self.sink.project
            );
            if !token.is_empty() {
                url.push_str("&pageToken=");
                url.push_str(&token.replace('/', "%2F"));
            }
            let (status, body) = self.call(Method::GET, &url, None).await?;
            if !status.is_success() {
                return Err(self.refusal(status, &body, "listing the project's topics"));
            }
            let page: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            for topic in page["topics"].as_array().into_iter().flatten() {
                if let Some(id) = topic["name"].as_str().and_then(|n| n.strip_prefix(&prefix))
                    && self.sink.topic.could_render(id)
                {
                    topics.insert(id.to_owned());
                }
            }
            token = page["nextPageToken"].as_str().unwrap_or("").to_owned();
            if token.is_empty() {
                break;
            }
        }
        Ok(topics)
    }

    async fn read_all(&self, call: Read<'_>) -> Result<ReadOutcome, ReadBackError> {
        let started = OffsetDateTime::now_utc();
        let named: BTreeSet<String> = call
            .expected
            .iter()
            .map(|e| self.destination_of(e))
            .collect();
        let mut out = ReadOutcome::default();
        // Every topic is checked before any subscription is made: a topic that keeps nothing
        // refuses the whole read.
        let mut readable = Vec::new();
        for topic in self.topics(call.expected).await? {
            let path = self.sink.topic_path(&topic);
            let (status, body) = self
                .call(Method::GET, &self.sink.topic_url(&topic, ""), None)
                .await?;
            if status == StatusCode::NOT_FOUND {
                if named.contains(&topic) {
                    out.notes.push(format!(
                        "Pub/Sub topic `{path}` does not exist on {}: every event the table says was delivered there counts as lost",
                        self.sink.place
                    ));
                }
                continue;
            }
            if !status.is_success() {
                return Err(self.refusal(status, &body, &format!("reading topic `{path}`")));
            }
            let info: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let Some(kept) = retention(&info) else {
                return Err(self.keeps_nothing(&topic));
            };
            let retained_from = started - kept;
            if call.since < retained_from {
                out.trimmed.push(Trimmed {
                    destination: Some(topic.clone()),
                    retained_from,
                    detail: format!(
                        "Pub/Sub topic `{path}` keeps messages for {}s (messageRetentionDuration): what was published before {} may be gone",
                        kept.whole_seconds(),
                        outbox_core::admin::when(retained_from)
                    ),
                });
            }
            readable.push(topic);
        }
        call.progress.advance(0, None);
        let mut read = 0_u64;
        for topic in readable {
            let lane = u32::try_from(out.lanes.len()).unwrap_or(u32::MAX);
            let name = format!("outbox-verify-{}", uuid::Uuid::now_v7().simple());
            self.create_subscription(&topic, &name).await?;
            let temporary = Temporary {
                reader: Some(self.clone()),
                name: name.clone(),
            };
            let result = self
                .read_topic(&name, lane, call.since, started, &mut read, call.progress)
                .await;
            if let Err(e) = temporary.delete().await {
                out.notes.push(e);
            }
            let mut messages = result?;
            out.lanes.push(Lane {
                name: format!("topic `{}`", self.sink.topic_path(&topic)),
                messages: messages.len() as u64,
            });
            out.messages.append(&mut messages);
        }
        call.progress.advance(read, Some(read));
        Ok(out)
    }

    async fn create_subscription(&self, topic: &str, name: &str) -> Result<(), ReadBackError> {
        let body = json!({
            "topic": self.sink.topic_path(topic),
            "ackDeadlineSeconds": 60,
            // The shortest allowed: a subscription verify could not delete goes by itself.
            "expirationPolicy": { "ttl": "86400s" },
            "messageRetentionDuration": "600s",
            "labels": { "created-by": "outbox-verify" },
        });
        let (status, answer) = self
            .call(Method::PUT, &self.subscription_url(name, ""), Some(body))
            .await?;
        if !status.is_success() {
            return Err(self.refusal(
                status,
                &answer,
                &format!(
                    "creating a temporary subscription `{name}` on topic `{}`",
                    self.sink.topic_path(topic)
                ),
            ));
        }
        Ok(())
    }

    /// Deletes the temporary subscription; on failure, the note to show.
    async fn delete_subscription(&self, name: &str) -> Result<(), String> {
        match self
            .call(Method::DELETE, &self.subscription_url(name, ""), None)
            .await
        {
            Ok((status, _)) if status.is_success() || status == StatusCode::NOT_FOUND => Ok(()),
            Ok((status, body)) => Err(format!(
                "the temporary subscription `{name}` could not be deleted ({}); it expires after a day unused",
                describe_error(status, &body).0
            )),
            Err(e) => Err(format!(
                "the temporary subscription `{name}` could not be deleted ({e}); it expires after a day unused"
            )),
        }
    }

    /// Seeks subscription `name` to `since` and pulls until nothing published before
    /// `started` came for [`QUIET_END`]; the lane's messages, sorted by publish time.
    async fn read_topic(
        &self,
        name: &str,
        lane: u32,
        since: OffsetDateTime,
        started: OffsetDateTime,
        read: &mut u64,
        progress: &dyn ReadProgress,
    ) -> Result<Vec<ReadMessage>, ReadBackError> {
        let time = since
            .format(&Rfc3339)
            .map_err(|e| ReadBackError::failed(e.to_string()))?;
        let (status, body) = self
            .call(
                Method::POST,
                &self.subscription_url(name, ":seek"),
                Some(json!({ "time": time })),
            )
            .await?;
        if !status.is_success() {
            return Err(self.refusal(
                status,
                &body,
                &format!("seeking the temporary subscription `{name}` to {time}"),
            ));
        }
        let mut seen: HashSet<String> = HashSet::new();
        let mut messages: Vec<(Option<OffsetDateTime>, ReadMessage)> = Vec::new();
        let mut progress_at = Instant::now();
        loop {
            let (status, body) = self
                .call(
                    Method::POST,
                    &self.subscription_url(name, ":pull"),
                    Some(json!({ "maxMessages": PULL_MAX, "returnImmediately": true })),
                )
                .await?;
            if !status.is_success() {
                return Err(self.refusal(
                    status,
                    &body,
                    &format!("pulling from the temporary subscription `{name}`"),
                ));
            }
            let pulled: Pulled = serde_json::from_slice(&body).map_err(|e| {
                ReadBackError::failed(format!(
                    "{} answered a pull with something else than messages: {e}",
                    self.sink.place
                ))
            })?;
            let mut old = false;
            let mut acks = Vec::with_capacity(pulled.received.len());
            for received in pulled.received {
                acks.push(received.ack_id);
                let m = received.message;
                if !seen.insert(m.message_id) {
                    continue;
                }
                let stored_at = OffsetDateTime::parse(&m.publish_time, &Rfc3339).ok();
                old |= stored_at.is_none_or(|t| t < started);
                let data = base64::engine::general_purpose::STANDARD
                    .decode(m.data.as_bytes())
                    .unwrap_or_default();
                let identity = Identity::read(|h| m.attributes.get(h).cloned(), &data);
                messages.push((
                    stored_at,
                    ReadMessage {
                        identity,
                        lane,
                        offset: 0,
                        stored_at,
                    },
                ));
                *read += 1;
                if read.is_multiple_of(PROGRESS_EVERY) {
                    progress.advance(*read, None);
                }
            }
            if !acks.is_empty() {
                let (status, body) = self
                    .call(
                        Method::POST,
                        &self.subscription_url(name, ":acknowledge"),
                        Some(json!({ "ackIds": acks })),
                    )
                    .await?;
                if !status.is_success() {
                    return Err(self.refusal(
                        status,
                        &body,
                        &format!("acknowledging on the temporary subscription `{name}`"),
                    ));
                }
            }
            if old {
                progress_at = Instant::now();
            } else if progress_at.elapsed() >= QUIET_END {
                break;
            } else {
                tokio::time::sleep(EMPTY_PAUSE).await;
            }
        }
        // Publish order; ties (the same millisecond) by aggregate_seq, then as received.
        messages.sort_by_key(|(at, m)| (*at, m.identity.aggregate_seq));
        Ok(messages
            .into_iter()
            .enumerate()
            .map(|(i, (_, mut m))| {
                m.offset = i as u64 + 1;
                m
            })
            .collect())
    }
}

/// A temporary subscription, deleted by [`Temporary::delete`] or, when a read is abandoned
/// midway (a caller's timeout drops it), by a task of its own.
struct Temporary {
    reader: Option<PubSubReadBack>,
    name: String,
}

impl Temporary {
    async fn delete(mut self) -> Result<(), String> {
        match self.reader.take() {
            Some(reader) => reader.delete_subscription(&self.name).await,
            None => Ok(()),
        }
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let name = std::mem::take(&mut self.name);
            runtime.spawn(async move {
                if let Err(e) = reader.delete_subscription(&name).await {
                    tracing::warn!(reason = %e, "Pub/Sub read-back abandoned midway");
                }
            });
        }
    }
}

crate::read_back::impl_read_back!(
    PubSubReadBack,
    describe: |r| format!(
        "{}, topics `projects/{}/topics/{}`",
        r.sink.place,
        r.sink.project,
        r.sink.topic.template()
    ),
    destination: sink.topic,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_retention_is_read_from_the_duration() {
        let kept = |v: serde_json::Value| retention(&v);
        assert_eq!(
            kept(json!({"messageRetentionDuration": "600s"})),
            Some(time::Duration::seconds(600))
        );
        assert_eq!(
            kept(json!({"messageRetentionDuration": "86400.5s"})),
            Some(time::Duration::seconds_f64(86_400.5))
        );
        assert_eq!(kept(json!({"name": "projects/p/topics/t"})), None);
        assert_eq!(kept(json!({"messageRetentionDuration": "0s"})), None);
    }
}
