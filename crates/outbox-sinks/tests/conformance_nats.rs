//! The sink conformance suite against a private `nats-server -js` (the suite stops and
//! restarts it), read back with a JetStream pull consumer on each check's stream.

#![cfg(feature = "nats")]

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull};
use futures::StreamExt as _;
use outbox_sinks::{NatsConfig, NatsSink};
use outbox_testkit::services::Nats;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

struct NatsHarness {
    nats: Nats,
    max_payload: usize,
}

/// Each check gets a stream of its own capturing `scope.>`.
fn stream_name(target: &Target) -> String {
    target.scope.to_uppercase()
}

impl SinkHarness for NatsHarness {
    type Sink = NatsSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<NatsSink> {
        let config = NatsConfig {
            url: self.nats.url().to_owned(),
            destination: target.template.clone(),
            stream: stream_name(target),
            stream_subjects: Some(vec![format!("{}.>", target.scope)]),
            connect_timeout: Duration::from_secs(2),
            ack_timeout: Duration::from_secs(3),
            ..NatsConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let js = jetstream::new(self.nats.connect().await?);
        let mut stream = js
            .get_stream(stream_name(target))
            .await
            .map_err(|e| anyhow::anyhow!("stream {}: {e}", stream_name(target)))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let stored = loop {
            let stored = usize::try_from(stream.info().await?.state.messages)?;
            if stored >= at_least || Instant::now() >= deadline {
                break stored;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if stored == 0 {
            return Ok(Vec::new());
        }
        // A fresh ephemeral consumer from the start of the stream: every call sees everything.
        let consumer = stream.create_consumer(pull::Config::default()).await?;
        let mut messages = consumer
            .batch()
            .max_messages(stored)
            .expires(Duration::from_secs(2))
            .messages()
            .await?;
        let mut received = Vec::with_capacity(stored);
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| anyhow::anyhow!("{e}"))?;
            let headers = message
                .headers
                .iter()
                .flat_map(|headers| headers.iter())
                .flat_map(|(name, values)| {
                    values
                        .iter()
                        .map(move |v| (name.to_string(), v.as_str().to_owned()))
                })
                .collect();
            received.push(Received {
                destination: message.subject.to_string(),
                key: None,
                headers,
                body: message.payload.clone(),
            });
        }
        Ok(received)
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.nats.stop().await
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.nats.restart().await
    }

    fn broker_address(&self) -> String {
        format!("127.0.0.1:{}", self.nats.port())
    }

    fn max_message_size(&self) -> usize {
        self.max_payload
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::ByEventId
    }
}

#[tokio::test]
async fn nats_jetstream_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let nats = Nats::start().await?;
    let max_payload = nats.connect().await?.server_info().max_payload;
    sink_conformance::run_all(&NatsHarness { nats, max_payload }).await
}
