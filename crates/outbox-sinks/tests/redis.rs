//! The Redis Streams sink against a real `redis-server`: what the conformance suite does not
//! cover (the exact field layout, `MAXLEN ~`, `WRONGTYPE`, limits, credentials).
//!
//! Tests share the testkit's server (`OUTBOX_TEST_REDIS_URL`, else one started per test
//! process, which accepts arguments up to 1 MiB) and keep apart with unique stream keys.

#![cfg(feature = "redis")]

use std::num::NonZeroUsize;
use std::time::Duration;

use bytes::Bytes;
use outbox_core::{Destination, Event, Position, Sink, SinkErrorKind};
use outbox_sinks::RedisConfig;
use outbox_testkit::services::Redis;
use redis::aio::MultiplexedConnection;
use time::OffsetDateTime;
use uuid::Uuid;

/// A key prefix no other test uses.
fn unique() -> String {
    format!("t{}", &Uuid::now_v7().simple().to_string()[20..])
}

fn config(redis: &Redis, scope: &str) -> RedisConfig {
    RedisConfig {
        url: redis.url().to_owned(),
        destination: Destination::parse(&format!("{scope}.{{aggregate_type}}")).expect("valid"),
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(3),
        ..RedisConfig::default()
    }
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

async fn connection(redis: &Redis) -> MultiplexedConnection {
    redis::Client::open(redis.url())
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects")
}

/// The fields of every entry of `stream`, in order, values as bytes.
async fn entries(redis: &Redis, stream: &str) -> Vec<Vec<(String, Vec<u8>)>> {
    let reply: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(&mut connection(redis).await)
        .await
        .expect("XRANGE");
    reply
        .into_iter()
        .map(|(_, flat)| {
            flat.chunks(2)
                .map(|pair| {
                    (
                        String::from_utf8(pair[0].clone()).expect("utf-8"),
                        pair[1].clone(),
                    )
                })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn an_entry_has_the_documented_field_layout() {
    let redis = Redis::shared().await.expect("redis-server starts");
    let scope = unique();
    let sink = config(redis, &scope).build().await.expect("builds");
    let mut e = event("Order", "o_1", &b"\x00{\"total\":1}\xff"[..]);
    e.headers = vec![
        ("tenant".to_owned(), "acme".to_owned()),
        ("payload".to_owned(), "not the payload".to_owned()),
    ];
    let deliveries = sink
        .publish(std::slice::from_ref(&e))
        .await
        .expect("publishes");
    assert!(deliveries[0].is_ok(), "{deliveries:?}");

    let got = entries(redis, &format!("{scope}.Order")).await;
    let expected: Vec<(String, Vec<u8>)> = [
        ("id", e.id.to_string().into_bytes()),
        ("event_type", b"order.placed".to_vec()),
        ("aggregate_type", b"Order".to_vec()),
        ("aggregate_id", b"o_1".to_vec()),
        ("h:tenant", b"acme".to_vec()),
        ("h:payload", b"not the payload".to_vec()),
        ("payload", e.payload.to_vec()),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v))
    .collect();
    assert_eq!(got, vec![expected]);
}

#[tokio::test]
async fn maxlen_trims_each_stream_approximately() {
    let redis = Redis::shared().await.expect("redis-server starts");
    let scope = unique();
    let mut config = config(redis, &scope);
    config.maxlen = NonZeroUsize::new(10);
    let sink = config.build().await.expect("builds");
    for round in 0..30 {
        let batch: Vec<Event> = (0..10)
            .map(|i| event("Order", &format!("o_{i}"), format!("{round}-{i}")))
            .collect();
        let deliveries = sink.publish(&batch).await.expect("publishes");
        assert!(deliveries.iter().all(Result::is_ok));
    }
    let len: usize = redis::cmd("XLEN")
        .arg(format!("{scope}.Order"))
        .query_async(&mut connection(redis).await)
        .await
        .expect("XLEN");
    // `~` trims whole macro nodes (100 entries by default): far fewer than the 300 appended,
    // at least the 10 asked for.
    assert!((10..300).contains(&len), "stream holds {len} entries");
}

#[tokio::test]
async fn a_key_that_is_not_a_stream_rejects_only_its_events() {
    let redis = Redis::shared().await.expect("redis-server starts");
    let scope = unique();
    let _: () = redis::cmd("SET")
        .arg(format!("{scope}.Invoice"))
        .arg("a string")
        .query_async(&mut connection(redis).await)
        .await
        .expect("SET");
    let sink = config(redis, &scope).build().await.expect("builds");
    let deliveries = sink
        .publish(&[event("Order", "o_1", "a"), event("Invoice", "i_1", "b")])
        .await
        .expect("publishes");
    assert!(deliveries[0].is_ok(), "{deliveries:?}");
    let err = deliveries[1].as_ref().expect_err("WRONGTYPE");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string().starts_with(&format!(
            "key `{scope}.Invoice` holds a value that is not a stream"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn the_servers_argument_limit_is_read_and_a_configured_one_lowers_it() {
    let redis = Redis::shared().await.expect("redis-server starts");
    let scope = unique();
    let sink = config(redis, &scope).build().await.expect("builds");
    assert_eq!(
        sink.max_payload(),
        Redis::MAX_BULK_LEN,
        "CONFIG GET proto-max-bulk-len"
    );

    let mut lowered = config(redis, &scope);
    lowered.max_payload = NonZeroUsize::new(100);
    let sink = lowered.build().await.expect("builds");
    let mut long_header = event("Order", "o_2", "small");
    long_header.headers = vec![("note".to_owned(), "n".repeat(101))];
    let deliveries = sink
        .publish(&[
            event("Order", "o_1", vec![0u8; 101]),
            long_header,
            event("Order", "o_3", vec![0u8; 100]),
        ])
        .await
        .expect("publishes");
    let err = deliveries[0].as_ref().expect_err("payload over 100 bytes");
    assert_eq!(err.kind(), SinkErrorKind::Rejected);
    assert!(
        err.to_string()
            .starts_with("payload of 101 bytes exceeds the limit of 100 bytes"),
        "{err}"
    );
    let err = deliveries[1].as_ref().expect_err("header over 100 bytes");
    assert!(err.to_string().starts_with("header of 101 bytes"), "{err}");
    assert!(deliveries[2].is_ok(), "{deliveries:?}");
}

#[tokio::test]
async fn wrong_credentials_are_refused_without_printing_the_password() {
    let redis = Redis::shared().await.expect("redis-server starts");
    let user = unique();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(">right-password")
        .arg("~*")
        .arg("+@all")
        .query_async(&mut connection(redis).await)
        .await
        .expect("ACL SETUSER");
    let url = redis
        .url()
        .replace("redis://", &format!("redis://{user}:hunter2@"));
    let err = RedisConfig {
        url,
        ..config(redis, &user)
    }
    .build()
    .await
    .expect_err("wrong password");
    assert_eq!(err.kind(), SinkErrorKind::Rejected, "{}", err.report());
    assert!(err.to_string().contains("refused the credentials"), "{err}");
    assert!(!err.report().contains("hunter2"), "{}", err.report());

    let url = redis
        .url()
        .replace("redis://", &format!("redis://{user}:right-password@"));
    let sink = RedisConfig {
        url,
        ..config(redis, &user)
    }
    .build()
    .await
    .expect("the right password works");
    sink.healthcheck().await.expect("healthy");
}

#[tokio::test]
async fn building_against_a_closed_port_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binds")
        .local_addr()
        .expect("addr")
        .port();
    let config = RedisConfig {
        url: format!("redis://127.0.0.1:{port}"),
        connect_timeout: Duration::from_secs(1),
        ..RedisConfig::default()
    };
    let err = config.build().await.expect_err("nothing listens");
    assert_eq!(err.kind(), SinkErrorKind::Unavailable);
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}
