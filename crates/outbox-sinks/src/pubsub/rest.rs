//! The REST calls of the Pub/Sub sink: the access token from Application Default
//! Credentials, authenticated requests, one publish request (sent again one message at a
//! time when Pub/Sub refuses it as invalid), and how an error answer maps to a [`SinkError`].

use std::sync::Arc;

use futures::StreamExt as _;

use outbox_core::SinkError;
use outbox_core::sink::Delivery;
use reqwest::StatusCode;
use reqwest::header::CONTENT_TYPE;

use super::{PubSubSink, REASON_BYTES, SCOPE};

/// One publish request: messages (with their event's index) to one topic.
pub(super) struct Request {
    pub(super) topic: String,
    pub(super) messages: Vec<(usize, String)>,
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

impl PubSubSink {
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
    pub(super) async fn request(
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
    pub(super) async fn send(&self, request: Request) -> Vec<(usize, Delivery)> {
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
    pub(super) fn transport_error(&self, e: reqwest::Error) -> SinkError {
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

/// The start of an answer body as text, for messages.
pub(super) fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(REASON_BYTES)]);
    text.trim().to_owned()
}

/// `HTTP 404 NOT_FOUND: Topic not found` from an error answer of the REST API.
pub(super) fn describe_error(status: StatusCode, body: &[u8]) -> (String, Option<String>) {
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
pub(super) fn shorten_bytes(text: &str, max: usize) -> String {
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
pub(super) fn classify(
    status: StatusCode,
    body: &[u8],
    topic_path: &str,
    place: &str,
) -> SinkError {
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
