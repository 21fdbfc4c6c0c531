//! The sink conformance suite against Kinesis data streams on a private moto server (one shard
//! per stream, so that the suite's cross-key expectations hold), read back with the AWS SDK
//! from the oldest record. Records carry no headers: the suite tells events apart by partition
//! key and data. moto keeps nothing across a restart, so the harness creates the streams again.

#![cfg(feature = "kinesis")]

#[path = "support/kinesis.rs"]
mod kinesis_support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use outbox_sinks::{KinesisConfig, KinesisSink};
use outbox_testkit::services::Moto;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

/// A small record limit keeps the oversized check light.
const MAX_RECORD: usize = 64 * 1024;

struct KinesisHarness {
    moto: Moto,
    client: aws_sdk_kinesis::Client,
    streams: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SinkHarness for KinesisHarness {
    type Sink = KinesisSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<KinesisSink> {
        for stream in &target.destinations {
            kinesis_support::create_stream(&self.client, stream, 1).await?;
            lock(&self.streams).push(stream.clone());
        }
        let config = KinesisConfig {
            stream: Some(target.template.clone()),
            region: Some(Moto::REGION.to_owned()),
            endpoint_url: Some(self.moto.url().to_owned()),
            max_message_size: MAX_RECORD,
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            ..KinesisConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut all = Vec::new();
            for stream in &target.destinations {
                let records = kinesis_support::read_all(&self.client, stream).await?;
                all.extend(records.into_iter().map(|r| r.received));
            }
            if all.len() >= at_least || Instant::now() >= deadline {
                return Ok(all);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.moto.stop().await
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.moto.restart().await?;
        let streams = lock(&self.streams).clone();
        for stream in streams {
            kinesis_support::create_stream(&self.client, &stream, 1).await?;
        }
        Ok(())
    }

    fn broker_address(&self) -> String {
        format!("127.0.0.1:{}", self.moto.port())
    }

    fn max_message_size(&self) -> usize {
        // The partition key counts too: the suite's keys are short (`o_2`).
        MAX_RECORD - "o_2".len()
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::No
    }

    fn keyed(&self) -> bool {
        true
    }

    fn carries_headers(&self) -> bool {
        false
    }

    fn durable(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn kinesis_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    Moto::set_aws_env();
    let moto = Moto::start().await?;
    let client = kinesis_support::client(&moto).await;
    let harness = KinesisHarness {
        moto,
        client,
        streams: Mutex::default(),
    };
    sink_conformance::run_all(&harness).await
}
