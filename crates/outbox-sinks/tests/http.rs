//! The HTTP webhook sink against a real axum server on 127.0.0.1.
//!
//! The receiver answers by path: the URL template ends in `{aggregate_id}`, and an
//! aggregate id `status-NNN` makes the receiver answer `NNN`, so one batch can mix outcomes.

#![cfg(feature = "http")]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use outbox_core::{Event, Position, Sink, SinkErrorKind};
use outbox_sinks::{HttpConfig, HttpSink, Secret};
use sha2::Sha256;
use time::OffsetDateTime;
use uuid::Uuid;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[derive(Debug, Clone)]
struct Recorded {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Recorded>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    delay: Mutex<Duration>,
}

/// A webhook receiver that records requests and answers by path.
struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("addr");
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { addr, shared }
    }

    /// `http://127.0.0.1:PORT/hook/{aggregate_type}/{aggregate_id}`
    fn url(&self) -> String {
        format!(
            "http://{}/hook/{{aggregate_type}}/{{aggregate_id}}",
            self.addr
        )
    }

    fn config(&self) -> HttpConfig {
        HttpConfig {
            url: self.url(),
            ..HttpConfig::default()
        }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().expect("lock").clone()
    }

    fn set_delay(&self, delay: Duration) {
        *self.shared.delay.lock().expect("lock") = delay;
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
    shared.requests.lock().expect("lock").push(Recorded {
        method,
        path: uri.to_string(),
        headers,
        body,
    });
    let delay = *shared.delay.lock().expect("lock");
    tokio::time::sleep(delay).await;
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);

    let status = uri
        .path()
        .rsplit('/')
        .next()
        .and_then(|last| last.strip_prefix("status-"))
        .and_then(|code| code.parse().ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::OK);
    let body = if status.is_success() {
        String::new()
    } else {
        format!("answer {}: {}", status.as_u16(), "x".repeat(300))
    };
    (status, body)
}

fn event(aggregate_id: &str, payload: &[u8]) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(1),
        aggregate_type: "Order".to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: "order.placed".to_owned(),
        payload: Bytes::copy_from_slice(payload),
        headers: vec![("tenant".to_owned(), "acme".to_owned())],
        created_at: OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

fn header<'r>(request: &'r Recorded, name: &str) -> Option<&'r str> {
    request.headers.get(name).and_then(|v| v.to_str().ok())
}

fn find<'r>(requests: &'r [Recorded], event: &Event) -> &'r Recorded {
    let id = event.id.to_string();
    requests
        .iter()
        .find(|r| header(r, "outbox-id") == Some(id.as_str()))
        .expect("the event's request arrived")
}

async fn build(config: HttpConfig) -> HttpSink {
    config.build().await.expect("builds")
}

