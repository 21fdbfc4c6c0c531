//! The sink conformance suite against a private Cloud Pub/Sub emulator (the suite stops and
//! restarts it), read back through the REST API as a pull subscriber with message ordering
//! on would (`projects/P/subscriptions/<topic>.sub`, pulled and acknowledged).
//!
//! Without the emulator installed (it comes with the Google Cloud SDK, not with Debian) the
//! test says so on stderr and passes without running anything.

#![cfg(feature = "pubsub")]

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use outbox_sinks::{PubSubConfig, PubSubSink};
use outbox_testkit::services::{PubSubEmulator, PulledMessage, find_emulator};
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

const PROJECT: &str = "proj-outbox";

/// The payload limit the sink is built with: the suite publishes one byte more, and a small
/// limit keeps that fast (Pub/Sub's own is 10 MB).
const MAX_PAYLOAD: usize = 1024 * 1024;

struct PubSubHarness {
    emulator: PubSubEmulator,
    /// Every topic prepared so far, to create again after a restart (the emulator forgets).
    topics: Mutex<Vec<String>>,
    /// What each subscription delivered so far, in delivery order: pulling acknowledges, so
    /// every call of `received` returns these plus whatever is new.
    pulled: tokio::sync::Mutex<HashMap<String, Vec<Received>>>,
}

fn subscription(topic: &str) -> String {
    format!("{topic}.sub")
}

impl PubSubHarness {
    async fn prepare(&self, topic: &str) -> anyhow::Result<()> {
        self.emulator.create_topic(PROJECT, topic).await?;
        self.emulator
            .create_subscription(PROJECT, &subscription(topic), topic, true)
            .await
    }
}

fn received(topic: &str, message: PulledMessage) -> Received {
    Received {
        destination: topic.to_owned(),
        key: message.ordering_key,
        headers: message.attributes.into_iter().collect(),
        body: message.data,
    }
}

impl SinkHarness for PubSubHarness {
    type Sink = PubSubSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<PubSubSink> {
        for topic in &target.destinations {
            self.prepare(topic).await?;
            let mut topics = self.topics.lock().expect("not poisoned");
            if !topics.contains(topic) {
                topics.push(topic.clone());
            }
        }
        let config = PubSubConfig {
            project: PROJECT.to_owned(),
            topic: target.template.clone(),
            endpoint: Some(self.emulator.host().to_owned()),
            timeout: Duration::from_secs(3),
            max_payload: NonZeroUsize::new(MAX_PAYLOAD),
            ..PubSubConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut pulled = self.pulled.lock().await;
            for topic in &target.destinations {
                let sub = subscription(topic);
                loop {
                    let batch = self.emulator.pull(PROJECT, &sub, 1000).await?;
                    if batch.is_empty() {
                        break;
                    }
                    let seen = pulled.entry(sub.clone()).or_default();
                    seen.extend(batch.into_iter().map(|m| received(topic, m)));
                }
            }
            let all: Vec<Received> = target
                .destinations
                .iter()
                .flat_map(|t| pulled.get(&subscription(t)).cloned().unwrap_or_default())
                .collect();
            if all.len() >= at_least || Instant::now() >= deadline {
                return Ok(all);
            }
            drop(pulled);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.emulator.stop().await
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.emulator.restart().await?;
        let topics = self.topics.lock().expect("not poisoned").clone();
        for topic in &topics {
            self.prepare(topic).await?;
        }
        Ok(())
    }

    fn broker_address(&self) -> String {
        self.emulator.host().to_owned()
    }

    fn max_message_size(&self) -> usize {
        MAX_PAYLOAD
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::No
    }

    /// The ordering key, which is `aggregate_id` for every id the suite uses.
    fn keyed(&self) -> bool {
        true
    }

    /// The emulator keeps nothing across a restart.
    fn durable(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn pubsub_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    if let Err(why) = find_emulator() {
        eprintln!("SKIPPED pubsub_sink_passes_the_sink_conformance_suite: {why:#}");
        return Ok(());
    }
    let harness = PubSubHarness {
        emulator: PubSubEmulator::start().await?,
        topics: Mutex::new(Vec::new()),
        pulled: tokio::sync::Mutex::new(HashMap::new()),
    };
    sink_conformance::run_all(&harness).await
}
