//! The sink conformance suite against a private tansu (Kafka protocol), read back with a real
//! librdkafka consumer.
//!
//! tansu's memory storage loses everything when it stops, while the suite's outage check
//! expects the broker back "with the same data". So the harness reaches tansu through the
//! testkit's TCP front and simulates the outage by cutting that (every client connection
//! dropped, new ones refused) while tansu keeps its topics. The Kafka sink's own tests
//! (`tests/kafka.rs`) kill and restart tansu for real.

#![cfg(feature = "kafka")]

use std::time::Duration;

use bytes::Bytes;
use outbox_sinks::{KafkaConfig, KafkaSink};
use outbox_testkit::services::Kafka;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};
use rdkafka::Message as _;
use rdkafka::message::Headers as _;

/// What the harness configures as `max_message_bytes`.
const MAX_MESSAGE_BYTES: u32 = 64 * 1024;

struct KafkaHarness {
    kafka: Kafka,
}

impl SinkHarness for KafkaHarness {
    type Sink = KafkaSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<KafkaSink> {
        // One partition: the suite compares some bodies in publish order across aggregates,
        // which Kafka promises only within a partition. (Per-key order across partitions is
        // tested in tests/kafka.rs.)
        for topic in &target.destinations {
            self.kafka.create_topic(topic, 1).await?;
        }
        let config = KafkaConfig {
            brokers: self.kafka.brokers().to_owned(),
            destination: target.template.clone(),
            max_message_bytes: MAX_MESSAGE_BYTES.try_into()?,
            delivery_timeout: Duration::from_secs(3),
            metadata_timeout: Duration::from_secs(1),
            ..KafkaConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let topics: Vec<&str> = target.destinations.iter().map(String::as_str).collect();
        let messages = self
            .kafka
            .consume(&topics, at_least, Duration::from_secs(10))
            .await?;
        messages
            .iter()
            .map(|m| {
                let headers = m
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| {
                                let value = h.value.unwrap_or_default();
                                Ok((h.key.to_owned(), String::from_utf8(value.to_vec())?))
                            })
                            .collect::<anyhow::Result<Vec<_>>>()
                    })
                    .transpose()?
                    .unwrap_or_default();
                let key = m.key().map(|k| String::from_utf8(k.to_vec())).transpose()?;
                Ok(Received {
                    destination: m.topic().to_owned(),
                    key,
                    headers,
                    body: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
                })
            })
            .collect()
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.kafka.disconnect().await
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.kafka.reconnect().await
    }

    fn broker_address(&self) -> String {
        self.kafka.brokers().to_owned()
    }

    fn max_message_size(&self) -> usize {
        MAX_MESSAGE_BYTES as usize
    }

    fn dedupe(&self) -> Dedupe {
        // The idempotent producer drops librdkafka's own retries, not a second publish.
        Dedupe::No
    }

    fn keyed(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn kafka_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let harness = KafkaHarness {
        kafka: Kafka::start_with_front().await?,
    };
    sink_conformance::run_all(&harness).await
}
