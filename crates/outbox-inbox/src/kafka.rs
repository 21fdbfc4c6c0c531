//! [`KafkaConsumer`] (feature `kafka`): a Kafka consumer-group loop (librdkafka, bundled).
//!
//! - **Group.** Subscribes `topics` in consumer group `group` with auto-commit off
//!   (`enable.auto.commit = false`); a new group starts at the earliest offset.
//! - **Commit after the transaction, contiguous prefix.** Records of a partition may finish
//!   out of order (different keys are handled concurrently). The loop tracks, per partition,
//!   which offsets are done and commits only the **contiguous prefix**: offset `n + 1` once
//!   every record up to `n` was handled (its transaction committed) or dead-lettered. A crash
//!   redelivers from the last commit; the inbox reports duplicates for what was already done.
//! - **Order.** One key lives in one partition (the sink keys records by `aggregate_id`), and
//!   the shared [lanes](crate::lane) handle one key's records one at a time, in offset order,
//!   kept across retries: a failed record is retried in place.
//! - **Dead letters.** Kafka has no broker-side mechanism, so after `policy.max_attempts`
//!   the record is produced to the dead-letter topic (`<topic>.dead` by default; it must
//!   exist) with its key, payload and headers plus `dead_reason`, `dead_topic`,
//!   `dead_partition`, `dead_offset`; only once that topic acknowledged it does the offset
//!   count as done. A record without the contract headers goes there at once.
//! - **Shutdown.** Cancel the token: polling stops, handlers in progress finish, and the
//!   final done prefix is committed synchronously.
//! - **Limits.** A record waiting for a retry holds its partition's commit point, not the
//!   poll loop, unless `max_in_flight` records are held: then polling pauses, and a pause
//!   longer than
//!   `max.poll.interval.ms` (5 min by default) makes the broker rebalance the group. After a
//!   rebalance, records of a reassigned partition are redelivered from its committed offset
//!   (duplicates the inbox absorbs).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::InboxMessage;
use crate::lane::{
    BoxError, ConsumerError, ConsumerOrder, ConsumerReport, LanePolicy, Lanes, MessageHandler,
    Settle,
};

const BROKER: &str = "Kafka";

/// Config and runner of one member of a Kafka consumer group. Its `Debug` masks the values of
/// settings that name a password, secret, key or token (`sasl.password`, ...).
#[derive(Clone)]
pub struct KafkaConsumer {
    /// Bootstrap brokers, `host:port[,host:port]`.
    pub brokers: String,
    /// Topics to subscribe.
    pub topics: Vec<String>,
    /// Consumer group id.
    pub group: String,
    /// Dead-letter topic; `None`: `<topic>.dead` of the record's topic. It must exist.
    pub dead_letter_topic: Option<String>,
    /// Extra librdkafka consumer settings (`session.timeout.ms`, ...). `group.id`,
    /// `bootstrap.servers` and `enable.auto.commit` are set by the loop.
    pub settings: BTreeMap<String, String>,
    /// Longest wait for the dead-letter topic to acknowledge a record. Default 30 s.
    pub dead_letter_timeout: Duration,
    /// Lanes, in-flight bound, attempts and backoff.
    pub policy: LanePolicy,
    /// Per-aggregate order across crashes and instances (`None`: per-key order within this
    /// instance only). Build it with the inbox's `order_gate`; see [`ConsumerOrder`].
    pub ordered: Option<ConsumerOrder>,
}

