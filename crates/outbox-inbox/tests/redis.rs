//! The Redis Streams consumer loop against a real `redis-server`, fed by the relay's
//! `RedisSink`, with the PostgreSQL inbox. A unique stream per test.

#![cfg(feature = "redis")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Ledger, policy, publish_all, spawn, unique};
use outbox_core::{Destination, Event};
use outbox_inbox::ConsumerReport;
use outbox_inbox::redis::StreamConsumer;
use outbox_sinks::RedisConfig;
use outbox_testkit::services::Redis;
use redis::AsyncCommands as _;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

async fn publish(redis: &Redis, stream: &str, events: &[Event]) {
    let config = RedisConfig {
        url: redis.url().to_owned(),
        destination: Destination::parse(stream).expect("valid"),
        ..RedisConfig::default()
    };
    publish_all(&config.build().await.expect("builds"), events).await;
}

/// Runs consumer `name` of group `loyalty`; entries idle for 200 ms are claimed.
fn start(
    redis: &Redis,
    stream: &str,
    name: &str,
    ledger: &Arc<Ledger>,
    token: &CancellationToken,
) -> JoinHandle<ConsumerReport> {
    let mut config = StreamConsumer::new(redis.url(), stream, "loyalty", name);
    config.policy = policy();
    config.block = Duration::from_millis(200);
    config.claim_idle = Duration::from_millis(200);
    let (handler, token) = (ledger.handler(), token.clone());
    spawn(async move { config.run(handler, token).await })
}

async fn connect(redis: &Redis) -> MultiplexedConnection {
    redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects")
}

/// Entries of the group not acknowledged.
async fn pending(redis: &Redis, stream: &str) -> i64 {
    let summary: (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg(stream)
        .arg("loyalty")
        .query_async(&mut connect(redis).await)
        .await
        .expect("xpending");
    summary.0
}

#[tokio::test]
async fn entries_claimed_after_a_stop_between_commit_and_ack_or_published_twice_give_one_side_effect()
 {
    let redis = Redis::shared().await.expect("redis starts");
    let stream = unique();
    let ledger = Ledger::new().await;
    // The first run is consumer c1; the restart is another consumer, c2, which must claim
    // c1's idle pending entry with XAUTOCLAIM.
    let runs = AtomicUsize::new(0);
    let start = |token: &_| {
        let name = format!("c{}", runs.fetch_add(1, Ordering::SeqCst) + 1);
        start(redis, &stream, &name, &ledger, token)
    };
    ledger
        .redelivery_scenario(start, async |e| publish(redis, &stream, e).await, false)
        .await;
    assert_eq!(pending(redis, &stream).await, 0);
}

#[tokio::test]
async fn failures_retry_in_place_keeping_per_key_order_and_poison_goes_to_the_dead_stream() {
    let redis = Redis::shared().await.expect("redis starts");
    let stream = unique();
    let dead = format!("{stream}.dead");
    let ledger = Ledger::new().await;
    let conn = connect(redis).await;
    let start = |token: &_| start(redis, &stream, "c1", &ledger, token);
    let dead_lettered = async || conn.clone().xlen::<_, usize>(&dead).await.unwrap_or(0) == 2;
    let (events, _) = ledger
        .failure_scenario(
            start,
            async |e| publish(redis, &stream, e).await,
            dead_lettered,
        )
        .await;

    assert_eq!(pending(redis, &stream).await, 0, "dead entries are acked");
    let entries: redis::streams::StreamRangeReply =
        conn.clone().xrange_all(&dead).await.expect("xrange");
    let first = &entries.ids[0];
    let poison = &events[events.len() - 2];
    assert_eq!(first.get::<String>("id"), Some(poison.id.to_string()));
    assert_eq!(first.get::<String>("dead_stream"), Some(stream.clone()));
    let reason: String = first.get("dead_reason").expect("reason");
    assert!(
        reason.starts_with("handler failed 4 times; last error: injected failure"),
        "{reason}"
    );
    assert_eq!(first.get::<String>("payload").as_deref(), Some("0"));
}
