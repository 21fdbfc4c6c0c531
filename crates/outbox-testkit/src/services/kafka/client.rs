//! The rdkafka clients of the [`Kafka`](super::Kafka) launcher: readiness probe, topic
//! creation check, and the consumer that reads topics back for tests.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::ClientConfig;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::OwnedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message as _, Offset, TopicPartitionList};

/// Settings every test client shares: quick to notice a broker and to give up; plus
/// `security` (TLS and SASL settings of a secured broker).
pub(super) fn client_config(brokers: &str, security: &[(String, String)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("socket.timeout.ms", "5000")
        .set("reconnect.backoff.max.ms", "200");
    for (key, value) in security {
        config.set(key, value);
    }
    config
}

/// Waits until a metadata request to `brokers` succeeds, or `timeout` passes.
pub(super) async fn probe(
    brokers: String,
    security: Vec<(String, String)>,
    timeout: Duration,
) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client_config(&brokers, &security)
            .create()
            .context("creating a Kafka client")?;
        consumer
            .fetch_metadata(None, timeout)
            .map(drop)
            .with_context(|| format!("no metadata from {brokers} within {timeout:?}"))
    })
    .await
    .context("probe thread")?
}

/// Waits until the metadata of `topic` shows at least `partitions` partitions.
pub(super) fn wait_for_topic(
    admin: &AdminClient<DefaultClientContext>,
    brokers: &str,
    topic: &str,
    partitions: usize,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + super::ADMIN_TIMEOUT;
    loop {
        let metadata = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .with_context(|| format!("reading the metadata of `{topic}` from {brokers}"))?;
        let ready = metadata.topics().iter().any(|t| {
            t.name() == topic && t.error().is_none() && t.partitions().len() >= partitions.max(1)
        });
        if ready {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "topic `{topic}` created on {brokers} but its metadata does not show it ready"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// See [`Kafka::consume`](super::Kafka::consume).
pub(super) fn consume_blocking(
    brokers: &str,
    security: &[(String, String)],
    topics: &[String],
    expected: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<OwnedMessage>> {
    let consumer: BaseConsumer = client_config(brokers, security)
        .set(
            "group.id",
            format!("outbox-testkit-{}", uuid::Uuid::now_v7()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        // Answer fetches at once instead of waiting up to 500 ms for more data.
        .set("fetch.wait.max.ms", "10")
        .create()
        .context("creating a Kafka consumer")?;
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .with_context(|| format!("reading the metadata of `{topic}` from {brokers}"))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        anyhow::ensure!(
            !partitions.is_empty(),
            "topic `{topic}` has no partitions on {brokers} (does it exist?)"
        );
        for partition in partitions {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .context("building the assignment")?;
        }
    }
    consumer
        .assign(&assignment)
        .context("assigning partitions")?;

    let mut messages = Vec::new();
    let deadline = Instant::now() + timeout;
    // Once `expected` arrived, keep listening briefly for extras (duplicates, strays).
    let mut settle_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let until = settle_until.unwrap_or(deadline).min(deadline);
        if now >= until {
            break;
        }
        match consumer.poll(until - now) {
            Some(Ok(message)) => messages.push(message.detach()),
            Some(Err(e))
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition) =>
            {
                anyhow::bail!("a topic of {topics:?} vanished from {brokers} while reading: {e}")
            }
            Some(Err(e)) => tracing::debug!(error = %e, "consumer error (retrying)"),
            None => {}
        }
        if messages.len() >= expected && settle_until.is_none() {
            settle_until = Some(Instant::now() + Duration::from_millis(200));
        }
    }
    let rank = |m: &OwnedMessage| topics.iter().position(|t| t == m.topic());
    messages.sort_by_key(|m| (rank(m), m.partition(), m.offset()));
    Ok(messages)
}
