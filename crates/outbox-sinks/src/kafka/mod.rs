//! Kafka sink (feature `kafka`), on librdkafka through `rdkafka`.
//!
//! Each event becomes one Kafka record, produced by an idempotent producer with `acks=all`:
//!
//! | part | value |
//! | --- | --- |
//! | topic | the `destination` template rendered for the event |
//! | key | `aggregate_id` (so one aggregate's events share a partition, in order) |
//! | headers | `id`, `event_type`, `aggregate_type`, `aggregate_id`, then the row's own headers |
//! | value | the payload bytes exactly |
//!
//! With `format = "cloudevents-binary"` the headers are the CloudEvents attributes instead
//! (`ce_specversion`, `ce_id`, `ce_source`, `ce_type`, `ce_subject`, `ce_time`, the extensions
//! as `ce_<name>`) and `content-type` = `datacontenttype`, the value still the payload; with
//! `"cloudevents-structured"` the only header is `content-type: application/cloudevents+json`
//! and the value is the JSON envelope. The key stays `aggregate_id` in both (the CloudEvents
//! Kafka binding: [`BINDING`]).
//!
//! A batch is handed to librdkafka record by record without waiting, then all delivery
//! reports are awaited together. An event counts as delivered only once its delivery report
//! says the broker stored it (with `acks=all`: every in-sync replica). The idempotent
//! producer keeps the records of one partition in order across librdkafka's own retries.
//!
//! Topics are not created on produce unless `create_topics = true`; before the first record
//! goes to a topic, one metadata request checks that it exists (module `topic`).
//!
//! | failure | kind |
//! | --- | --- |
//! | no broker answers (metadata request fails, delivery report timed out after `delivery_timeout`, producer closed) | `Unavailable` (the whole batch, when every event is affected) |
//! | message larger than `max_message_bytes`, or refused by the broker as too large | `Rejected`, naming the size and the limit |
//! | rendered topic is not a legal topic name | `Rejected` |
//! | topic does not exist (and is not created), any other broker error | `Transient` |
//!
//! After librdkafka reported every broker down, a delivery timeout or a fatal producer error,
//! the next batch (or healthcheck) first asks the brokers for metadata through a fresh
//! producer, failing fast with `Unavailable` while they do not answer; once they answer, the
//! fresh producer takes over and every topic is checked again. A broker that lost its state
//! (tansu's memory storage, say) no longer knows the old idempotent producer id or the
//! topics, and would otherwise refuse records until the delivery timeout, every time.

mod client;
mod config;
mod readback;
mod scratch;
mod topic;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::join_all;
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Destination, Event, Sink, SinkError, SinkErrorKind};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureRecord, Producer as _};
use rdkafka::types::RDKafkaErrorCode;

use client::{KafkaContext, LastErrors, Producer};
pub use config::KafkaConfig;
pub use readback::KafkaReadBack;
use topic::Topics;

/// The CloudEvents Kafka protocol binding: every attribute in a header prefixed `ce_`,
/// `datacontenttype` in `content-type`, values as UTF-8 text (no percent-encoding);
/// structured mode announces itself with `content-type: application/cloudevents+json`.
pub const BINDING: Binding = Binding {
    prefix: "ce_",
    data_content_type: Some("content-type"),
    structured_content_type: Some("content-type"),
    percent_encode: false,
};

/// How long to wait before handing a record to librdkafka again when its queue is full.
const QUEUE_FULL_PAUSE: Duration = Duration::from_millis(10);

/// Publishes events to Kafka; built from a [`KafkaConfig`].
pub struct KafkaSink {
    brokers: String,
    destination: Destination,
    max_message_bytes: usize,
    delivery_timeout: Duration,
    metadata_timeout: Duration,
    format: MessageFormat,
    client_config: ClientConfig,
    producer: Mutex<Current>,
    topics: Topics,
    /// What librdkafka last reported, shared by every client of this sink.
    last_errors: LastErrors,
}

