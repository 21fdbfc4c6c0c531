//! The NATS JetStream sink against a real `nats-server -js` on 127.0.0.1.
//!
//! Tests share the testkit's NATS server (`OUTBOX_TEST_NATS_URL`, else one private server per
//! test process) and keep apart with a unique subject prefix and stream name each. The
//! outage test starts its own, since it stops it.

#![cfg(feature = "nats")]

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use bytes::Bytes;
use futures::StreamExt as _;
use outbox_core::{Destination, Event, Position, Sink, SinkErrorKind};
use outbox_sinks::{NatsConfig, NatsSink};
use outbox_testkit::services::Nats;
use outbox_testkit::wait::eventually;
use time::OffsetDateTime;
use uuid::Uuid;

/// A prefix no other test uses, valid as a subject token and (upper-cased) a stream name.
fn unique() -> String {
    format!("t{}", &Uuid::now_v7().simple().to_string()[20..])
}

fn config(url: &str, prefix: &str) -> NatsConfig {
    NatsConfig {
        url: url.to_owned(),
        destination: Destination::parse(&format!("{prefix}.event.{{aggregate_type}}"))
            .expect("valid"),
        stream: prefix.to_uppercase(),
        ack_timeout: Duration::from_secs(5),
        ..NatsConfig::default()
    }
}

fn event(aggregate_type: &str, aggregate_id: &str, payload: impl Into<Bytes>) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(1),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: format!("{}.happened", aggregate_type.to_lowercase()),
        payload: payload.into(),
        headers: vec![("tenant".to_owned(), "acme".to_owned())],
        created_at: OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

/// Every message of `stream`, in stream order, read with a JetStream pull consumer.
async fn read_stream(nats: &Nats, stream: &str, expected: usize) -> Vec<jetstream::Message> {
    let js = jetstream::new(nats.connect().await.expect("connects"));
    let stream = js.get_stream(stream).await.expect("stream exists");
    let consumer = stream
        .create_consumer(pull::Config::default())
        .await
        .expect("consumer");
    let messages: Vec<_> = consumer
        .batch()
        .max_messages(expected + 1)
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .expect("batch")
        .map(|m| m.expect("message"))
        .collect()
        .await;
    assert_eq!(messages.len(), expected, "messages in stream");
    messages
}

async fn stored_messages(nats: &Nats, stream: &str) -> u64 {
    let js = jetstream::new(nats.connect().await.expect("connects"));
    let mut stream = js.get_stream(stream).await.expect("stream exists");
    stream.info().await.expect("info").state.messages
}

fn header<'m>(message: &'m jetstream::Message, name: &str) -> Option<&'m str> {
    message.headers.as_ref()?.get(name).map(|v| v.as_str())
}

#[tokio::test]
async fn a_batch_arrives_with_exact_bytes_headers_and_subjects() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let sink = config(nats.url(), &prefix).build().await.expect("builds");
    assert_eq!(
        sink.stream(),
        prefix.to_uppercase(),
        "creates the configured stream"
    );

    let mut batch = vec![
        event("Order", "o_1", &br#"{"total_cents":1250}"#[..]),
        event("Invoice", "i_1", &b"\x00\xffbinary\r\nbytes"[..]),
        event("Order", "o_1", Bytes::new()),
    ];
    batch[1]
        .headers
        .push(("trace-id".to_owned(), "abc-123".to_owned()));
    let deliveries = sink.publish(&batch).await.expect("publishes");
    assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");

    let messages = read_stream(nats, sink.stream(), 3).await;
    for (sent, got) in batch.iter().zip(&messages) {
        assert_eq!(
            got.subject.as_str(),
            format!("{prefix}.event.{}", sent.aggregate_type)
        );
        assert_eq!(
            got.payload, sent.payload,
            "body is the payload bytes exactly"
        );
        let id = sent.id.to_string();
        assert_eq!(header(got, "id"), Some(id.as_str()));
        assert_eq!(header(got, "Nats-Msg-Id"), Some(id.as_str()));
        assert_eq!(header(got, "event_type"), Some(sent.event_type.as_str()));
        assert_eq!(
            header(got, "aggregate_type"),
            Some(sent.aggregate_type.as_str())
        );
        assert_eq!(
            header(got, "aggregate_id"),
            Some(sent.aggregate_id.as_str())
        );
        assert_eq!(header(got, "tenant"), Some("acme"));
    }
    assert_eq!(header(&messages[1], "trace-id"), Some("abc-123"));
    assert_eq!(header(&messages[0], "trace-id"), None);
}

