//! The sink conformance suite against a private RabbitMQ broker (the suite stops and restarts
//! it, so it cannot be the shared one), read back from a durable queue bound to each check's
//! exchange with `scope.#`.

#![cfg(feature = "rabbitmq")]

#[path = "support/amqp.rs"]
mod amqp;

use std::num::NonZeroUsize;
use std::time::Duration;

use lapin::types::FieldTable;
use outbox_sinks::{RabbitMqConfig, RabbitMqSink};
use outbox_testkit::services::RabbitMq;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

struct RabbitMqHarness {
    broker: RabbitMq,
}

/// One exchange and one queue per check, both named after its scope.
fn names(target: &Target) -> (String, String) {
    (format!("x.{}", target.scope), format!("q.{}", target.scope))
}

impl SinkHarness for RabbitMqHarness {
    type Sink = RabbitMqSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<RabbitMqSink> {
        let (exchange, queue) = names(target);
        amqp::bind_queue(
            self.broker.url(),
            &exchange,
            &queue,
            &format!("{}.#", target.scope),
            FieldTable::default(),
        )
        .await?;
        let config = RabbitMqConfig {
            url: self.broker.url().to_owned(),
            exchange,
            destination: target.template.clone(),
            max_message_size: NonZeroUsize::new(RabbitMq::MAX_MESSAGE_SIZE).expect("not zero"),
            connect_timeout: Duration::from_secs(2),
            confirm_timeout: Duration::from_secs(5),
            ..RabbitMqConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let (_, queue) = names(target);
        let messages = amqp::read_queue(self.broker.url(), &queue, at_least).await?;
        Ok(messages.into_iter().map(|m| m.received).collect())
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.broker.stop().await
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.broker.restart().await
    }

    fn broker_address(&self) -> String {
        format!("127.0.0.1:{}", self.broker.port())
    }

    fn max_message_size(&self) -> usize {
        RabbitMq::MAX_MESSAGE_SIZE
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::No
    }
}

#[tokio::test]
async fn rabbitmq_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let harness = RabbitMqHarness {
        broker: RabbitMq::start().await?,
    };
    sink_conformance::run_all(&harness).await
}