/// The producer in use, its context, and a generation number so that a batch replaces only
/// the producer it used (not one another batch already replaced).
#[derive(Clone)]
struct Current {
    generation: u64,
    producer: Producer,
    context: KafkaContext,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("brokers", &self.brokers)
            .field("destination", &self.destination.template())
            .field("max_message_bytes", &self.max_message_bytes)
            .field("delivery_timeout", &self.delivery_timeout)
            .finish_non_exhaustive()
    }
}

/// A record ready to go: its topic, headers, value and size as the size limit counts it.
struct Prepared {
    topic: String,
    headers: OwnedHeaders,
    value: Bytes,
    size: Size,
}

/// The parts of a record's size (payload + key + header names and values).
#[derive(Clone, Copy)]
struct Size {
    payload: usize,
    key: usize,
    headers: usize,
}

impl Size {
    fn total(self) -> usize {
        self.payload + self.key + self.headers
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes (payload {} + key {} + headers {})",
            self.total(),
            self.payload,
            self.key,
            self.headers
        )
    }
}

/// One event of a batch on its way: refused before sending, or waiting for its report.
enum InFlight {
    Refused(SinkError),
    Sent {
        topic: String,
        size: Size,
        report: DeliveryFuture,
    },
}

/// What a failed delivery means for the sink beyond the event itself.
#[derive(Default, Clone, Copy)]
struct Aftermath {
    /// The brokers may be gone (timed out, fatal error): check them before the next batch,
    /// and start over with a fresh producer once they answer.
    suspect_brokers: bool,
    /// The topic may be gone: check it again before the next record goes there.
    forget_topic: bool,
}

impl KafkaSink {
    fn new(
        config: KafkaConfig,
        client_config: ClientConfig,
        format: MessageFormat,
    ) -> Result<Self, SinkError> {
        let last_errors = LastErrors::default();
        let current = create_producer(&client_config, 0, &last_errors)?;
        let creator = if config.create_topics {
            let admin = client_config
                .create_with_context(KafkaContext::new(&last_errors))
                .map_err(|e| {
                    SinkError::rejected("cannot create the Kafka admin client").with_source(e)
                })?;
            Some(topic::Creator {
                admin,
                partitions: config.partitions_for_new_topics(),
                replication: config.replication_for_new_topics(),
            })
        } else {
            None
        };
        let brokers = config.brokers.clone();
        tracing::info!(%brokers, destination = %config.destination, create_topics = config.create_topics, "Kafka sink ready");
        Ok(Self {
            topics: Topics::new(creator, brokers.clone(), config.metadata_timeout),
            brokers,
            destination: config.destination,
            max_message_bytes: config.max_message_bytes.get() as usize,
            delivery_timeout: config.delivery_timeout,
            metadata_timeout: config.metadata_timeout,
            format,
            client_config,
            producer: Mutex::new(current),
            last_errors,
        })
    }

    /// The producer to use now.
    ///
    /// When its brokers are suspect (see [`KafkaContext::brokers_suspect`]) or librdkafka
    /// declared it dead, a fresh producer asks the brokers for metadata first: `Err`
    /// (`Unavailable`) while they do not answer. Once they do, the fresh producer replaces the
    /// old one and every topic is checked again, because the brokers may have lost state on
    /// the way (a broker with memory storage forgets topics and idempotent producer ids).
    /// A fresh producer, not the old one, because the old one may sit in librdkafka's
    /// reconnect backoff (up to `reconnect.backoff.max.ms`) or hold a producer id the broker
    /// no longer knows.
    async fn ready(&self) -> Result<Current, SinkError> {
        let current = lock(&self.producer).clone();
        let fatal = current.producer.client().fatal_error();
        if let Some((code, reason)) = &fatal {
            tracing::warn!(%code, %reason, "Kafka producer failed fatally; replacing it");
        } else if !current.context.brokers_suspect() {
            return Ok(current);
        }
        let fresh = create_producer(
            &self.client_config,
            current.generation + 1,
            &self.last_errors,
        )?;
        if let Err(e) = self.probe(&fresh).await {
            dispose(fresh.producer);
            return Err(e);
        }
        if fatal.is_none() {
            tracing::info!(brokers = %self.brokers, "Kafka brokers reachable again");
        }
        self.topics.forget_all();
        let old = {
            let mut installed = lock(&self.producer);
            if installed.generation != current.generation {
                // Another batch recovered first: use its producer.
                let theirs = installed.clone();
                drop(installed);
                dispose(fresh.producer);
                return Ok(theirs);
            }
            std::mem::replace(&mut *installed, fresh.clone())
        };
        dispose(old.producer);
        Ok(fresh)
    }

