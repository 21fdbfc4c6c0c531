//! librdkafka plumbing: the client context every Kafka client of the sink shares (logs go to
//! `tracing`; a flag notes when librdkafka reports every broker down; the last connection
//! error is kept to say why, e.g. a refused TLS certificate or SASL password), and the
//! producer type.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
    last: LastErrors,
}

/// What librdkafka reported, shared by every client of one sink (a replaced producer's errors
/// included) until a broker answers again: the reason of the last error (TLS handshake, SASL
/// authentication, refused connection), and the reasons already logged as warnings, so that
/// each is a warning once, not on every reconnect.
#[derive(Clone, Default)]
pub(super) struct LastErrors {
    error: Arc<Mutex<Option<String>>>,
    warned: Arc<Mutex<HashSet<String>>>,
}

/// Distinct reasons remembered as warned before the memory starts over.
const WARNED_LIMIT: usize = 64;

impl LastErrors {
    /// True the first time `reason` is seen (ignoring which connection it came from and
    /// librdkafka's timing suffix, `(after 2ms in state ...)`).
    fn first_time(&self, reason: &str) -> bool {
        let reason = reason.split(" (after ").next().unwrap_or(reason);
        // `[thrd:...]: ssl://127.0.0.1:9093/bootstrap: ` names the connection.
        let essence = reason
            .rsplit_once("/bootstrap: ")
            .map_or(reason, |(_, rest)| rest);
        let Ok(mut warned) = self.warned.lock() else {
            return true;
        };
        if warned.len() >= WARNED_LIMIT {
            warned.clear();
        }
        warned.insert(essence.to_owned())
    }
}

impl KafkaContext {
    /// A context of its own (see [`KafkaContext::brokers_suspect`]) that shares `last` with
    /// the sink's other clients.
    pub(super) fn new(last: &LastErrors) -> Self {
        Self {
            brokers_down: Arc::default(),
            last: last.clone(),
        }
    }

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

    /// Why the brokers could not be reached, as librdkafka last said (`SSL handshake failed:
    /// ... certificate verify failed`, `SASL authentication error: ...`), if it said anything.
    pub(super) fn last_error(&self) -> Option<String> {
        self.last.error.lock().ok().and_then(|e| e.clone())
    }

    /// Forgets the last error and what was warned about: a broker answered (a failure after
    /// this warns again).
    pub(super) fn clear_last_error(&self) {
        if let Ok(mut e) = self.last.error.lock() {
            *e = None;
        }
        if let Ok(mut warned) = self.last.warned.lock() {
            warned.clear();
        }
    }

    /// Keeps `reason` as the last error; true the first time it is seen.
    fn note_error(&self, reason: &str) -> bool {
        // Log lines start with the thread's name: `[thrd:ssl://host:9093/bootstrap]: `.
        let reason = reason
            .strip_prefix("[thrd:")
            .and_then(|r| r.split_once("]: "))
            .map_or(reason, |(_, rest)| rest);
        if let Ok(mut e) = self.last.error.lock() {
            *e = Some(reason.to_owned());
        }
        self.last.first_time(reason)
    }
}

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            // A failed (re)connect: the sink reports the outage itself (Unavailable, the
            // healthcheck), and librdkafka repeats this on every attempt: warn once per reason.
            RDKafkaLogLevel::Error if facility == "FAIL" => {
                if self.note_error(message) {
                    tracing::warn!(target: "librdkafka", facility, "{message}");
                } else {
                    tracing::debug!(target: "librdkafka", facility, "{message}");
                }
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
                self.note_error(reason);
                tracing::debug!(target: "librdkafka", error = %error, "{reason}");
            }
            // A refused certificate or password, repeated on every reconnect: warn once per
            // reason; the sink's errors carry it too.
            _ => {
                if self.note_error(reason) {
                    tracing::warn!(target: "librdkafka", error = %error, "{reason}");
                } else {
                    tracing::debug!(target: "librdkafka", error = %error, "{reason}");
                }
            }
        }
    }
}