#[tokio::test]
async fn events_of_one_aggregate_keep_their_order_across_batches() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let sink = config(nats.url(), &prefix).build().await.expect("builds");

    let mut sent = Vec::new();
    for round in 0..5 {
        let batch: Vec<Event> = ["a", "b", "c"]
            .iter()
            .map(|id| event("Order", id, format!("{id}-{round}")))
            .collect();
        let deliveries = sink.publish(&batch).await.expect("publishes");
        assert!(deliveries.iter().all(Result::is_ok));
        sent.extend(batch);
    }

    let messages = read_stream(nats, sink.stream(), sent.len()).await;
    for key in ["a", "b", "c"] {
        let got: Vec<&[u8]> = messages
            .iter()
            .filter(|m| header(m, "aggregate_id") == Some(key))
            .map(|m| &m.payload[..])
            .collect();
        let expected: Vec<Vec<u8>> = (0..5).map(|r| format!("{key}-{r}").into_bytes()).collect();
        assert_eq!(
            got,
            expected.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            "order of {key}"
        );
    }
}

#[tokio::test]
async fn republishing_an_event_stores_it_once() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let sink = config(nats.url(), &prefix).build().await.expect("builds");

    let e = event("Order", "o_1", &b"once"[..]);
    for _ in 0..2 {
        let deliveries = sink
            .publish(std::slice::from_ref(&e))
            .await
            .expect("publishes");
        assert!(
            deliveries[0].is_ok(),
            "a duplicate is acknowledged too: {deliveries:?}"
        );
    }
    assert_eq!(stored_messages(nats, sink.stream()).await, 1);
}

#[tokio::test]
async fn oversized_payload_is_rejected_while_the_rest_of_the_batch_flows() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let limit = nats
        .connect()
        .await
        .expect("connects")
        .server_info()
        .max_payload;
    let prefix = unique();
    let sink = config(nats.url(), &prefix).build().await.expect("builds");

    let batch = vec![
        event("Order", "o_1", &b"small"[..]),
        event("Order", "o_2", vec![b'x'; limit + 1]),
        event("Order", "o_3", &b"small too"[..]),
    ];
    let deliveries = sink
        .publish(&batch)
        .await
        .expect("the batch as a whole goes through");
    assert!(
        deliveries[0].is_ok() && deliveries[2].is_ok(),
        "{deliveries:?}"
    );
    let err = deliveries[1].as_ref().expect_err("too big");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    let reason = err.to_string();
    assert!(
        reason.contains(&format!("limit of {limit} bytes")),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("payload {}", limit + 1)),
        "{reason}"
    );

    let messages = read_stream(nats, sink.stream(), 2).await;
    assert_eq!(&messages[0].payload[..], b"small");
    assert_eq!(&messages[1].payload[..], b"small too");
}

#[tokio::test]
async fn a_configured_max_payload_lowers_the_servers_limit() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let mut config = config(nats.url(), &prefix);
    config.max_payload = std::num::NonZeroUsize::new(1000);
    let sink = config.build().await.expect("builds");

    let deliveries = sink
        .publish(&[
            event("Order", "o_1", vec![0u8; 1000]),
            event("Order", "o_2", vec![0u8; 10]),
        ])
        .await
        .expect("publishes");
    let err = deliveries[0]
        .as_ref()
        .expect_err("over the configured limit with headers");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(err.to_string().contains("limit of 1000 bytes"), "{err}");
    assert!(deliveries[1].is_ok());
}

#[tokio::test]
async fn an_aggregate_id_that_makes_an_invalid_subject_is_rejected() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let mut config = config(nats.url(), &prefix);
    config.destination =
        Destination::parse(&format!("{prefix}.agg.{{aggregate_id}}")).expect("valid");
    let sink = config.build().await.expect("builds");

    let batch = vec![
        event("Order", "has space", &b"1"[..]),
        event("Order", "a..b", &b"2"[..]),
        event("Order", "*", &b"3"[..]),
        event("Order", "ok_1", &b"4"[..]),
    ];
    let deliveries = sink.publish(&batch).await.expect("publishes");
    for d in &deliveries[..3] {
        let err = d.as_ref().expect_err("invalid subject");
        assert_eq!(err.kind(), SinkErrorKind::Rejected, "{err}");
        assert!(err.to_string().contains("subject"), "{err}");
    }
    assert!(deliveries[3].is_ok());
    let messages = read_stream(nats, sink.stream(), 1).await;
    assert_eq!(messages[0].subject.as_str(), format!("{prefix}.agg.ok_1"));
}

