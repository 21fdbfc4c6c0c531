//! The sink conformance suite against SQS FIFO queues on a private moto server (the suite stops
//! and restarts it; moto keeps nothing across a restart, so the harness creates the queues
//! again as an operator would), read back with the AWS SDK as a consumer would.

#![cfg(feature = "sqs")]

#[path = "support/sqs.rs"]
mod sqs_support;

use std::time::Duration;

use outbox_core::Destination;
use outbox_sinks::{SqsConfig, SqsSink};
use outbox_testkit::services::Moto;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

struct SqsHarness {
    moto: Moto,
    /// One FIFO queue `DESTINATION.fifo` per destination.
    reader: sqs_support::QueueReader,
}

impl SqsHarness {
    async fn create(&self, destination: &str) -> anyhow::Result<String> {
        sqs_support::create_queue(&self.reader.client, &format!("{destination}.fifo")).await
    }
}

impl SinkHarness for SqsHarness {
    type Sink = SqsSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<SqsSink> {
        for destination in &target.destinations {
            let url = self.create(destination).await?;
            self.reader.add(destination, url);
        }
        let config = SqsConfig {
            queue_url: Some(Destination::parse(&format!(
                "{}/{}/{}.fifo",
                self.moto.url(),
                Moto::ACCOUNT,
                target.template
            ))?),
            region: Some(Moto::REGION.to_owned()),
            endpoint_url: Some(self.moto.url().to_owned()),
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            ..SqsConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        self.reader.received(target, at_least).await
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.moto.stop().await
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.moto.restart().await?;
        for name in self.reader.destinations() {
            self.create(&name).await?;
        }
        Ok(())
    }

    fn broker_address(&self) -> String {
        format!("127.0.0.1:{}", self.moto.port())
    }

    fn max_message_size(&self) -> usize {
        outbox_sinks::sqs::DEFAULT_MAX_MESSAGE_SIZE
    }

    /// FIFO queues drop a second message with the same deduplication id (moto: while the
    /// first is still in the queue; SQS: for five minutes).
    fn dedupe(&self) -> Dedupe {
        Dedupe::ByEventId
    }

    fn separator(&self) -> char {
        '-'
    }

    fn durable(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn sqs_fifo_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    Moto::set_aws_env();
    let moto = Moto::start().await?;
    let client = sqs_support::client(&moto).await;
    let harness = SqsHarness {
        moto,
        reader: sqs_support::QueueReader::new(client),
    };
    sink_conformance::run_all(&harness).await
}