impl std::fmt::Debug for KafkaConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settings: BTreeMap<&str, &str> = self
            .settings
            .iter()
            .map(|(k, v)| {
                let shown = if outbox_core::redact::is_secret_key(k) {
                    "***"
                } else {
                    v.as_str()
                };
                (k.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaConsumer")
            .field("brokers", &self.brokers)
            .field("topics", &self.topics)
            .field("group", &self.group)
            .field("dead_letter_topic", &self.dead_letter_topic)
            .field("settings", &settings)
            .field("dead_letter_timeout", &self.dead_letter_timeout)
            .field("policy", &self.policy)
            .field("ordered", &self.ordered)
            .finish()
    }
}

impl KafkaConsumer {
    /// A member of `group` reading `topics`, with the defaults.
    pub fn new(brokers: impl Into<String>, topics: &[&str], group: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            group: group.into(),
            dead_letter_topic: None,
            settings: BTreeMap::new(),
            dead_letter_timeout: Duration::from_secs(30),
            policy: LanePolicy::default(),
            ordered: None,
        }
    }

    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in &self.settings {
            config.set(k, v);
        }
        config.set("bootstrap.servers", &self.brokers);
        config
    }

    /// Runs until `shutdown` is cancelled, calling `handler` for each record (see
    /// [`MessageHandler`]), and returns what it did.
    pub async fn run<H: MessageHandler>(
        &self,
        handler: H,
        shutdown: CancellationToken,
    ) -> Result<ConsumerReport, ConsumerError> {
        let setup = |what: &str| {
            let what = what.to_owned();
            move |e: rdkafka::error::KafkaError| ConsumerError::broker(BROKER, what, e)
        };
        let mut config = self.client_config();
        config
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set_if_unset("auto.offset.reset", "earliest");
        let consumer: StreamConsumer = config.create().map_err(setup("create a consumer"))?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(setup("subscribe to the topics"))?;
        let producer: FutureProducer = self
            .client_config()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .map_err(setup("create the dead-letter producer"))?;
        let consumer = Arc::new(consumer);
        let settle = Arc::new(KafkaSettle {
            consumer: Arc::clone(&consumer),
            producer,
            dead_letter_topic: self.dead_letter_topic.clone(),
            timeout: self.dead_letter_timeout,
            partitions: Mutex::new(HashMap::new()),
        });
        let lanes = Lanes::start(
            &self.policy,
            self.ordered.clone(),
            Arc::clone(&settle),
            handler,
            &shutdown,
        );
        {
            let mut stream = consumer.stream();
            loop {
                let next = tokio::select! {
                    () = shutdown.cancelled() => break,
                    next = stream.next() => next,
                };
                let record = match next {
                    Some(Ok(m)) => m.detach(),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "Kafka poll failed; retrying");
                        continue;
                    }
                    None => break,
                };
                settle.start(&record);
                let parsed = parse(&record);
                if !lanes.offer(record, parsed, 0, &shutdown).await {
                    break;
                }
            }
        }
        let report = lanes.finish().await;
        settle.commit(CommitMode::Sync);
        Ok(report)
    }
}

trait SetIfUnset {
    fn set_if_unset(&mut self, key: &str, value: &str) -> &mut Self;
}

impl SetIfUnset for ClientConfig {
    fn set_if_unset(&mut self, key: &str, value: &str) -> &mut Self {
        if self.get(key).is_none() {
            self.set(key, value);
        }
        self
    }
}

/// The record's headers and payload, back into a message.
fn parse(record: &OwnedMessage) -> Result<InboxMessage, String> {
    let headers = record.headers().into_iter().flat_map(|h| {
        h.iter()
            .filter_map(|h| Some((h.key, std::str::from_utf8(h.value?).ok()?)))
    });
    let payload = bytes::Bytes::copy_from_slice(record.payload().unwrap_or_default());
    InboxMessage::from_headers(headers, &[], payload).map_err(|e| e.to_string())
}

/// Done offsets of one partition, above its commit point.
#[derive(Debug, Default)]
struct Track {
    /// Offset → done, for every record handed out and not yet committed.
    offsets: BTreeMap<i64, bool>,
    /// Highest offset handed out.
    highest: Option<i64>,
    /// The next offset to commit once it changed (`None`: nothing new).
    commit: Option<i64>,
}

impl Track {
    /// Registers a record handed out; a record at or below the highest one means the
    /// partition was reassigned and re-read from its commit: start over.
    fn start(&mut self, offset: i64) {
        if self.highest.is_some_and(|h| offset <= h) {
            self.offsets.clear();
        }
        self.highest = Some(offset);
        self.offsets.insert(offset, false);
    }

    /// Marks `offset` done and advances the commit point over the done prefix.
    fn done(&mut self, offset: i64) {
        if let Some(done) = self.offsets.get_mut(&offset) {
            *done = true;
        }
        while let Some(entry) = self.offsets.first_entry() {
            if !*entry.get() {
                break;
            }
            self.commit = Some(*entry.key() + 1);
            entry.remove();
        }
    }
}

