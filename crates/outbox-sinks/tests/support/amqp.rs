//! A RabbitMQ consumer for the RabbitMQ sink tests: declares a durable queue bound to the
//! sink's exchange, and reads it back without consuming it for good.

// Included by two test binaries; each uses a part of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use outbox_testkit::sink_conformance::Received;

/// One message as a consumer got it, with its AMQP properties.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    /// Routing key, header table (long strings as text) and body.
    pub(crate) received: Received,
    /// The message's properties (`message_id`, `delivery_mode`, ...).
    pub(crate) properties: BasicProperties,
}

/// Declares `exchange` (durable topic) and a durable queue `queue` bound to it with
/// `binding_key` (`scope.#` catches every routing key under a scope).
pub(crate) async fn bind_queue(
    url: &str,
    exchange: &str,
    queue: &str,
    binding_key: &str,
    arguments: FieldTable,
) -> anyhow::Result<()> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            binding_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    connection.close(200, "done".into()).await?;
    Ok(())
}

/// Every message in `queue`, in queue order, after waiting (up to 10 s) until at least
/// `at_least` are there. The messages are fetched without acknowledging them and the channel
/// is closed afterwards, which puts them back: the next call sees them again.
pub(crate) async fn read_queue(
    url: &str,
    queue: &str,
    at_least: usize,
) -> anyhow::Result<Vec<Message>> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let channel = connection.create_channel().await?;
        let mut messages = Vec::new();
        while let Some(got) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?
        {
            let delivery = got.delivery;
            let headers = delivery
                .properties
                .headers()
                .as_ref()
                .map(|table| {
                    table
                        .inner()
                        .iter()
                        .map(|(name, value)| (name.to_string(), text(value)))
                        .collect()
                })
                .unwrap_or_default();
            messages.push(Message {
                received: Received {
                    destination: delivery.routing_key.to_string(),
                    key: None,
                    headers,
                    body: Bytes::from(delivery.data),
                },
                properties: delivery.properties,
            });
        }
        channel.close(200, "requeue".into()).await?;
        if messages.len() >= at_least || Instant::now() >= deadline {
            connection.close(200, "done".into()).await?;
            return Ok(messages);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}
