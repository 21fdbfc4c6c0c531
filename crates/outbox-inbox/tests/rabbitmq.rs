//! The RabbitMQ queue consumer against a real broker, fed by the relay's `RabbitMqSink`, with
//! the PostgreSQL inbox. A unique exchange, queue and dead-letter exchange per test.

#![cfg(feature = "rabbitmq")]

mod common;

use std::sync::Arc;

use common::{Ledger, policy, publish_all, spawn, unique};
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::{Destination, Event};
use outbox_inbox::ConsumerReport;
use outbox_inbox::rabbitmq::QueueConsumer;
use outbox_sinks::RabbitMqConfig;
use outbox_testkit::services::RabbitMq;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The topology a user sets up: the relay's exchange, the consumer's queue bound to it with
/// a dead-letter exchange, and a queue collecting the dead letters.
struct Topology {
    _connection: Connection,
    channel: Channel,
    exchange: String,
    queue: String,
    dead_queue: String,
}

async fn topology(broker: &RabbitMq) -> Topology {
    let scope = unique();
    let connection = Connection::connect(broker.url(), ConnectionProperties::default())
        .await
        .expect("connects");
    let channel = connection.create_channel().await.expect("channel");
    let (exchange, queue) = (format!("x.{scope}"), format!("q.{scope}"));
    let (dlx, dead_queue) = (format!("dlx.{scope}"), format!("dead.{scope}"));
    for (name, kind) in [
        (&exchange, ExchangeKind::Topic),
        (&dlx, ExchangeKind::Fanout),
    ] {
        channel
            .exchange_declare(
                name.as_str().into(),
                kind,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("exchange");
    }
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-dead-letter-exchange"),
        AMQPValue::LongString(LongString::from(dlx.as_str())),
    );
    for (q, args, source, key) in [
        (&queue, args, &exchange, "#"),
        (&dead_queue, FieldTable::default(), &dlx, ""),
    ] {
        channel
            .queue_declare(q.as_str().into(), QueueDeclareOptions::default(), args)
            .await
            .expect("queue");
        channel
            .queue_bind(
                q.as_str().into(),
                source.as_str().into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind");
    }
    Topology {
        _connection: connection,
        channel,
        exchange,
        queue,
        dead_queue,
    }
}

impl Topology {
    async fn publish(&self, broker: &RabbitMq, events: &[Event]) {
        let config = RabbitMqConfig {
            url: broker.url().to_owned(),
            exchange: self.exchange.clone(),
            destination: Destination::parse("outbox.event.{aggregate_type}").expect("valid"),
            ..RabbitMqConfig::default()
        };
        publish_all(&config.build().await.expect("builds"), events).await;
    }

    fn start(
        &self,
        broker: &RabbitMq,
        ledger: &Arc<Ledger>,
        token: &CancellationToken,
    ) -> JoinHandle<ConsumerReport> {
        let mut config = QueueConsumer::new(broker.url(), &self.queue);
        config.policy = policy();
        let (handler, token) = (ledger.handler(), token.clone());
        spawn(async move { config.run(handler, token).await })
    }

    async fn count(&self, queue: &str) -> u32 {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare")
            .message_count()
    }
}

#[tokio::test]
async fn messages_requeued_after_a_stop_between_commit_and_ack_or_published_twice_give_one_side_effect()
 {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let topo = topology(broker).await;
    let ledger = Ledger::new().await;
    let start = |token: &_| topo.start(broker, &ledger, token);
    ledger
        .redelivery_scenario(start, async |e| topo.publish(broker, e).await, false)
        .await;
    assert_eq!(topo.count(&topo.queue).await, 0, "all acked");
    assert_eq!(topo.count(&topo.dead_queue).await, 0);
}

#[tokio::test]
async fn failures_retry_in_place_keeping_per_key_order_and_poison_goes_to_the_dead_letter_exchange()
{
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let topo = topology(broker).await;
    let ledger = Ledger::new().await;
    let start = |token: &_| topo.start(broker, &ledger, token);
    let dead_lettered = async || topo.count(&topo.dead_queue).await == 2;
    let (events, _) = ledger
        .failure_scenario(
            start,
            async |e| topo.publish(broker, e).await,
            dead_lettered,
        )
        .await;

    assert_eq!(topo.count(&topo.queue).await, 0);
    let dead = topo
        .channel
        .basic_get(
            topo.dead_queue.as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await
        .expect("get")
        .expect("a dead letter");
    let id = events[events.len() - 2].id.to_string();
    assert_eq!(
        dead.delivery
            .properties
            .message_id()
            .as_ref()
            .map(ShortString::as_str),
        Some(id.as_str())
    );
    let headers = dead.delivery.properties.headers().clone().expect("headers");
    assert!(headers.inner().contains_key("x-death"), "{headers:?}");
}

#[tokio::test]
async fn a_missing_queue_is_an_error_naming_it() {
    let broker = RabbitMq::shared().await.expect("rabbitmq starts");
    let ledger = Ledger::new().await;
    let err = QueueConsumer::new(broker.url(), "no.such.queue")
        .run(ledger.handler(), CancellationToken::new())
        .await
        .expect_err("no queue");
    assert_eq!(
        err.to_string(),
        "RabbitMQ refused to find the queue (queue no.such.queue)"
    );
}
