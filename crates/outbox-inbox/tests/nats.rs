//! The JetStream consumer loop against a real `nats-server -js`, fed by the relay's
//! `NatsSink`, with the PostgreSQL inbox. Unique subjects and streams per test.

#![cfg(feature = "nats")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Ledger, policy, publish_all, spawn, unique};
use futures::StreamExt as _;
use outbox_core::{Destination, Event};
use outbox_inbox::ConsumerReport;
use outbox_inbox::nats::JetStreamConsumer;
use outbox_sinks::NatsConfig;
use outbox_testkit::services::Nats;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

async fn publish(nats: &Nats, prefix: &str, events: &[Event]) {
    let config = NatsConfig {
        url: nats.url().to_owned(),
        destination: Destination::parse(&format!("{prefix}.event.{{aggregate_type}}"))
            .expect("valid"),
        stream: prefix.to_uppercase(),
        ..NatsConfig::default()
    };
    publish_all(&config.build().await.expect("builds"), events).await;
}

fn start(
    nats: &Nats,
    prefix: &str,
    ledger: &Arc<Ledger>,
    token: &CancellationToken,
) -> JoinHandle<ConsumerReport> {
    let mut config = JetStreamConsumer::new(nats.url(), prefix.to_uppercase(), "loyalty");
    config.ack_wait = Duration::from_secs(1);
    config.policy = policy();
    let (handler, token) = (ledger.handler(), token.clone());
    spawn(async move { config.run(handler, token).await })
}

#[tokio::test]
async fn messages_redelivered_after_a_stop_between_commit_and_ack_give_one_side_effect() {
    let nats = Nats::shared().await.expect("nats starts");
    let prefix = unique();
    let ledger = Ledger::new().await;
    let start = |token: &_| start(nats, &prefix, &ledger, token);
    // JetStream drops the relay's second publish of an event itself (`Nats-Msg-Id`).
    ledger
        .redelivery_scenario(start, async |e| publish(nats, &prefix, e).await, true)
        .await;
}

#[tokio::test]
async fn failures_retry_in_place_keeping_per_key_order_and_poison_is_terminated() {
    let nats = Nats::shared().await.expect("nats starts");
    let prefix = unique();
    let ledger = Ledger::new().await;
    let client = nats.connect().await.expect("connects");
    let terminated = tokio::sync::Mutex::new(
        client
            .subscribe(format!(
                "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{}.loyalty",
                prefix.to_uppercase()
            ))
            .await
            .expect("subscribes"),
    );
    let advisories = AtomicUsize::new(0);
    let dead_lettered = async || {
        let mut terminated = terminated.lock().await;
        if let Ok(Some(_)) =
            tokio::time::timeout(Duration::from_millis(100), terminated.next()).await
        {
            advisories.fetch_add(1, Ordering::SeqCst);
        }
        advisories.load(Ordering::SeqCst) == 2
    };
    let start = |token: &_| start(nats, &prefix, &ledger, token);
    ledger
        .failure_scenario(
            start,
            async |e| publish(nats, &prefix, e).await,
            dead_lettered,
        )
        .await;
}

#[tokio::test]
async fn a_durable_created_with_other_settings_is_updated_to_the_configured_ones() {
    let nats = Nats::shared().await.expect("nats starts");
    let prefix = unique();
    publish(nats, &prefix, &common::order_events()[..1]).await;
    let run_once = async |ack_wait: Duration, in_flight: usize| {
        let mut config = JetStreamConsumer::new(nats.url(), prefix.to_uppercase(), "settings");
        config.ack_wait = ack_wait;
        config.policy = policy();
        config.policy.max_in_flight = std::num::NonZeroUsize::new(in_flight).expect("not zero");
        let token = CancellationToken::new();
        token.cancel();
        config
            .run(
                |_m: outbox_inbox::InboxMessage| async { Ok::<_, String>(()) },
                token,
            )
            .await
            .expect("runs");
    };
    run_once(Duration::from_secs(1), 32).await;
    run_once(Duration::from_secs(3), 7).await;
    let js = async_nats::jetstream::new(nats.connect().await.expect("connects"));
    let stream = js.get_stream(prefix.to_uppercase()).await.expect("stream");
    let info = stream
        .consumer_info("settings")
        .await
        .expect("consumer info");
    assert_eq!(
        (info.config.ack_wait, info.config.max_ack_pending),
        (Duration::from_secs(3), 7),
        "the durable follows the loop's settings"
    );
}

/// With `max_ack_pending` sized for several instances, a dead instance's unacknowledged
/// messages hold only themselves: the live instance goes on with the backlog while the dead
/// one's messages wait for `ack_wait` (set far beyond the test here). With the default
/// (`max_in_flight`) the same dead window would hold every slot: nothing would be processed.
#[tokio::test]
async fn a_dead_instance_with_a_full_window_does_not_stall_the_durable() {
    let nats = Nats::shared().await.expect("nats starts");
    let prefix = unique();
    let events: Vec<Event> = (0..200)
        .map(|i| common::event(&format!("k{i}"), 0))
        .collect();
    publish(nats, &prefix, &events).await;
    let mut config = JetStreamConsumer::new(nats.url(), prefix.to_uppercase(), "loyalty");
    config.ack_wait = Duration::from_secs(600);
    config.policy = policy();
    let window = config.policy.max_in_flight.get() + 8;
    config.max_ack_pending = Some(2 * window);
    // The dead instance: it pulled a full window (max_in_flight + a pull batch) on the
    // durable, as a loop with these settings would, and never acks.
    let js = async_nats::jetstream::new(nats.connect().await.expect("connects"));
    let stream = js.get_stream(prefix.to_uppercase()).await.expect("stream");
    let dead: async_nats::jetstream::consumer::PullConsumer = stream
        .get_or_create_consumer(
            "loyalty",
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("loyalty".to_owned()),
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                max_deliver: -1,
                max_ack_pending: i64::try_from(config.max_ack_pending()).expect("fits"),
                ..Default::default()
            },
        )
        .await
        .expect("durable");
    let mut held = dead
        .fetch()
        .max_messages(window)
        .messages()
        .await
        .expect("pull");
    let mut taken = 0;
    while let Some(m) = held.next().await {
        m.expect("message");
        taken += 1;
    }
    assert_eq!(taken, window, "the dead instance holds a full window");

    let ledger = Ledger::new().await;
    let token = CancellationToken::new();
    let (handler, stop) = (ledger.handler(), token.clone());
    let run = spawn(async move { config.run(handler, stop).await });
    // Every message the dead instance does not hold is processed by the live one.
    ledger.wait_processed(events.len() - window).await;
    token.cancel();
    let report = run.await.expect("task");
    assert_eq!(report.acked, (events.len() - window) as u64);
}