    /// Asks the brokers for metadata; `Ok` once one answers within `metadata_timeout`.
    async fn probe(&self, current: &Current) -> Result<(), SinkError> {
        let producer = current.producer.clone();
        let producer_context = current.context.clone();
        let timeout = self.metadata_timeout;
        let answer = tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(None, timeout).map(drop)
        })
        .await;
        match answer {
            Ok(Ok(())) => {
                producer_context.clear_last_error();
                Ok(())
            }
            Ok(Err(e)) => {
                // librdkafka's own error says only "broker transport failure"; the reason (a
                // refused certificate or password) came through the context.
                let why = producer_context
                    .last_error()
                    .map(|reason| format!(" (last error: {reason})"))
                    .unwrap_or_default();
                Err(SinkError::unavailable(format!(
                    "cannot reach the Kafka brokers at {}: no metadata within {timeout:?}{why}",
                    self.brokers
                ))
                .with_source(e))
            }
            Err(e) => Err(SinkError::unavailable(format!(
                "the metadata request to the Kafka brokers at {} did not finish",
                self.brokers
            ))
            .with_source(e)),
        }
    }

    /// The topic, headers and size of `event`'s record, or why it can never be sent.
    fn prepare(&self, event: &Event) -> Result<Prepared, SinkError> {
        let topic = self.destination.render(event);
        if let Some(problem) = topic::name_problem(&topic) {
            return Err(SinkError::rejected(format!(
                "topic `{topic}` (destination `{}`) {problem}",
                self.destination
            )));
        }
        let mut headers = OwnedHeaders::new_with_capacity(8 + event.headers.len());
        let mut headers_len = 0;
        let encoded = self
            .format
            .encode(event, &BINDING, |name, value| {
                headers_len += name.len() + value.len();
                headers = std::mem::replace(&mut headers, OwnedHeaders::new()).insert(Header {
                    key: name,
                    value: Some(value.as_bytes()),
                });
            })
            .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?;
        let size = Size {
            payload: encoded.body.len(),
            key: event.aggregate_id.len(),
            headers: headers_len,
        };
        if size.total() > self.max_message_bytes {
            return Err(SinkError::rejected(format!(
                "message of {size} exceeds the limit of {} bytes (sink.max_message_bytes)",
                self.max_message_bytes
            )));
        }
        Ok(Prepared {
            topic,
            headers,
            value: encoded.body,
            size,
        })
    }

    /// Hands one record to librdkafka, waiting (until `deadline`) while its queue is full.
    async fn enqueue(
        &self,
        producer: &Producer,
        event: &Event,
        prepared: Prepared,
        deadline: Instant,
    ) -> InFlight {
        let Prepared {
            topic,
            headers,
            value,
            size,
        } = prepared;
        let mut record = FutureRecord::to(&topic)
            .key(event.aggregate_id.as_bytes())
            .payload(&value[..])
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(report) => {
                    return InFlight::Sent {
                        topic: topic.clone(),
                        size,
                        report,
                    };
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if Instant::now() < deadline =>
                {
                    record = back;
                    tokio::time::sleep(QUEUE_FULL_PAUSE).await;
                }
                Err((e, _)) => {
                    let (error, _) = self.failure(&topic, size, &e);
                    return InFlight::Refused(error);
                }
            }
        }
    }

    /// Maps a failed enqueue or delivery report to the event's error and the aftermath.
    fn failure(&self, topic: &str, size: Size, e: &KafkaError) -> (SinkError, Aftermath) {
        let verdict = Verdict::of(e.rdkafka_error_code());
        let message = match verdict {
            Verdict::TooLarge => format!(
                "message of {size} to `{topic}` is too large: the limit is {} bytes \
                 (sink.max_message_bytes, counting librdkafka's record overhead) or the \
                 broker's message.max.bytes / the topic's max.message.bytes",
                self.max_message_bytes
            ),
            Verdict::InvalidTopic => format!("`{topic}` is not a valid Kafka topic"),
            Verdict::InvalidRecord => format!("the broker refused the record to `{topic}`"),
            Verdict::UnknownTopic => format!(
                "Kafka topic `{topic}` does not exist on {} (deleted?)",
                self.brokers
            ),
            Verdict::TimedOut => format!(
                "no delivery report for the message to `{topic}` within {:?} \
                 (sink.delivery_timeout): are the Kafka brokers at {} up?",
                self.delivery_timeout, self.brokers
            ),
            Verdict::Fatal => {
                format!("the Kafka producer failed fatally while sending to `{topic}`")
            }
            Verdict::Unreachable => format!(
                "the message to `{topic}` was not delivered: Kafka brokers at {} unreachable",
                self.brokers
            ),
            Verdict::Refused => format!("Kafka refused the message to `{topic}`"),
        };
        let error = SinkError::new(verdict.kind(), message).with_source(e.clone());
        (error, verdict.aftermath())
    }
}