#[tokio::test]
async fn a_batch_is_posted_with_exact_body_and_prefixed_headers() {
    let receiver = Receiver::start().await;
    let mut config = receiver.config();
    config
        .headers
        .insert("x-api-key".to_owned(), "k1".to_owned());
    let sink = build(config).await;

    let mut json = event("o_1", br#"{"total_cents":1250}"#);
    json.headers
        .push(("content-type".to_owned(), "application/json".to_owned()));
    let binary = event("a b/c", b"\x00\xff\r\nraw");
    let batch = [json, binary];
    let deliveries = sink.publish(&batch).await.expect("publishes");
    assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");

    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    for sent in &batch {
        let got = find(&requests, sent);
        assert_eq!(got.method, Method::POST);
        assert_eq!(got.body, sent.payload, "body is the payload bytes exactly");
        assert_eq!(header(got, "outbox-event_type"), Some("order.placed"));
        assert_eq!(header(got, "outbox-aggregate_type"), Some("Order"));
        assert_eq!(
            header(got, "outbox-aggregate_id"),
            Some(sent.aggregate_id.as_str())
        );
        assert_eq!(header(got, "outbox-tenant"), Some("acme"));
        assert_eq!(header(got, "x-api-key"), Some("k1"));
        assert_eq!(
            header(got, "webhook-signature"),
            None,
            "no secret, no signature"
        );
    }
    assert_eq!(find(&requests, &batch[0]).path, "/hook/Order/o_1");
    assert_eq!(
        find(&requests, &batch[1]).path,
        "/hook/Order/a%20b%2Fc",
        "values are percent-encoded"
    );
    assert_eq!(
        header(find(&requests, &batch[0]), "content-type"),
        Some("application/json")
    );
    assert_eq!(
        header(find(&requests, &batch[0]), "outbox-content-type"),
        Some("application/json")
    );
    assert_eq!(
        header(find(&requests, &batch[1]), "content-type"),
        Some("application/octet-stream")
    );
}

#[tokio::test]
async fn signed_requests_verify_per_standard_webhooks() {
    let receiver = Receiver::start().await;
    let mut config = receiver.config();
    config.secret = Some(Secret::new(SECRET));
    let sink = build(config).await;

    let batch = [event("o_1", br#"{"a":1}"#), event("o_2", b"\x00binary")];
    let before = OffsetDateTime::now_utc().unix_timestamp();
    let deliveries = sink.publish(&batch).await.expect("publishes");
    let after = OffsetDateTime::now_utc().unix_timestamp();
    assert!(deliveries.iter().all(Result::is_ok));

    let key = STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .expect("base64");
    for sent in &batch {
        let got = find(&receiver.requests(), sent).clone();
        let id = header(&got, "webhook-id").expect("webhook-id");
        assert_eq!(id, sent.id.to_string(), "webhook-id is the event id");
        let timestamp = header(&got, "webhook-timestamp").expect("webhook-timestamp");
        let seconds: i64 = timestamp.parse().expect("unix seconds");
        assert!(
            (before..=after).contains(&seconds),
            "{seconds} not in {before}..={after}"
        );

        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("key");
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(&got.body);
        let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
        assert_eq!(header(&got, "webhook-signature"), Some(expected.as_str()));
    }
}

#[tokio::test]
async fn responses_decide_each_events_fate_in_input_order() {
    let receiver = Receiver::start().await;
    let sink = build(receiver.config()).await;

    let batch = [
        event("status-200", b"1"),
        event("status-500", b"2"),
        event("status-429", b"3"),
        event("status-400", b"4"),
        event("status-204", b"5"),
        event("status-503", b"6"),
    ];
    let deliveries = sink.publish(&batch).await.expect("publishes");
    let kinds: Vec<Option<SinkErrorKind>> = deliveries
        .iter()
        .map(|d| d.as_ref().err().map(|e| e.kind()))
        .collect();
    assert_eq!(
        kinds,
        [
            None,
            Some(SinkErrorKind::Transient),
            Some(SinkErrorKind::Transient),
            Some(SinkErrorKind::Rejected),
            None,
            Some(SinkErrorKind::Transient),
        ]
    );
    let reason = deliveries[3].as_ref().expect_err("400").to_string();
    assert!(reason.contains("HTTP 400 Bad Request"), "{reason}");
    assert!(
        reason.contains("answer 400: xxx"),
        "body in the reason: {reason}"
    );
    let body_part = &reason[reason.find("answer 400").expect("body")..];
    assert_eq!(
        body_part.len(),
        200,
        "only the first 200 bytes of the body: {reason}"
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_fails_the_whole_batch_as_unavailable() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let sink = build(HttpConfig {
        url: format!("http://{addr}/hook/{{aggregate_id}}"),
        timeout: Duration::from_secs(2),
        ..HttpConfig::default()
    })
    .await;

    let err = sink
        .publish(&[event("o_1", b"1"), event("o_2", b"2")])
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable, "{err}");

    let err = sink.healthcheck().await.expect_err("nothing listens");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    let text = err.to_string();
    assert!(
        text.contains(&format!("http://{addr}/")),
        "names the endpoint: {text}"
    );
    assert!(text.contains("refused the connection"), "{text}");
}

#[tokio::test]
async fn the_healthcheck_counts_any_http_answer_as_reachable() {
    let receiver = Receiver::start().await;
    let mut config = receiver.config();
    config.url = format!("http://{}/hook/status-404/{{aggregate_id}}", receiver.addr);
    let sink = build(config).await;
    sink.healthcheck().await.expect("reachable");
    assert_eq!(receiver.requests()[0].method, Method::HEAD);
}

#[tokio::test]
async fn concurrency_is_bounded_by_max_concurrency() {
    let receiver = Receiver::start().await;
    receiver.set_delay(Duration::from_millis(100));
    let mut config = receiver.config();
    config.max_concurrency = std::num::NonZeroUsize::new(3).expect("non-zero");
    let sink = build(config).await;

    let batch: Vec<Event> = (0..12).map(|i| event(&format!("o_{i}"), b"x")).collect();
    let deliveries = sink.publish(&batch).await.expect("publishes");
    assert_eq!(deliveries.len(), 12);
    assert!(deliveries.iter().all(Result::is_ok));
    assert_eq!(receiver.shared.max_in_flight.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_slow_endpoint_times_out_as_transient() {
    let receiver = Receiver::start().await;
    receiver.set_delay(Duration::from_secs(5));
    let mut config = receiver.config();
    config.timeout = Duration::from_millis(300);
    let sink = build(config).await;

    let deliveries = sink
        .publish(&[event("o_1", b"1")])
        .await
        .expect("publishes");
    let err = deliveries[0].as_ref().expect_err("times out");
    assert_eq!(err.kind(), SinkErrorKind::Transient, "{err}");
    assert!(err.to_string().contains("no response"), "{err}");
}

#[tokio::test]
async fn non_ascii_header_values_arrive_as_utf8_bytes_and_a_line_break_is_rejected() {
    let receiver = Receiver::start().await;
    let sink = build(receiver.config()).await;
    let mut text = event("Zürich-1", b"{}");
    text.headers.push(("note".to_owned(), "café ☕".to_owned()));
    let mut broken = event("o_2", b"{}");
    broken
        .headers
        .push(("note".to_owned(), "line\r\nx-injected: 1".to_owned()));
    let deliveries = sink
        .publish(&[text.clone(), broken])
        .await
        .expect("publishes");
    assert!(deliveries[0].is_ok(), "{deliveries:?}");
    let refused = deliveries[1]
        .as_ref()
        .expect_err("a line break cannot be carried");
    assert_eq!(refused.kind(), SinkErrorKind::Rejected);
    assert!(refused.to_string().contains("`note`"), "{refused}");

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1, "the rejected event was not sent");
    let utf8 = |name: &str| {
        std::str::from_utf8(requests[0].headers.get(name).expect(name).as_bytes())
            .expect("UTF-8")
            .to_owned()
    };
    assert_eq!(utf8("outbox-aggregate_id"), "Zürich-1");
    assert_eq!(utf8("outbox-note"), "café ☕");
}
