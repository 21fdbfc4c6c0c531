//! [`WebhookReceiver`] (feature `http`): an axum endpoint that receives the relay's HTTP
//! webhooks, verifies their Standard Webhooks signatures and runs a handler.
//!
//! What the sink sends (see `outbox-sinks`' `http` module): `POST`, the payload as body, the
//! contract headers as `outbox-id`, `outbox-event_type`, `outbox-aggregate_type`,
//! `outbox-aggregate_id` (the row's own headers as `outbox-<name>`), and `webhook-id`,
//! `webhook-timestamp`, `webhook-signature` = `v1,` + base64 HMAC-SHA256 of
//! `{id}.{timestamp}.{body}` under the secret (`whsec_<base64 key>`, or raw key bytes).
//! A sink with `format = "cloudevents-binary"` sends `ce-` headers instead of the `outbox-`
//! ones, and with `"cloudevents-structured"` a JSON envelope as body; both are read back
//! ([`InboxMessage`]).
//!
//! | request | answer | handler called |
//! | --- | --- | --- |
//! | signature headers missing, signature wrong, timestamp unreadable | 401 | no |
//! | timestamp further than `tolerance` from now (either way) | 401 | no |
//! | signed, but contract headers missing or `outbox-id` not a UUID | 400 (the sender dead-letters it) | no |
//! | handler `Ok` (processed, or a duplicate the inbox detected) | 200 | yes |
//! | handler `Err` (its transaction rolled back) | 500 (the sender retries) | yes |
//! | not `POST` | 405 | no |
//!
//! A replayed request (same id, valid signature, within the window) reaches the handler and
//! the inbox reports it a duplicate: one side effect, answered 200. Outside the window it is
//! refused before the handler. Requests of one key (`aggregate_type`, `aggregate_id`) are
//! handled one at a time (the shared [`lane_of`](crate::lane::lane_of()) over `lanes` locks);
//! the order they arrive in is the sender's.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::InboxMessage;
use crate::lane::{ConsumerError, ConsumerReport, MessageHandler, lane_of};

/// Prefix of the contract headers on a webhook.
const HEADER_PREFIX: &str = "outbox-";

/// A Standard Webhooks key: verifies (and, for tests and other senders, produces)
/// `webhook-signature` values. `Debug` never shows the key.
#[derive(Clone)]
pub struct Verifier {
    key: Vec<u8>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Verifier { key: *** }")
    }
}

/// Why a request's signature was refused (answered 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// A `webhook-*` header is missing or not text.
    #[error("the `{0}` header is missing")]
    Missing(&'static str),
    /// `webhook-timestamp` is not Unix seconds.
    #[error("`webhook-timestamp` is not a Unix timestamp in seconds")]
    BadTimestamp,
    /// The timestamp is outside the tolerance window (an old request replayed, or a clock far
    /// off).
    #[error(
        "`webhook-timestamp` is {age_secs} s away from now, outside the {tolerance_secs} s tolerance"
    )]
    Stale {
        /// How far the timestamp is from now, in seconds (either direction).
        age_secs: i64,
        /// The tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// No `v1,` signature in `webhook-signature` matches.
    #[error("no signature in `webhook-signature` matches the request")]
    Mismatch,
}

impl Verifier {
    /// The verifier of a secret: `whsec_<base64>` is decoded, anything else is used as raw
    /// key bytes (as the sink does). The error never repeats the secret.
    pub fn from_secret(secret: &str) -> Result<Self, ConsumerError> {
        let key = match secret.strip_prefix("whsec_") {
            Some(encoded) => STANDARD.decode(encoded).map_err(|_| {
                ConsumerError::Config("secret: the part after `whsec_` is not valid base64".into())
            })?,
            None => secret.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err(ConsumerError::Config("secret: must not be empty".into()));
        }
        Ok(Self { key })
    }

    fn mac(&self, id: &str, timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        for part in [id.as_bytes(), b".", timestamp.as_bytes(), b".", body] {
            mac.update(part);
        }
        mac
    }