/// Commits the done prefix, dead-letters to a topic.
struct KafkaSettle {
    consumer: Arc<StreamConsumer>,
    producer: FutureProducer,
    dead_letter_topic: Option<String>,
    timeout: Duration,
    partitions: Mutex<HashMap<(String, i32), Track>>,
}

impl KafkaSettle {
    fn start(&self, record: &OwnedMessage) {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((record.topic().to_owned(), record.partition()))
            .or_default()
            .start(record.offset());
    }

    fn done(&self, record: &OwnedMessage) {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((record.topic().to_owned(), record.partition()))
            .or_default()
            .done(record.offset());
        self.commit(CommitMode::Async);
    }

    /// Commits every partition whose done prefix advanced.
    fn commit(&self, mode: CommitMode) {
        let mut list = TopicPartitionList::new();
        for ((topic, partition), track) in self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter_mut()
        {
            if let Some(next) = track.commit.take()
                && let Err(e) = list.add_partition_offset(topic, *partition, Offset::Offset(next))
            {
                tracing::warn!(error = %e, topic, partition, "cannot list an offset to commit");
            }
        }
        if list.count() == 0 {
            return;
        }
        if let Err(e) = self.consumer.commit(&list, mode) {
            // Not lost: the records come back after a restart and are duplicates then.
            tracing::warn!(error = %e, "committing offsets failed");
        }
    }
}

impl Settle for KafkaSettle {
    type Handle = OwnedMessage;

    async fn ack(&self, record: OwnedMessage) -> Result<(), BoxError> {
        self.done(&record);
        Ok(())
    }

    async fn dead_letter(
        &self,
        record: OwnedMessage,
        _: Option<&InboxMessage>,
        reason: &str,
    ) -> Result<(), BoxError> {
        let topic = self
            .dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dead", record.topic()));
        let mut headers = record
            .headers()
            .map_or_else(OwnedHeaders::new, Clone::clone);
        let (partition, offset) = (record.partition().to_string(), record.offset().to_string());
        for (key, value) in [
            ("dead_reason", reason),
            ("dead_topic", record.topic()),
            ("dead_partition", &partition),
            ("dead_offset", &offset),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut dead = FutureRecord::<[u8], [u8]>::to(&topic).headers(headers);
        if let Some(key) = record.key() {
            dead = dead.key(key);
        }
        if let Some(payload) = record.payload() {
            dead = dead.payload(payload);
        }
        self.producer
            .send(dead, self.timeout)
            .await
            .map_err(|(e, _)| format!("producing to dead-letter topic `{topic}` failed: {e}"))?;
        self.done(&record);
        Ok(())
    }

    async fn release(&self, _record: OwnedMessage) {
        // Not done: the commit point stays below it, so it is redelivered.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_masks_secret_settings() {
        let mut c = KafkaConsumer::new("127.0.0.1:9092", &["t"], "g");
        c.settings
            .insert("sasl.password".into(), "Sup3r-s3cret".into());
        c.settings
            .insert("security.protocol".into(), "SASL_SSL".into());
        let shown = format!("{c:?}");
        assert!(!shown.contains("Sup3r-s3cret"), "{shown}");
        assert!(
            shown.contains("sasl.password") && shown.contains("SASL_SSL"),
            "{shown}"
        );
    }

    #[test]
    fn only_the_contiguous_done_prefix_is_committed() {
        let mut t = Track::default();
        for o in 10..14 {
            t.start(o);
        }
        t.done(11);
        t.done(13);
        assert_eq!(t.commit.take(), None, "10 is not done yet");
        t.done(10);
        assert_eq!(t.commit.take(), Some(12));
        t.done(12);
        assert_eq!(t.commit.take(), Some(14));
    }

    #[test]
    fn a_partition_read_again_from_its_commit_starts_over() {
        let mut t = Track::default();
        t.start(5);
        t.start(6);
        t.start(5); // reassigned, re-read from 5
        t.done(5);
        assert_eq!(t.commit.take(), Some(6));
    }
}
