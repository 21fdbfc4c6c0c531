//! The RabbitMQ sink against a real broker: what the conformance suite does not cover
//! (mandatory returns, nacks, AMQP properties, exchange setup, the broker's own size limit).
//!
//! Tests share the testkit's broker (`OUTBOX_TEST_AMQP_URL`, else one started per test
//! process; it refuses messages over 1 MiB) and keep apart with unique exchange and queue
//! names.

#![cfg(feature = "rabbitmq")]

#[path = "support/amqp.rs"]
mod amqp;

use std::num::NonZeroUsize;
use std::time::Duration;

use bytes::Bytes;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_core::{Destination, Event, Position, Sink, SinkErrorKind};
use outbox_sinks::{RabbitMqConfig, RabbitMqSink};
use outbox_testkit::services::RabbitMq;
use time::OffsetDateTime;
use uuid::Uuid;

/// A name no other test uses.
fn unique() -> String {
    format!("t{}", &Uuid::now_v7().simple().to_string()[20..])
}

fn config(broker: &RabbitMq, scope: &str) -> RabbitMqConfig {
    RabbitMqConfig {
        url: broker.url().to_owned(),
        exchange: format!("x.{scope}"),
        destination: Destination::parse(&format!("{scope}.event.{{aggregate_type}}"))
            .expect("valid"),
        connect_timeout: Duration::from_secs(2),
        confirm_timeout: Duration::from_secs(5),
        ..RabbitMqConfig::default()
    }
}

/// A durable queue that receives every routing key under `scope.`; its name.
async fn scope_queue(broker: &RabbitMq, scope: &str) -> String {
    let queue = format!("q.{scope}");
    amqp::bind_queue(
        broker.url(),
        &format!("x.{scope}"),
        &queue,
        &format!("{scope}.#"),
        FieldTable::default(),
    )
    .await
    .expect("queue bound");
    queue
}

/// A sink for `scope` and a durable queue that receives every routing key under `scope.`.
async fn sink_with_queue(broker: &RabbitMq, scope: &str) -> (RabbitMqSink, String) {
    let queue = scope_queue(broker, scope).await;
    let sink = config(broker, scope).build().await.expect("builds");
    (sink, queue)
}

fn event(aggregate_type: &str, aggregate_id: &str, payload: impl Into<Bytes>) -> Event {
    Event {
        id: Uuid::now_v7(),
        position: Position(1),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: aggregate_id.to_owned(),
        event_type: format!("{}.placed", aggregate_type.to_lowercase()),
        payload: payload.into(),
        headers: Vec::new(),
        created_at: OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

async fn connect(broker: &RabbitMq) -> Connection {
    Connection::connect(broker.url(), ConnectionProperties::default())
        .await
        .expect("connects")
}

#[tokio::test]
async fn an_unroutable_message_is_rejected_instead_of_dropped() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    // The queue receives `Order` routing keys only.
    amqp::bind_queue(
        broker.url(),
        &format!("x.{scope}"),
        &format!("q.{scope}"),
        &format!("{scope}.event.Order"),
        FieldTable::default(),
    )
    .await
    .expect("queue bound");
    let sink = config(broker, &scope).build().await.expect("builds");

    let batch = [
        event("Order", "o_1", "routed"),
        event("Invoice", "i_1", "nowhere"),
    ];
    let deliveries = sink.publish(&batch).await.expect("publishes");
    assert!(deliveries[0].is_ok(), "{deliveries:?}");
    let err = deliveries[1].as_ref().expect_err("no queue for Invoice");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string().starts_with(&format!(
            "no queue bound for routing key `{scope}.event.Invoice` on exchange `x.{scope}`"
        )),
        "{err}"
    );
    assert!(err.to_string().contains("312 NO_ROUTE"), "{err}");

    let got = amqp::read_queue(broker.url(), &format!("q.{scope}"), 1)
        .await
        .expect("reads");
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].received.body[..], b"routed");
}

#[tokio::test]
async fn without_mandatory_an_unroutable_message_counts_as_delivered() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let mut config = config(broker, &unique());
    config.mandatory = false;
    let sink = config.build().await.expect("builds");
    let deliveries = sink
        .publish(&[event("Order", "o_1", "dropped by the broker")])
        .await
        .expect("publishes");
    assert!(deliveries[0].is_ok(), "{deliveries:?}");
}