#[tokio::test]
async fn a_subject_no_stream_captures_is_transient() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let mut config = config(nats.url(), &prefix);
    config.destination =
        Destination::parse(&format!("{prefix}.{{aggregate_type}}")).expect("valid");
    config.stream_subjects = Some(vec![format!("{prefix}.Order")]);
    let sink = config.build().await.expect("builds");

    let deliveries = sink
        .publish(&[
            event("Order", "o_1", &b"1"[..]),
            event("Invoice", "i_1", &b"2"[..]),
        ])
        .await
        .expect("publishes");
    assert!(deliveries[0].is_ok());
    let err = deliveries[1].as_ref().expect_err("no stream");
    assert_eq!(err.kind(), SinkErrorKind::Transient);
    assert!(
        err.to_string().contains(&format!("{prefix}.Invoice")),
        "{err}"
    );
}

#[tokio::test]
async fn an_existing_stream_that_captures_the_subjects_is_reused() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let existing = format!("EXISTING_{}", prefix.to_uppercase());
    let js = jetstream::new(nats.connect().await.expect("connects"));
    js.create_stream(jetstream::stream::Config {
        name: existing.clone(),
        subjects: vec![format!("{prefix}.event.>")],
        ..Default::default()
    })
    .await
    .expect("creates the existing stream");

    let config = config(nats.url(), &prefix);
    let configured = config.stream.clone();
    let sink = config.build().await.expect("builds");
    assert_eq!(sink.stream(), existing);
    assert!(
        js.get_stream(&configured).await.is_err(),
        "no stream `{configured}` was created"
    );

    let deliveries = sink
        .publish(&[event("Order", "o_1", &b"x"[..])])
        .await
        .expect("publishes");
    assert!(deliveries[0].is_ok());
    assert_eq!(stored_messages(nats, &existing).await, 1);
    sink.healthcheck().await.expect("healthy");
}

#[tokio::test]
async fn a_deleted_stream_fails_the_healthcheck_with_its_name() {
    let nats = Nats::shared().await.expect("nats-server starts");
    let prefix = unique();
    let sink = config(nats.url(), &prefix).build().await.expect("builds");
    sink.healthcheck().await.expect("healthy");

    let js = jetstream::new(nats.connect().await.expect("connects"));
    js.delete_stream(sink.stream()).await.expect("deletes");
    let err = sink.healthcheck().await.expect_err("stream gone");
    assert!(
        err.to_string()
            .contains(&format!("stream `{}` does not exist", sink.stream())),
        "{err}"
    );
}

#[tokio::test]
async fn a_stopped_server_fails_the_whole_batch_as_unavailable_and_the_healthcheck_says_so() {
    let nats = Nats::start().await.expect("nats-server starts");
    let sink: NatsSink = config(nats.url(), &unique()).build().await.expect("builds");
    let batch = [
        event("Order", "o_1", &b"before"[..]),
        event("Order", "o_2", &b"before"[..]),
    ];
    assert!(
        sink.publish(&batch)
            .await
            .expect("publishes")
            .iter()
            .all(Result::is_ok)
    );

    nats.stop().await.expect("stops");
    eventually(Duration::from_secs(10), || async {
        sink.healthcheck().await.is_err()
    })
    .await
    .expect("the client notices the outage");
    let err = sink.healthcheck().await.expect_err("down");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    let text = err.to_string();
    assert!(
        text.contains(nats.url()) && text.contains("NATS connection"),
        "{text}"
    );

    let err = sink.publish(&batch).await.expect_err("whole batch fails");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable, "{err}");

    nats.restart().await.expect("restarts");
    eventually(Duration::from_secs(15), || async {
        sink.healthcheck().await.is_ok()
    })
    .await
    .expect("the client reconnects");
    let after = [event("Order", "o_3", &b"after"[..])];
    assert!(
        sink.publish(&after)
            .await
            .expect("publishes")
            .iter()
            .all(Result::is_ok)
    );
}

#[tokio::test]
async fn building_against_a_closed_port_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binds")
        .local_addr()
        .expect("addr")
        .port();
    let mut config = config(&format!("nats://127.0.0.1:{port}"), &unique());
    config.connect_timeout = Duration::from_secs(2);
    let err = config.build().await.expect_err("nothing listens");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test]
async fn an_invalid_config_is_rejected_before_connecting() {
    let config = NatsConfig {
        stream: "BAD.NAME".to_owned(),
        ..NatsConfig::default()
    };
    let err = config.build().await.expect_err("invalid");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(err.to_string().starts_with("sink.stream: "), "{err}");
}