    /// The `webhook-signature` value for a request.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = self
            .mac(id, &timestamp.to_string(), body)
            .finalize()
            .into_bytes();
        format!("v1,{}", STANDARD.encode(tag))
    }

    /// Checks a request's `webhook-*` headers against its body at `now`. Signatures compare
    /// in constant time; several space-separated signatures (key rotation) are accepted when
    /// one matches.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: OffsetDateTime,
        tolerance: Duration,
    ) -> Result<(), SignatureError> {
        let header = |name: &'static str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or(SignatureError::Missing(name))
        };
        let (id, timestamp, signatures) = (
            header("webhook-id")?,
            header("webhook-timestamp")?,
            header("webhook-signature")?,
        );
        let at: i64 = timestamp
            .trim()
            .parse()
            .map_err(|_| SignatureError::BadTimestamp)?;
        let age_secs = now.unix_timestamp().saturating_sub(at).saturating_abs();
        if age_secs.unsigned_abs() > tolerance.as_secs() {
            return Err(SignatureError::Stale {
                age_secs,
                tolerance_secs: tolerance.as_secs(),
            });
        }
        let matches = signatures.split(' ').any(|candidate| {
            let Some(tag) = candidate
                .strip_prefix("v1,")
                .and_then(|b| STANDARD.decode(b).ok())
            else {
                return false;
            };
            self.mac(id, timestamp, body).verify_slice(&tag).is_ok()
        });
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

/// The webhook endpoint's settings.
#[derive(Debug, Clone)]
pub struct WebhookReceiver {
    /// The signing key (the sink's `secret`).
    pub verifier: Verifier,
    /// Largest accepted distance between `webhook-timestamp` and now. Default 5 min.
    pub tolerance: Duration,
    /// Key locks: requests of one key are handled one at a time. Default 64.
    pub lanes: NonZeroUsize,
    /// Largest accepted body, in bytes. Default 16 MiB.
    pub body_limit: usize,
}

type BoxedHandler =
    Arc<dyn Fn(InboxMessage) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

#[derive(Default)]
struct Counters {
    handled: AtomicU64,
    failed: AtomicU64,
    malformed: AtomicU64,
    unauthorized: AtomicU64,
}

struct Shared {
    config: WebhookReceiver,
    handler: BoxedHandler,
    locks: Vec<tokio::sync::Mutex<()>>,
    counters: Counters,
}

impl WebhookReceiver {
    /// A receiver verifying with `secret`, with the defaults (5 min tolerance, 64 key
    /// locks, 16 MiB bodies).
    pub fn new(secret: &str) -> Result<Self, ConsumerError> {
        Ok(Self {
            verifier: Verifier::from_secret(secret)?,
            tolerance: Duration::from_secs(300),
            lanes: NonZeroUsize::new(64).expect("not zero"),
            body_limit: 16 * 1024 * 1024,
        })
    }

    fn shared<H: MessageHandler>(self, handler: H) -> Arc<Shared> {
        let boxed: BoxedHandler = Arc::new(move |m| {
            let fut = crate::trace::call(&handler, m);
            Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
        });
        Arc::new(Shared {
            locks: (0..self.lanes.get())
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            config: self,
            handler: boxed,
            counters: Counters::default(),
        })
    }

    /// An axum router answering every path; nest it where webhooks should arrive. `handler`
    /// (see [`MessageHandler`]) returning `Err` answers 500 so the sender retries.
    pub fn router<H: MessageHandler>(self, handler: H) -> Router {
        router(self.shared(handler))
    }