/// What a librdkafka error code says about an event: the one place that turns Kafka's
/// errors into [`SinkErrorKind`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Over the producer's or the broker's size limit: never accepted as it is.
    TooLarge,
    /// The topic name is not legal.
    InvalidTopic,
    /// The broker refused the record itself.
    InvalidRecord,
    /// The topic (or partition) does not exist (any more).
    UnknownTopic,
    /// No delivery report within `delivery_timeout`.
    TimedOut,
    /// The producer failed fatally (idempotence state broken).
    Fatal,
    /// No broker reachable, or the message was purged on the way.
    Unreachable,
    /// Anything else the broker said.
    Refused,
}

impl Verdict {
    fn of(code: Option<RDKafkaErrorCode>) -> Self {
        use RDKafkaErrorCode as C;
        match code {
            Some(C::MessageSizeTooLarge | C::InvalidMessageSize) => Self::TooLarge,
            Some(C::InvalidTopic) => Self::InvalidTopic,
            Some(C::InvalidRecord) => Self::InvalidRecord,
            Some(C::UnknownTopic | C::UnknownTopicOrPartition | C::UnknownPartition) => {
                Self::UnknownTopic
            }
            Some(C::MessageTimedOut) => Self::TimedOut,
            Some(C::Fatal) => Self::Fatal,
            Some(
                C::AllBrokersDown
                | C::BrokerTransportFailure
                | C::Resolve
                | C::DestroyBroker
                | C::BrokerDestroy
                | C::PurgeQueue
                | C::PurgeInflight
                | C::QueueFull,
            ) => Self::Unreachable,
            _ => Self::Refused,
        }
    }

    fn kind(self) -> SinkErrorKind {
        match self {
            Self::TooLarge | Self::InvalidTopic | Self::InvalidRecord => SinkErrorKind::Rejected,
            Self::UnknownTopic | Self::Refused => SinkErrorKind::Transient,
            Self::TimedOut | Self::Fatal | Self::Unreachable => SinkErrorKind::Unavailable,
        }
    }

