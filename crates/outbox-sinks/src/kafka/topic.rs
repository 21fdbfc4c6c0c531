//! Kafka topics: which rendered destinations are legal topic names, and [`Topics`], which
//! remembers the topics known to exist and checks (or creates) the others before a batch is
//! sent to them.
//!
//! Why check at all: librdkafka holds a message for a topic that does not exist until the
//! delivery timeout, then reports a timeout that looks like an outage. One metadata request
//! per new topic turns that into a clear, immediate "topic does not exist".

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use outbox_core::SinkError;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::types::RDKafkaErrorCode;

use super::client::{KafkaContext, Producer};

/// Longest legal topic name.
const MAX_NAME_LEN: usize = 249;

/// Why `name` is not a legal Kafka topic name, or `None` when it is.
pub(super) fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".to_owned());
    }
    if name == "." || name == ".." {
        return Some("is `.` or `..`".to_owned());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!(
            "is {} characters long (at most {MAX_NAME_LEN})",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "contains {c:?} (only ASCII letters, digits, `.`, `_` and `-` are allowed)"
        ));
    }
    None
}

/// How a sink creates missing topics (`create_topics = true`).
pub(super) struct Creator {
    pub(super) admin: AdminClient<KafkaContext>,
    pub(super) partitions: i32,
    pub(super) replication: i32,
}

/// The topics known to exist, and the means to learn about (or create) the others.
pub(super) struct Topics {
    known: Mutex<HashSet<String>>,
    creator: Option<Creator>,
    brokers: String,
    timeout: Duration,
}

impl Topics {
    pub(super) fn new(creator: Option<Creator>, brokers: String, timeout: Duration) -> Self {
        Self {
            known: Mutex::new(HashSet::new()),
            creator,
            brokers,
            timeout,
        }
    }

    /// Forgets that `topic` exists, so the next batch checks again (after a publish to it
    /// failed as if it did not exist, or timed out: a broker that lost its storage lost
    /// its topics too).
    pub(super) fn forget(&self, topic: &str) {
        super::lock(&self.known).remove(topic);
    }

    /// Forgets every topic (after an outage).
    pub(super) fn forget_all(&self) {
        super::lock(&self.known).clear();
    }

    /// Makes sure every topic in `topics` exists, creating missing ones when configured.
    /// Returns the topics that cannot be published to, each with the error for its events.
    /// `Err` when the brokers cannot be asked at all (the whole batch is unavailable).
    pub(super) async fn ensure(
        &self,
        producer: &Producer,
        topics: BTreeSet<&str>,
    ) -> Result<HashMap<String, SinkError>, SinkError> {
        let unknown: Vec<String> = {
            let known = super::lock(&self.known);
            topics
                .into_iter()
                .filter(|t| !known.contains(*t))
                .map(str::to_owned)
                .collect()
        };
        let mut unusable = HashMap::new();
        if unknown.is_empty() {
            return Ok(unusable);
        }
        let states = self.lookup(producer, unknown).await?;
        let mut missing = Vec::new();
        for (topic, state) in states {
            match state {
                State::Exists => {
                    super::lock(&self.known).insert(topic);
                }
                State::Missing => missing.push(topic),
                State::Unusable(e) => {
                    unusable.insert(topic, e);
                }
            }
        }
        if missing.is_empty() {
            return Ok(unusable);
        }
        match &self.creator {
            None => {
                for topic in missing {
                    let e = SinkError::transient(format!(
                        "Kafka topic `{topic}` does not exist on {}: create it, or set \
                         sink.create_topics = true",
                        self.brokers
                    ));
                    unusable.insert(topic, e);
                }
            }
            Some(creator) => {
                for (topic, result) in self.create(creator, missing).await? {
                    match result {
                        Ok(()) => {
                            super::lock(&self.known).insert(topic);
                        }
                        Err(e) => {
                            unusable.insert(topic, e);
                        }
                    }
                }
            }
        }
        Ok(unusable)
    }

    /// Asks the brokers about each topic (one metadata request each).
    async fn lookup(
        &self,
        producer: &Producer,
        topics: Vec<String>,
    ) -> Result<Vec<(String, State)>, SinkError> {
        let producer = producer.clone();
        let timeout = self.timeout;
        let brokers = self.brokers.clone();
        let task = tokio::task::spawn_blocking(move || {
            let mut states = Vec::with_capacity(topics.len());
            for topic in topics {
                let metadata = rdkafka::producer::Producer::client(&producer)
                    .fetch_metadata(Some(&topic), timeout)
                    .map_err(|e| {
                        SinkError::unavailable(format!(
                            "cannot read the metadata of Kafka topic `{topic}` from {brokers} \
                             within {timeout:?}"
                        ))
                        .with_source(e)
                    })?;
                let state = match metadata.topics().iter().find(|t| t.name() == topic) {
                    None => State::Missing,
                    Some(t) => match t.error().map(RDKafkaErrorCode::from) {
                        None => State::Exists,
                        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => State::Missing,
                        Some(code) => State::Unusable(SinkError::transient(format!(
                            "Kafka topic `{topic}` on {brokers} is not usable: {code}"
                        ))),
                    },
                };
                states.push((topic, state));
            }
            Ok(states)
        });
        task.await.map_err(|e| {
            SinkError::unavailable("the Kafka metadata lookup did not finish").with_source(e)
        })?
    }

    /// Creates `topics`; a topic that another relay created meanwhile counts as created.
    async fn create(
        &self,
        creator: &Creator,
        topics: Vec<String>,
    ) -> Result<Vec<(String, Result<(), SinkError>)>, SinkError> {
        let new_topics: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|t| {
                NewTopic::new(
                    t,
                    creator.partitions,
                    TopicReplication::Fixed(creator.replication),
                )
            })
            .collect();
        let options = AdminOptions::new()
            .operation_timeout(Some(self.timeout))
            .request_timeout(Some(self.timeout));
        let results = tokio::time::timeout(
            self.timeout * 2,
            creator.admin.create_topics(&new_topics, &options),
        )
        .await
        .map_err(|_| {
            SinkError::unavailable(format!(
                "creating Kafka topics {topics:?} on {} timed out",
                self.brokers
            ))
        })?
        .map_err(|e| {
            SinkError::unavailable(format!(
                "cannot create Kafka topics {topics:?} on {}",
                self.brokers
            ))
            .with_source(e)
        })?;
        Ok(results
            .into_iter()
            .map(|result| match result {
                Ok(topic) => {
                    tracing::info!(%topic, brokers = %self.brokers, "created Kafka topic");
                    (topic, Ok(()))
                }
                Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => (topic, Ok(())),
                Err((topic, code)) => {
                    let e = SinkError::transient(format!(
                        "cannot create Kafka topic `{topic}` on {} (partitions {}, replication \
                         factor {}; -1 = the broker's default): {code}",
                        self.brokers, creator.partitions, creator.replication
                    ));
                    (topic, Err(e))
                }
            })
            .collect())
    }
}

/// What the brokers said about a topic.
enum State {
    Exists,
    Missing,
    Unusable(SinkError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafkas_rules() {
        assert_eq!(name_problem("outbox.event.Order"), None);
        assert_eq!(name_problem("a-b_c.D9"), None);
        assert!(name_problem("").is_some());
        assert!(name_problem(".").is_some());
        assert!(name_problem("..").is_some());
        assert!(name_problem("outbox.o 1").is_some());
        assert!(name_problem("outbox/x").is_some());
        assert!(name_problem("outbox.ö").is_some());
        assert!(name_problem(&"x".repeat(249)).is_none());
        assert!(name_problem(&"x".repeat(250)).is_some());
    }
}