    /// Serves webhooks on `listener` until `shutdown` is cancelled, then lets the requests
    /// in progress finish (their answers are sent) and returns what was done: `acked` = 200
    /// answers, `retried` = 500 answers, `dead_lettered` = 400 answers, `rejected` = 401.
    pub async fn serve<H: MessageHandler>(
        self,
        listener: TcpListener,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let shared = self.shared(handler);
        axum::serve(listener, router(Arc::clone(&shared)))
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(|e| ConsumerError::broker("HTTP", "serve webhooks", e))?;
        let c = &shared.counters;
        Ok(ConsumerReport {
            acked: c.handled.load(Ordering::Relaxed),
            retried: c.failed.load(Ordering::Relaxed),
            dead_lettered: c.malformed.load(Ordering::Relaxed),
            released: 0,
            rejected: c.unauthorized.load(Ordering::Relaxed),
            ..ConsumerReport::default()
        })
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.config.body_limit;
    Router::new()
        .fallback(receive)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(shared)
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    let c = &shared.counters;
    let config = &shared.config;
    let now = OffsetDateTime::now_utc();
    if let Err(e) = config
        .verifier
        .verify(&headers, &body, now, config.tolerance)
    {
        tracing::warn!(error = %e, "refusing a webhook");
        c.unauthorized.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::UNAUTHORIZED, e.to_string()).into_response();
    }
    let prefixed: Vec<(&str, &str)> = headers
        .iter()
        .filter_map(|(name, value)| {
            let name = name.as_str().strip_prefix(HEADER_PREFIX)?;
            // UTF-8 bytes, as the relay sends them (an aggregate id `Zürich-1`).
            Some((name, std::str::from_utf8(value.as_bytes()).ok()?))
        })
        .collect();
    let parsed = if prefixed.is_empty() {
        // A CloudEvent (sink.format): `ce-` headers (percent-encoded, as the HTTP binding
        // says) and `content-type`, or a structured envelope as the body.
        let cloudevent = headers.iter().filter_map(|(name, value)| {
            let name = name.as_str();
            (name.starts_with("ce-") || name == "content-type")
                .then(|| Some((name, std::str::from_utf8(value.as_bytes()).ok()?)))
                .flatten()
        });
        InboxMessage::from_percent_encoded_headers(cloudevent, &[], body)
    } else {
        InboxMessage::from_headers(prefixed, &[], body)
    };
    let message = match parsed {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %e, "a signed webhook does not follow the contract");
            c.malformed.fetch_add(1, Ordering::Relaxed);
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
    };
    let lane = lane_of(&message.aggregate_type, &message.aggregate_id, config.lanes);
    let _key = shared.locks[lane].lock().await;
    let id = message.id;
    match (shared.handler)(message).await {
        Ok(()) => {
            c.handled.fetch_add(1, Ordering::Relaxed);
            StatusCode::OK.into_response()
        }
        Err(e) => {
            tracing::warn!(%id, error = %e, "webhook handler failed; answering 500 so the sender retries");
            c.failed.fetch_add(1, Ordering::Relaxed);
            (StatusCode::INTERNAL_SERVER_ERROR, "handler failed").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(id: &str, ts: i64, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("webhook-id", HeaderValue::from_str(id).expect("valid"));
        h.insert("webhook-timestamp", HeaderValue::from(ts));
        h.insert(
            "webhook-signature",
            HeaderValue::from_str(sig).expect("valid"),
        );
        h
    }

    #[test]
    fn accepts_the_standard_webhooks_reference_vector() {
        // The published Standard Webhooks test vector: the same one the sink's signer
        // reproduces, so what the sink sends is what this verifies.
        let v = Verifier::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("valid");
        let h = headers(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            "v0,abc v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        );
        let at = OffsetDateTime::from_unix_timestamp(1_614_265_330 + 10).expect("valid");
        let tolerance = Duration::from_secs(300);
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(v.verify(&h, body, at, tolerance), Ok(()));
        assert_eq!(
            v.verify(&h, b"{}", at, tolerance),
            Err(SignatureError::Mismatch)
        );
        let late = at + time::Duration::minutes(6);
        assert!(matches!(
            v.verify(&h, body, late, tolerance),
            Err(SignatureError::Stale { .. })
        ));
    }

    #[test]
    fn missing_headers_and_bad_secrets_are_named() {
        let v = Verifier::from_secret("raw").expect("valid");
        let now = OffsetDateTime::now_utc();
        assert_eq!(
            v.verify(&HeaderMap::new(), b"", now, Duration::from_secs(1)),
            Err(SignatureError::Missing("webhook-id"))
        );
        assert!(Verifier::from_secret("whsec_!!").is_err());
        assert!(Verifier::from_secret("").is_err());
        assert!(!format!("{v:?}").contains("raw"));
    }
}