    fn aftermath(self) -> Aftermath {
        Aftermath {
            suspect_brokers: matches!(self, Self::TimedOut | Self::Fatal),
            forget_topic: matches!(self, Self::UnknownTopic | Self::TimedOut),
        }
    }
}

/// A fresh producer (with its own context, so that an old producer's farewell errors never
/// mark the new one's brokers as down).
fn create_producer(
    config: &ClientConfig,
    generation: u64,
    last: &LastErrors,
) -> Result<Current, SinkError> {
    let context = KafkaContext::new(last);
    let producer = config
        .create_with_context(context.clone())
        .map_err(|e| SinkError::rejected("cannot create the Kafka producer").with_source(e))?;
    Ok(Current {
        generation,
        producer,
        context,
    })
}

/// Drops a producer off the runtime: dropping the last handle purges its queue and joins its
/// threads. (A batch still using it holds a clone until it finishes.)
fn dispose(producer: Producer) {
    drop(tokio::task::spawn_blocking(move || drop(producer)));
}

/// Locks `m`, ignoring poisoning (the guarded state stays consistent at every step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sink for KafkaSink {
    fn name(&self) -> &'static str {
        "kafka"
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let current = self.ready().await?;
        let producer = &current.producer;

        let prepared: Vec<Result<Prepared, SinkError>> =
            batch.iter().map(|e| self.prepare(e)).collect();
        let topics: BTreeSet<&str> = prepared
            .iter()
            .filter_map(|p| p.as_ref().ok().map(|p| p.topic.as_str()))
            .collect();
        let unusable = match self.topics.ensure(producer, topics).await {
            Ok(unusable) => unusable,
            Err(e) => {
                current.context.suspect_brokers();
                return Err(e);
            }
        };

        let deadline = Instant::now() + self.delivery_timeout;
        let mut in_flight = Vec::with_capacity(batch.len());
        for (event, prepared) in batch.iter().zip(prepared) {
            let item = match prepared {
                Err(e) => InFlight::Refused(e),
                Ok(p) => match unusable.get(&p.topic) {
                    Some(e) => InFlight::Refused(e.clone()),
                    None => self.enqueue(producer, event, p, deadline).await,
                },
            };
            in_flight.push(item);
        }

        let results = join_all(in_flight.into_iter().map(|item| async move {
            match item {
                InFlight::Refused(e) => (Err(e), None),
                InFlight::Sent {
                    topic,
                    size,
                    report,
                } => match report.await {
                    Ok(Ok(_)) => (Ok(()), None),
                    Ok(Err((e, _message))) => {
                        let (error, aftermath) = self.failure(&topic, size, &e);
                        (Err(error), Some((topic, aftermath)))
                    }
                    Err(_canceled) => {
                        let error = SinkError::unavailable(format!(
                            "the Kafka producer closed before reporting the delivery to \
                             `{topic}`"
                        ));
                        let aftermath = Aftermath {
                            suspect_brokers: true,
                            forget_topic: false,
                        };
                        (Err(error), Some((topic, aftermath)))
                    }
                },
            }
        }))
        .await;

        let mut deliveries = Vec::with_capacity(results.len());
        for (delivery, aftermath) in results {
            if let Some((topic, aftermath)) = aftermath {
                if aftermath.forget_topic {
                    self.topics.forget(&topic);
                }
                if aftermath.suspect_brokers {
                    current.context.suspect_brokers();
                }
            }
            deliveries.push(delivery);
        }
        crate::broker::collapse_unavailable(deliveries)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        let current = self.ready().await?;
        self.probe(&current).await
    }
}

crate::build_sink!(KafkaConfig, "kafka", |config, event| format!(
    "Kafka topic {}",
    config.destination.render(event)
), message_limit: |c| usize::try_from(c.max_message_bytes.get()).unwrap_or(usize::MAX), destination: destination, read_back: readback::read_back,
scratch: scratch::scratch, remove_scratch: scratch::remove_scratch);

#[cfg(test)]
mod tests;
