//! `outbox verify` for Kafka: the topics the destination template can render (from the
//! cluster's metadata, plus every topic the expected events name) are read partition by
//! partition from the offset of the window's start (`offsets_for_times`) to the high
//! watermark as it was when the read began. The reader is a consumer with partitions
//! **assigned** (it never joins a group) and offsets never committed, so the topic's consumer
//! groups see nothing of it.
//!
//! A partition whose low watermark is above 0 has removed its oldest records (retention,
//! `DeleteRecords`, compaction): when the read starts there, what was sent to that topic
//! before its first remaining record is reported as expired, not lost. A broker that cannot
//! look offsets up by time is read from the low watermark instead, and records older than
//! the window are skipped.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::Destination;
use outbox_core::verify::{
    Identity, Lane, LedgerEvent, ReadBack, ReadBackError, ReadMessage, ReadOutcome, Trimmed,
};
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Headers as _;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use time::OffsetDateTime;

use super::KafkaConfig;
use super::client::{KafkaContext, LastErrors};
use crate::read_back::Read;

/// The longest wait for the next record while a partition has not reached its end.
const IDLE_LIMIT: Duration = Duration::from_secs(30);
/// Past a partition's high watermark, how long without a record ends its read (when the
/// end-of-partition event does not come first).
const QUIET_END: Duration = Duration::from_secs(1);
/// How often (in records) the progress is reported.
const PROGRESS_EVERY: u64 = 5_000;
/// The settings of `[sink.settings]` a reader takes over (how to reach and authenticate to
/// the brokers); the producer's own settings (batching, acks, ...) do not apply to it.
const READER_SETTINGS: &[&str] = &[
    "security.protocol",
    "ssl.",
    "sasl.",
    "client.id",
    "socket.",
    "broker.",
    "api.version",
    "metadata.",
    "topic.metadata.",
    "reconnect.",
    "client.dns.lookup",
    "connections.max.idle.ms",
];

impl ConsumerContext for KafkaContext {}

type Reader = StreamConsumer<KafkaContext>;

/// Reads a Kafka sink's topics back.
pub struct KafkaReadBack {
    consumer: Arc<Reader>,
    context: KafkaContext,
    brokers: String,
    destination: Destination,
    timeout: Duration,
}

