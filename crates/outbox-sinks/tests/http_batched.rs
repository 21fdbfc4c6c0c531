//! The HTTP sink's batched mode (`events_per_request` above 1) against the testkit's
//! recording receiver, a real HTTP server on 127.0.0.1.

#![cfg(feature = "http")]

use std::num::NonZeroUsize;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use outbox_core::{Event, Position, Sink, SinkErrorKind};
use outbox_sinks::stdout::JsonLine;
use outbox_sinks::{HttpConfig, HttpSink, Secret};
use outbox_testkit::services::{HttpReceiver, Request};
use sha2::Sha256;
use time::OffsetDateTime;
use uuid::Uuid;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn event(aggregate_type: &str, aggregate_id: &str, payload: &[u8]) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(1),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: "order.placed".to_owned(),
        payload: Bytes::copy_from_slice(payload),
        headers: vec![("tenant".to_owned(), "acme".to_owned())],
        created_at: OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

/// A sink posting to `/hook/{aggregate_type}` with `events_per_request = n`.
async fn sink(receiver: &HttpReceiver, n: usize, edit: impl FnOnce(&mut HttpConfig)) -> HttpSink {
    let mut config = HttpConfig {
        url: receiver.url_for("/hook/{aggregate_type}"),
        events_per_request: NonZeroUsize::new(n).expect("not zero"),
        ..HttpConfig::default()
    };
    edit(&mut config);
    config.build().await.expect("builds")
}

/// The JSON lines of a plain batched request.
fn lines(request: &Request) -> Vec<JsonLine> {
    assert_eq!(request.header("content-type"), Some("application/x-ndjson"));
    std::str::from_utf8(&request.body)
        .expect("UTF-8")
        .lines()
        .map(|line| JsonLine::parse(line).expect("a JSON line"))
        .collect()
}

#[tokio::test]
async fn events_to_one_url_share_requests_of_at_most_events_per_request() {
    let receiver = HttpReceiver::start().await.expect("receiver");
    let sink = sink(&receiver, 8, |_| {}).await;
    let mut batch: Vec<Event> = (0..20)
        .map(|i| {
            event(
                "Order",
                &format!("o_{i}"),
                format!("{{\"n\":{i}}}").as_bytes(),
            )
        })
        .collect();
    batch.extend((0..5).map(|i| event("Invoice", &format!("i_{i}"), b"\x00\xffbinary")));

    let deliveries = sink.publish(&batch).await.expect("publishes");
    assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");

    let requests = receiver.received();
    let mut sizes: Vec<(String, usize)> = requests
        .iter()
        .map(|r| (r.path.clone(), lines(r).len()))
        .collect();
    sizes.sort();
    assert_eq!(
        sizes,
        [
            ("/hook/Invoice".to_owned(), 5),
            ("/hook/Order".to_owned(), 4),
            ("/hook/Order".to_owned(), 8),
            ("/hook/Order".to_owned(), 8),
        ],
        "20 Order events in requests of at most 8, the 5 Invoice events in one"
    );
    // Every event arrives once, with its id, headers and exact payload.
    let mut arrived: Vec<JsonLine> = requests.iter().flat_map(lines).collect();
    assert_eq!(arrived.len(), batch.len());
    for sent in &batch {
        let at = arrived
            .iter()
            .position(|line| line.id == sent.id)
            .unwrap_or_else(|| panic!("event {} did not arrive", sent.id));
        let line = arrived.swap_remove(at);
        assert_eq!(
            line.payload_bytes().expect("payload"),
            sent.payload.to_vec()
        );
        assert_eq!(line.aggregate_id, sent.aggregate_id);
        assert_eq!(line.headers.get("tenant").map(String::as_str), Some("acme"));
        assert_eq!(
            line.destination,
            receiver.url_for(&format!("/hook/{}", sent.aggregate_type))
        );
    }
}

