//! librdkafka plumbing: the client context every Kafka client of the sink shares (logs go to
//! `tracing`; a flag notes when librdkafka reports every broker down), and the producer type.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;

/// The producer the sink publishes with.
pub(super) type Producer = FutureProducer<KafkaContext>;

/// Client context of the sink's producer and admin client.
#[derive(Clone, Default)]
pub(super) struct KafkaContext {
    brokers_down: Arc<AtomicBool>,
}

impl KafkaContext {
    /// True once librdkafka reported every broker down, or a publish timed out: the next
    /// publish first checks that a broker answers, so that an outage fails fast instead of
    /// after `delivery_timeout`, and then replaces the producer (whose context this is).
    pub(super) fn brokers_suspect(&self) -> bool {
        self.brokers_down.load(Ordering::Relaxed)
    }

    /// Marks the brokers as possibly unreachable (see [`KafkaContext::brokers_suspect`]).
    pub(super) fn suspect_brokers(&self) {
        self.brokers_down.store(true, Ordering::Relaxed);
    }
}

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            // A failed (re)connect: the sink reports the outage itself (Unavailable, the
            // healthcheck), and librdkafka repeats this on every attempt.
            RDKafkaLogLevel::Error if facility == "FAIL" => {
                tracing::warn!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            // Repeated by every broker thread on every failed reconnect: warn once.
            Some(RDKafkaErrorCode::AllBrokersDown) => {
                if self.brokers_down.swap(true, Ordering::Relaxed) {
                    tracing::debug!(target: "librdkafka", "all Kafka brokers are down: {reason}");
                } else {
                    tracing::warn!(target: "librdkafka", "all Kafka brokers are down: {reason}");
                }
            }
            // Repeated on every reconnect attempt while a broker is down: the
            // AllBrokersDown warning above already says it once.
            Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::Resolve) => {
                tracing::debug!(target: "librdkafka", error = %error, "{reason}");
            }
            _ => tracing::warn!(target: "librdkafka", error = %error, "{reason}"),
        }
    }
}