/// Creates the reader and checks that a broker answers.
pub(super) async fn read_back(config: &KafkaConfig) -> Result<KafkaReadBack, ReadBackError> {
    let producer_config = config
        .client_config()
        .map_err(|e| ReadBackError::refused(e.to_string()))?;
    let brokers = producer_config
        .get("bootstrap.servers")
        .unwrap_or_default()
        .to_owned();
    let mut reader = ClientConfig::new();
    for (key, value) in &config.settings {
        if READER_SETTINGS.iter().any(|p| key.starts_with(p)) {
            reader.set(key, value);
        }
    }
    reader
        .set("bootstrap.servers", &brokers)
        // Required by librdkafka for a consumer; never used to join a group or commit.
        .set(
            "group.id",
            format!("outbox-verify-{}", uuid::Uuid::now_v7().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let context = KafkaContext::new(&LastErrors::default());
    let consumer: Reader = reader
        .create_with_context(context.clone())
        .map_err(|e| ReadBackError::refused(format!("cannot create a Kafka reader: {e}")))?;
    let readback = KafkaReadBack {
        consumer: Arc::new(consumer),
        context,
        brokers: outbox_core::redact::redact_url(&brokers),
        destination: config.destination.clone(),
        timeout: config.metadata_timeout,
    };
    readback.topics_named(&[]).await?;
    Ok(readback)
}

impl KafkaReadBack {
    /// Runs a blocking librdkafka call off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Reader) -> Result<T, KafkaError> + Send + 'static,
    ) -> Result<Result<T, KafkaError>, ReadBackError> {
        let consumer = Arc::clone(&self.consumer);
        tokio::task::spawn_blocking(move || job(&consumer))
            .await
            .map_err(|e| ReadBackError::failed(e.to_string()))
    }

    fn unreachable(&self, what: &str, e: &KafkaError) -> ReadBackError {
        let why = self
            .context
            .last_error()
            .map(|reason| format!(" (last error: {reason})"))
            .unwrap_or_default();
        ReadBackError::unreachable(format!(
            "cannot reach the Kafka brokers at {}: {what} within {:?}: {e}{why}",
            self.brokers, self.timeout
        ))
    }

    /// The topics to read with their partition counts: every topic of the cluster the
    /// template can render, and those the expected events name.
    async fn topics_named(
        &self,
        expected: &[LedgerEvent],
    ) -> Result<BTreeMap<String, i32>, ReadBackError> {
        let timeout = self.timeout;
        let listed = self
            .blocking(move |c| {
                c.fetch_metadata(None, timeout).map(|m| {
                    m.topics()
                        .iter()
                        .filter(|t| t.error().is_none())
                        .map(|t| {
                            (
                                t.name().to_owned(),
                                i32::try_from(t.partitions().len()).unwrap_or(i32::MAX),
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .await?
            .map_err(|e| self.unreachable("no metadata", &e))?;
        let named: HashSet<String> = expected.iter().map(|e| self.destination_of(e)).collect();
        Ok(listed
            .into_iter()
            .filter(|(name, _)| named.contains(name) || self.destination.could_render(name))
            .collect())
    }

    async fn read_all(&self, call: Read<'_>) -> Result<ReadOutcome, ReadBackError> {
        let mut out = ReadOutcome::default();
        let topics = self.topics_named(call.expected).await?;
        let named: BTreeSet<String> = call
            .expected
            .iter()
            .map(|e| self.destination_of(e))
            .collect();
        for missing in named.iter().filter(|t| !topics.contains_key(*t)) {
            out.notes.push(format!(
                "topic `{missing}` does not exist on the brokers: every event the table says was delivered there counts as lost"
            ));
        }
        let since_ms = i64::try_from(call.since.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
        let timeout = self.timeout;

        // Per partition: where to start and where the end is now.
        let mut by_time = TopicPartitionList::new();
        for (topic, partitions) in &topics {
            for p in 0..*partitions {
                by_time
                    .add_partition_offset(topic, p, Offset::Offset(since_ms))
                    .map_err(|e| ReadBackError::failed(e.to_string()))?;
            }
        }
        let lookup = by_time.clone();
        let starts = self
            .blocking(move |c| c.offsets_for_times(lookup, timeout))
            .await?;
        let (starts, by_timestamp) = match starts {
            Ok(list) => (list, true),
            Err(e) => {
                out.notes.push(format!(
                    "the brokers could not look offsets up by time ({e}); every partition was read from its first record and records older than the window skipped"
                ));
                (by_time, false)
            }
        };
        struct Part {
            topic: String,
            partition: i32,
            start: i64,
            low: i64,
            high: i64,
            lane: u32,
        }
        let mut parts = Vec::new();
        let starts: Vec<(String, i32, Offset)> = starts
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition(), e.offset()))
            .collect();
        for (topic, partition, found) in starts {
            let (t, p) = (topic.clone(), partition);
            let (low, high) = self
                .blocking(move |c| c.fetch_watermarks(&t, p, timeout))
                .await?
                .map_err(|e| self.unreachable("no watermarks", &e))?;
            let lane = u32::try_from(out.lanes.len()).unwrap_or(u32::MAX);
            out.lanes.push(Lane {
                name: format!("topic `{topic}` partition {partition}"),
                messages: 0,
            });
            let start = match (by_timestamp, found) {
                (true, Offset::Offset(o)) => o.max(low),
                // Nothing at or after the time.
                (true, Offset::End) => high,
                _ => low,
            };
            tracing::debug!(%topic, partition, ?found, low, high, start, "Kafka partition to read back");
            // An empty partition, or nothing at or after the window's start.
            if high <= low || (by_timestamp && found == Offset::End) {
                continue;
            }
            parts.push(Part {
                topic,
                partition,
                start,
                low,
                high,
                lane,
            });
        }
        let total: u64 = parts
            .iter()
            .map(|p| u64::try_from(p.high - p.start).unwrap_or(0))
            .sum();
        call.progress.advance(0, Some(total));
        let mut first_seen: Vec<Option<OffsetDateTime>> = vec![None; parts.len()];
        let mut read = 0_u64;
        // One partition at a time, to its end: an end-of-partition event names only the
        // partition's number, and the high watermark alone is not trusted to be the end
        // (a broker may report the base offset of its last batch).
        for (i, part) in parts.iter().enumerate() {
            let mut one = TopicPartitionList::new();
            one.add_partition_offset(&part.topic, part.partition, Offset::Offset(part.start))
                .map_err(|e| ReadBackError::failed(e.to_string()))?;
            self.consumer.assign(&one).map_err(|e| {
                ReadBackError::failed(format!(
                    "assigning topic `{}` partition {}: {e}",
                    part.topic, part.partition
                ))
            })?;
            let mut next_offset = part.start;
            loop {
                // Past the high watermark, a short quiet spell also ends the partition.
                let wait = if next_offset >= part.high {
                    QUIET_END
                } else {
                    IDLE_LIMIT
                };
                let next = match tokio::time::timeout(wait, self.consumer.recv()).await {
                    Ok(next) => next,
                    Err(_) if next_offset >= part.high => break,
                    Err(_) => {
                        return Err(ReadBackError::unreachable(format!(
                            "no record from the Kafka brokers at {} for {}s while topic `{}` partition {} had not reached its end (offset {next_offset} of {})",
                            self.brokers,
                            IDLE_LIMIT.as_secs(),
                            part.topic,
                            part.partition,
                            part.high
                        )));
                    }
                };
                let message = match next {
                    Ok(m) => m,
                    Err(KafkaError::PartitionEOF(_)) => break,
                    Err(e)
                        if e.rdkafka_error_code()
                            == Some(RDKafkaErrorCode::BrokerTransportFailure) =>
                    {
                        return Err(self.unreachable("records", &e));
                    }
                    Err(e) => {
                        return Err(ReadBackError::failed(format!("reading records: {e}")));
                    }
                };
                let offset = message.offset();
                next_offset = offset + 1;
                let stored_at = message.timestamp().to_millis().and_then(|ms| {
                    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()
                });
                if first_seen[i].is_none() {
                    first_seen[i] = stored_at;
                }
                if !by_timestamp && stored_at.is_some_and(|t| t < call.since) {
                    continue;
                }
                let header = |name: &str| {
                    message.headers().and_then(|hs| {
                        hs.iter()
                            .find(|h| h.key == name)
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    })
                };
                out.messages.push(ReadMessage {
                    identity: Identity::read(header, message.payload().unwrap_or_default()),
                    lane: part.lane,
                    offset: u64::try_from(offset).unwrap_or(0),
                    stored_at,
                });
                out.lanes[part.lane as usize].messages += 1;
                read += 1;
                if read.is_multiple_of(PROGRESS_EVERY) {
                    call.progress.advance(read, Some(total));
                }
            }
        }
        call.progress.advance(read, Some(total.max(read)));
        for (part, first) in parts.iter().zip(first_seen) {
            if part.low > 0
                && part.start == part.low
                && let Some(at) = first
            {
                out.trimmed.push(Trimmed {
                    destination: Some(part.topic.clone()),
                    retained_from: at,
                    detail: format!(
                        "Kafka topic `{}` partition {} no longer holds its first {} record(s) (retention or deleted records): its oldest record is offset {}",
                        part.topic, part.partition, part.low, part.low
                    ),
                });
            }
        }
        Ok(out)
    }
}

crate::read_back::impl_read_back!(
    KafkaReadBack,
    describe: |r| format!("Kafka at {}, topics `{}`", r.brokers, r.destination.template()),
    destination: destination,
    debug: brokers,
);