#[tokio::test]
async fn a_refused_request_is_split_so_only_the_poison_event_is_refused() {
    let receiver = HttpReceiver::start().await.expect("receiver");
    receiver.respond_when(|request| {
        std::str::from_utf8(&request.body)
            .is_ok_and(|body| body.contains("poison"))
            .then_some(400)
    });
    let sink = sink(&receiver, 100, |_| {}).await;
    let batch: Vec<Event> = (0..6)
        .map(|i| {
            let payload = if i == 3 { "\"poison\"" } else { "\"fine\"" };
            event("Order", &format!("o_{i}"), payload.as_bytes())
        })
        .collect();

    let deliveries = sink.publish(&batch).await.expect("publishes");
    let kinds: Vec<Option<SinkErrorKind>> = deliveries
        .iter()
        .map(|d| d.as_ref().err().map(|e| e.kind()))
        .collect();
    assert_eq!(
        kinds,
        [None, None, None, Some(SinkErrorKind::Rejected), None, None]
    );
    let reason = deliveries[3].as_ref().expect_err("refused").to_string();
    assert!(reason.contains("HTTP 400"), "{reason}");

    let requests = receiver.received();
    let per_request: Vec<usize> = requests.iter().map(|r| lines(r).len()).collect();
    assert_eq!(
        per_request.len(),
        7,
        "one request of 6, then 6 of one: {per_request:?}"
    );
    assert_eq!(per_request[0], 6);
    let accepted: usize = requests
        .iter()
        .filter(|r| r.accepted())
        .map(|r| lines(r).len())
        .sum();
    assert_eq!(accepted, 5, "every event but the poison one was accepted");
}

#[tokio::test]
async fn a_transient_answer_fails_every_event_of_the_request_without_splitting() {
    let receiver = HttpReceiver::start().await.expect("receiver");
    receiver.respond_with(503);
    let sink = sink(&receiver, 100, |_| {}).await;
    let batch: Vec<Event> = (0..4)
        .map(|i| event("Order", &format!("o_{i}"), b"{}"))
        .collect();
    let deliveries = sink.publish(&batch).await.expect("publishes");
    assert!(
        deliveries
            .iter()
            .all(|d| matches!(d, Err(e) if e.kind() == SinkErrorKind::Transient)),
        "{deliveries:?}"
    );
    assert_eq!(
        receiver.received().len(),
        1,
        "a 503 is retried later, not split"
    );
}

#[tokio::test]
async fn a_signed_batch_verifies_over_its_body_with_a_stable_id() {
    let receiver = HttpReceiver::start().await.expect("receiver");
    let sink = sink(&receiver, 10, |config| {
        config.secret = Some(Secret::new(SECRET))
    })
    .await;
    let batch: Vec<Event> = (0..3)
        .map(|i| event("Order", &format!("o_{i}"), b"{\"a\":1}"))
        .collect();
    sink.publish(&batch).await.expect("publishes");
    sink.publish(&batch).await.expect("publishes again");

    let requests = receiver.received();
    assert_eq!(requests.len(), 2);
    let key = STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .expect("base64");
    for request in &requests {
        let id = request.header("webhook-id").expect("webhook-id");
        assert!(id.starts_with("batch_"), "{id}");
        let timestamp = request.header("webhook-timestamp").expect("timestamp");
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("key");
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(&request.body);
        let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
        assert_eq!(request.header("webhook-signature"), Some(expected.as_str()));
    }
    assert_eq!(
        requests[0].header("webhook-id"),
        requests[1].header("webhook-id"),
        "the same events sent again carry the same webhook-id"
    );
}

#[tokio::test]
async fn a_cloudevents_batch_is_a_json_array_of_envelopes() {
    let receiver = HttpReceiver::start().await.expect("receiver");
    let sink = sink(&receiver, 10, |config| {
        config.format = outbox_core::cloudevents::Format::CloudeventsStructured;
    })
    .await;
    let batch: Vec<Event> = (0..3)
        .map(|i| {
            event(
                "Order",
                &format!("o_{i}"),
                format!("{{\"n\":{i}}}").as_bytes(),
            )
        })
        .collect();
    let deliveries = sink.publish(&batch).await.expect("publishes");
    assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");

    let requests = receiver.received();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].header("content-type"),
        Some("application/cloudevents-batch+json")
    );
    let body = requests[0].json().expect("JSON");
    let envelopes = body.as_array().expect("an array");
    assert_eq!(envelopes.len(), 3);
    for (envelope, sent) in envelopes.iter().zip(&batch) {
        assert_eq!(envelope["specversion"], "1.0");
        assert_eq!(envelope["id"], sent.id.to_string());
        assert_eq!(envelope["subject"], sent.aggregate_id);
        let data: serde_json::Value = serde_json::from_slice(&sent.payload).expect("JSON");
        assert_eq!(envelope["data"], data);
    }
}

#[tokio::test]
async fn an_unreachable_endpoint_fails_the_whole_batch_as_unavailable() {
    let receiver = HttpReceiver::start().await.expect("receiver");
    let sink = sink(&receiver, 10, |_| {}).await;
    receiver.stop().await;
    let batch: Vec<Event> = (0..3)
        .map(|i| event("Order", &format!("o_{i}"), b"{}"))
        .collect();
    let err = sink.publish(&batch).await.expect_err("unavailable");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
}
