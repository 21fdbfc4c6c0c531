//! The sink conformance suite against SNS FIFO topics on a private moto server, read back as a
//! subscriber would: each topic has an SQS FIFO queue subscribed with raw message delivery
//! (body and message attributes as published), read with the AWS SDK. moto keeps nothing
//! across a restart, so the harness creates the topics, queues and subscriptions again.

#![cfg(all(feature = "sns", feature = "sqs"))]

#[path = "support/sqs.rs"]
mod sqs_support;

use std::time::Duration;

use anyhow::Context as _;
use aws_sdk_sqs::types::QueueAttributeName;
use outbox_core::Destination;
use outbox_sinks::{SnsConfig, SnsSink};
use outbox_testkit::services::Moto;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

struct SnsHarness {
    moto: Moto,
    sns: aws_sdk_sns::Client,
    /// One FIFO queue per destination, subscribed to its topic.
    reader: sqs_support::QueueReader,
}

impl SnsHarness {
    /// Topic `NAME.fifo`, queue `NAME.fifo` subscribed to it with raw delivery; the queue URL.
    async fn create(&self, destination: &str) -> anyhow::Result<String> {
        let name = format!("{destination}.fifo");
        let topic = self
            .sns
            .create_topic()
            .name(&name)
            .attributes("FifoTopic", "true")
            .send()
            .await
            .context("CreateTopic")?;
        let topic_arn = topic.topic_arn().context("no topic ARN")?;
        let queue_url = sqs_support::create_queue(&self.reader.client, &name).await?;
        let attributes = self
            .reader
            .client
            .get_queue_attributes()
            .queue_url(&queue_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await?;
        let queue_arn = attributes
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .context("no queue ARN")?;
        self.sns
            .subscribe()
            .topic_arn(topic_arn)
            .protocol("sqs")
            .endpoint(queue_arn)
            .attributes("RawMessageDelivery", "true")
            .send()
            .await
            .context("Subscribe")?;
        Ok(queue_url)
    }
}

impl SinkHarness for SnsHarness {
    type Sink = SnsSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<SnsSink> {
        for destination in &target.destinations {
            let url = self.create(destination).await?;
            self.reader.add(destination, url);
        }
        let config = SnsConfig {
            topic_arn: Some(Destination::parse(&format!(
                "arn:aws:sns:{}:{}:{}.fifo",
                Moto::REGION,
                Moto::ACCOUNT,
                target.template
            ))?),
            region: Some(Moto::REGION.to_owned()),
            endpoint_url: Some(self.moto.url().to_owned()),
            connect_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
            ..SnsConfig::default()
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
        outbox_sinks::sns::SNS_MAX_MESSAGE_SIZE
    }

    /// SNS FIFO topics drop a republished message within five minutes; moto's do not, but the
    /// subscribed SQS FIFO queue, which receives the deduplication id, does.
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
async fn sns_fifo_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    Moto::set_aws_env();
    let moto = Moto::start().await?;
    let sqs = sqs_support::client(&moto).await;
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(moto.url())
        .region(aws_config::Region::new(Moto::REGION))
        .load()
        .await;
    let harness = SnsHarness {
        sns: aws_sdk_sns::Client::new(&config),
        moto,
        reader: sqs_support::QueueReader::new(sqs),
    };
    sink_conformance::run_all(&harness).await
}