#[tokio::test]
async fn messages_are_persistent_and_carry_the_event_id_as_message_id() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let (sink, queue) = sink_with_queue(broker, &scope).await;
    let mut e = event("Order", "o_1", &br#"{"total_cents":1250}"#[..]);
    e.headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("tenant".to_owned(), "acme".to_owned()),
    ];
    let deliveries = sink
        .publish(std::slice::from_ref(&e))
        .await
        .expect("publishes");
    assert!(deliveries[0].is_ok(), "{deliveries:?}");

    let got = amqp::read_queue(broker.url(), &queue, 1)
        .await
        .expect("reads");
    let p = &got[0].properties;
    let id = e.id.to_string();
    assert_eq!(
        p.message_id().as_ref().map(ShortString::as_str),
        Some(id.as_str())
    );
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        p.content_type().as_ref().map(ShortString::as_str),
        Some("application/json")
    );
    assert_eq!(
        p.kind().as_ref().map(ShortString::as_str),
        Some("order.placed")
    );
    assert_eq!(p.app_id().as_ref().map(ShortString::as_str), Some("outbox"));
    assert_eq!(
        *p.timestamp(),
        Some(u64::try_from(e.created_at.unix_timestamp()).expect("after 1970"))
    );
    let headers = p.headers().as_ref().expect("headers").inner();
    assert!(
        matches!(headers.get("tenant"), Some(AMQPValue::LongString(v)) if v.as_bytes() == b"acme"),
        "{headers:?}"
    );
}

#[tokio::test]
async fn a_batch_spread_over_four_channels_arrives_whole_and_once() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let queue = scope_queue(broker, &scope).await;
    let sink = RabbitMqConfig {
        channels: NonZeroUsize::new(4).expect("not zero"),
        ..config(broker, &scope)
    }
    .build()
    .await
    .expect("builds");
    let batch: Vec<Event> = (0..41)
        .map(|i| event("Order", &format!("o_{i}"), format!("{{\"n\":{i}}}")))
        .collect();
    for round in 0..2 {
        let deliveries = sink
            .publish(&batch[round * 20..round * 20 + 21])
            .await
            .expect("publishes");
        assert!(deliveries.iter().all(Result::is_ok), "{deliveries:?}");
    }
    let got = amqp::read_queue(broker.url(), &queue, 42)
        .await
        .expect("reads");
    let mut ids: Vec<String> = got
        .iter()
        .map(|m| {
            m.properties
                .message_id()
                .as_ref()
                .map(|id| id.as_str().to_owned())
                .expect("message id")
        })
        .collect();
    ids.sort();
    // Events 0..=40, event 20 in both rounds.
    let mut expected: Vec<String> = batch.iter().map(|e| e.id.to_string()).collect();
    expected.push(batch[20].id.to_string());
    expected.sort();
    assert_eq!(ids, expected);
}

#[tokio::test]
async fn a_full_queue_that_rejects_publishes_makes_the_nack_transient() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    amqp::bind_queue(
        broker.url(),
        &format!("x.{scope}"),
        &format!("q.{scope}"),
        &format!("{scope}.#"),
        arguments,
    )
    .await
    .expect("queue bound");
    let sink = config(broker, &scope).build().await.expect("builds");

    let first = sink
        .publish(&[event("Order", "o_1", "fits")])
        .await
        .expect("publishes");
    assert!(first[0].is_ok(), "{first:?}");
    let second = sink
        .publish(&[event("Order", "o_2", "queue is full")])
        .await
        .expect("publishes");
    let err = second[0].as_ref().expect_err("nacked");
    assert_eq!(err.kind(), SinkErrorKind::Transient);
    assert!(err.to_string().contains("basic.nack"), "{err}");
}

#[tokio::test]
async fn the_brokers_own_size_limit_rejects_the_message_and_is_learned() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let queue = format!("q.{scope}");
    amqp::bind_queue(
        broker.url(),
        &format!("x.{scope}"),
        &queue,
        &format!("{scope}.#"),
        FieldTable::default(),
    )
    .await
    .expect("queue bound");
    // The sink allows 16 MiB; the broker only 1 MiB.
    let sink = config(broker, &scope).build().await.expect("builds");
    assert_eq!(sink.max_message_size(), 16 * 1024 * 1024);

    let too_big = RabbitMq::MAX_MESSAGE_SIZE + 1;
    let batch = [
        event("Order", "o_1", "before"),
        event("Order", "o_2", vec![b'x'; too_big]),
        event("Order", "o_3", "after"),
    ];
    let deliveries = sink.publish(&batch).await.expect("publishes");
    let err = deliveries[1].as_ref().expect_err("over the broker's limit");
    assert_eq!(err.kind(), SinkErrorKind::Rejected, "{err}");
    assert!(
        err.to_string().contains(&format!(
            "message of {too_big} bytes exceeds the limit of {} bytes",
            RabbitMq::MAX_MESSAGE_SIZE
        )),
        "{err}"
    );
    // The broker closed the channel over it: the other events of the batch that were not
    // confirmed by then are released (published again, no attempt counted).
    for d in [&deliveries[0], &deliveries[2]] {
        if let Err(e) = d {
            assert_eq!(e.kind(), SinkErrorKind::Unavailable, "{e}");
        }
    }
    assert_eq!(
        sink.max_message_size(),
        RabbitMq::MAX_MESSAGE_SIZE,
        "learned"
    );

    // Next time the sink refuses it before sending, and the channel stays open.
    let deliveries = sink
        .publish(&[
            batch[0].clone(),
            event("Order", "o_2", vec![b'x'; too_big]),
            batch[2].clone(),
        ])
        .await
        .expect("publishes");
    assert_eq!(
        deliveries[1].as_ref().map_err(|e| e.kind()),
        Err(SinkErrorKind::Rejected)
    );
    assert!(
        deliveries[0].is_ok() && deliveries[2].is_ok(),
        "{deliveries:?}"
    );
    let got = amqp::read_queue(broker.url(), &queue, 2)
        .await
        .expect("reads");
    for body in [&b"before"[..], b"after"] {
        assert!(
            got.iter().any(|m| &m.received.body[..] == body),
            "{body:?} is lost"
        );
    }
}

