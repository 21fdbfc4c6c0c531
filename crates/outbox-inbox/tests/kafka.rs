//! The Kafka consumer-group loop against a real Kafka-protocol broker (tansu), fed by the
//! relay's `KafkaSink`, with the PostgreSQL inbox. Unique topics and groups per test.

#![cfg(feature = "kafka")]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Ledger, event, policy, publish_all, spawn, unique};
use outbox_core::{Destination, Event};
use outbox_inbox::ConsumerReport;
use outbox_inbox::kafka::KafkaConsumer;
use outbox_sinks::KafkaConfig;
use outbox_testkit::services::Kafka;
use rdkafka::message::{Headers as _, Message as _, OwnedMessage};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A topic of 3 partitions and its dead-letter topic.
async fn topics(kafka: &Kafka) -> String {
    let topic = unique();
    kafka.create_topic(&topic, 3).await.expect("topic");
    kafka
        .create_topic(&format!("{topic}.dead"), 1)
        .await
        .expect("dead topic");
    topic
}

async fn publish(kafka: &Kafka, topic: &str, events: &[Event]) {
    let config = KafkaConfig {
        brokers: kafka.brokers().to_owned(),
        destination: Destination::parse(topic).expect("valid"),
        ..KafkaConfig::default()
    };
    publish_all(&config.build().await.expect("builds"), events).await;
}

fn start(
    kafka: &Kafka,
    topic: &str,
    group: &str,
    ledger: &Arc<Ledger>,
    token: &CancellationToken,
) -> JoinHandle<ConsumerReport> {
    let mut config = KafkaConsumer::new(kafka.brokers(), &[topic], group);
    config.policy = policy();
    let (handler, token) = (ledger.handler(), token.clone());
    spawn(async move { config.run(handler, token).await })
}

#[tokio::test]
async fn records_redelivered_after_a_stop_between_commit_and_offset_commit_or_published_twice_give_one_side_effect()
 {
    let kafka = Kafka::shared().await.expect("kafka starts");
    let topic = topics(kafka).await;
    let group = unique();
    let ledger = Ledger::new().await;
    let start = |token: &_| start(kafka, &topic, &group, &ledger, token);
    ledger
        .redelivery_scenario(start, async |e| publish(kafka, &topic, e).await, false)
        .await;

    // The offsets were committed after the transactions: a new run of the group gets only
    // a new record.
    let shutdown = CancellationToken::new();
    let run = start(&shutdown);
    let third = event("o_3", 0);
    publish(kafka, &topic, std::slice::from_ref(&third)).await;
    ledger.wait_processed(3).await;
    shutdown.cancel();
    assert_eq!(
        run.await.expect("task").acked,
        1,
        "nothing before o_3 came back"
    );
    assert_eq!(ledger.duplicates.load(Ordering::SeqCst), 2);
    assert_eq!(ledger.side_effects(third.id).await, 1);
}

#[tokio::test]
async fn failures_retry_in_place_keeping_per_key_order_and_poison_goes_to_the_dead_letter_topic() {
    let kafka = Kafka::shared().await.expect("kafka starts");
    let topic = topics(kafka).await;
    let group = unique();
    let ledger = Ledger::new().await;
    let start = |token: &_| start(kafka, &topic, &group, &ledger, token);
    let dead_topic = format!("{topic}.dead");
    let dead = tokio::sync::Mutex::new(Vec::<OwnedMessage>::new());
    let dead_lettered = async || {
        let read = kafka
            .consume(&[&dead_topic], 2, Duration::from_secs(2))
            .await;
        let mut dead = dead.lock().await;
        *dead = read.unwrap_or_default();
        dead.len() == 2
    };
    let (events, _) = ledger
        .failure_scenario(
            start,
            async |e| publish(kafka, &topic, e).await,
            dead_lettered,
        )
        .await;

    let dead = dead.lock().await;
    let header = |name: &str| {
        dead[0]
            .headers()
            .expect("headers")
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("id"), Some(events[events.len() - 2].id.to_string()));
    assert_eq!(header("dead_topic"), Some(topic.clone()));
    let reason = header("dead_reason").expect("reason");
    assert!(reason.starts_with("handler failed 4 times"), "{reason}");
    assert_eq!(dead[0].key(), Some(&b"p"[..]));
    assert_eq!(dead[0].payload(), Some(&b"0"[..]));
}
