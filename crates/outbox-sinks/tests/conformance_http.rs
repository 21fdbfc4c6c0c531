//! The sink conformance suite for the HTTP webhook sink, against the testkit's recording
//! receiver (a real HTTP server on 127.0.0.1) standing in for the webhook consumer.
//!
//! The receiver accepts bodies up to [`LIMIT`] bytes and answers 413 above, as a webhook
//! endpoint with a body limit would; only requests it answered 2xx count as received.

#![cfg(feature = "http")]

use std::time::Duration;

use outbox_sinks::{HttpConfig, HttpSink};
use outbox_testkit::services::HttpReceiver;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

/// The receiver's body limit.
const LIMIT: usize = 256 * 1024;

struct HttpHarness {
    receiver: HttpReceiver,
}

impl SinkHarness for HttpHarness {
    type Sink = HttpSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<HttpSink> {
        let config = HttpConfig {
            url: format!("{}/{}", self.receiver.url(), target.template),
            timeout: Duration::from_secs(3),
            ..HttpConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let ours = |path: &str| target.destinations.iter().any(|d| path == format!("/{d}"));
        let done = |requests: &[outbox_testkit::services::Request]| {
            requests
                .iter()
                .filter(|r| r.accepted() && ours(&r.path))
                .count()
                >= at_least
        };
        // On timeout, report what did arrive: the suite says what is missing.
        let requests = match self
            .receiver
            .wait_until("accepted requests", Duration::from_secs(10), done)
            .await
        {
            Ok(requests) => requests,
            Err(_) => self.receiver.received(),
        };
        Ok(requests
            .into_iter()
            .filter(|r| r.accepted() && ours(&r.path))
            .map(|r| Received {
                destination: r.path.trim_start_matches('/').to_owned(),
                key: None,
                headers: r
                    .headers
                    .iter()
                    .map(|(n, v)| {
                        let name = n.strip_prefix("outbox-").unwrap_or(n);
                        (name.to_owned(), v.clone())
                    })
                    .collect(),
                body: r.body,
            })
            .collect())
    }

    async fn stop_broker(&self) -> anyhow::Result<()> {
        self.receiver.stop().await;
        Ok(())
    }

    async fn restart_broker(&self) -> anyhow::Result<()> {
        self.receiver.restart().await
    }

    fn broker_address(&self) -> String {
        self.receiver.addr().to_string()
    }

    fn max_message_size(&self) -> usize {
        LIMIT
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::No
    }
}

#[tokio::test]
async fn http_webhook_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let receiver = HttpReceiver::start().await?;
    receiver.respond_when(|request| (request.body.len() > LIMIT).then_some(413));
    sink_conformance::run_all(&HttpHarness { receiver }).await
}