#[tokio::test]
async fn an_existing_exchange_of_another_type_is_refused_at_start() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let connection = connect(broker).await;
    let channel = connection.create_channel().await.expect("channel");
    channel
        .exchange_declare(
            format!("x.{scope}").into(),
            ExchangeKind::Fanout,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declares a fanout exchange");

    let err = config(broker, &scope)
        .build()
        .await
        .expect_err("wrong type");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string()
            .contains(&format!("exchange `x.{scope}` exists on RabbitMQ at")),
        "{err}"
    );
    assert!(
        err.to_string().contains("declare_exchange = false"),
        "{err}"
    );

    let mut as_it_is = config(broker, &scope);
    as_it_is.declare_exchange = false;
    as_it_is.mandatory = false;
    let sink = as_it_is.build().await.expect("uses the fanout exchange");
    sink.healthcheck().await.expect("healthy");
}

#[tokio::test]
async fn a_missing_exchange_is_refused_when_the_sink_may_not_declare_it() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let mut config = config(broker, &scope);
    config.declare_exchange = false;
    let err = config.build().await.expect_err("no such exchange");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string()
            .starts_with(&format!("exchange `x.{scope}` does not exist")),
        "{err}"
    );
}

#[tokio::test]
async fn a_deleted_exchange_fails_the_healthcheck_and_publishes_as_transient() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let (sink, _queue) = sink_with_queue(broker, &scope).await;
    sink.healthcheck().await.expect("healthy");

    let connection = connect(broker).await;
    let channel = connection.create_channel().await.expect("channel");
    channel
        .exchange_delete(
            format!("x.{scope}").into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await
        .expect("deletes");

    let err = sink.healthcheck().await.expect_err("exchange gone");
    assert_eq!(err.kind(), SinkErrorKind::Transient);
    assert!(
        err.to_string()
            .starts_with(&format!("exchange `x.{scope}` does not exist")),
        "{err}"
    );
    let deliveries = sink
        .publish(&[event("Order", "o_1", "x")])
        .await
        .expect("per-event results");
    let err = deliveries[0].as_ref().expect_err("exchange gone");
    assert_eq!(err.kind(), SinkErrorKind::Transient, "{err}");
}

#[tokio::test]
async fn wrong_credentials_are_refused_without_printing_the_password() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let url = broker.url().replace("guest:guest@", "guest:hunter2@");
    let config = RabbitMqConfig {
        url,
        ..config(broker, &unique())
    };
    let err = config.build().await.expect_err("bad password");
    assert_eq!(err.kind(), SinkErrorKind::Rejected, "{}", err.report());
    assert!(err.to_string().contains("refused the credentials"), "{err}");
    assert!(!err.report().contains("hunter2"), "{}", err.report());
    assert!(err.report().contains("guest:***@"), "{}", err.report());
}

#[tokio::test]
async fn building_against_a_closed_port_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binds")
        .local_addr()
        .expect("addr")
        .port();
    let config = RabbitMqConfig {
        url: format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        connect_timeout: Duration::from_secs(2),
        ..RabbitMqConfig::default()
    };
    let err = config.build().await.expect_err("nothing listens");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test]
async fn a_routing_key_over_255_bytes_is_rejected() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let scope = unique();
    let mut config = config(broker, &scope);
    config.destination = Destination::parse(&format!("{scope}.{{aggregate_id}}")).expect("valid");
    config.max_message_size = NonZeroUsize::new(1024).expect("not zero");
    config.mandatory = false;
    let sink = config.build().await.expect("builds");
    let deliveries = sink
        .publish(&[
            event("Order", &"o".repeat(300), "long key"),
            event("Order", "o_1", vec![0u8; 1025]),
            event("Order", "o_2", "fine"),
        ])
        .await
        .expect("publishes");
    let err = deliveries[0].as_ref().expect_err("key too long");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(err.to_string().contains("over AMQP's 255"), "{err}");
    let err = deliveries[1].as_ref().expect_err("over max_message_size");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(err.to_string().contains("limit of 1024 bytes"), "{err}");
    assert!(deliveries[2].is_ok(), "{deliveries:?}");
}
