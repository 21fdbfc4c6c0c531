//! The sink conformance suite for the HTTP webhook sink, against the testkit's recording
//! receiver (a real HTTP server on 127.0.0.1) standing in for the webhook consumer.
//!
//! The receiver accepts bodies up to [`LIMIT`] bytes and answers 413 above, as a webhook
//! endpoint with a body limit would; only requests it answered 2xx count as received.

#![cfg(feature = "http")]

use std::num::NonZeroUsize;
use std::time::Duration;

use bytes::Bytes;

use outbox_sinks::stdout::JsonLine;
use outbox_sinks::{HttpConfig, HttpSink};
use outbox_testkit::services::HttpReceiver;
use outbox_testkit::sink_conformance::{self, Dedupe, Received, SinkHarness, Target};

/// The receiver's body limit.
const LIMIT: usize = 256 * 1024;

struct HttpHarness {
    receiver: HttpReceiver,
    /// `events_per_request`: 1 is the one-event mode; above 1 each request body holds JSON
    /// lines, one per event, which the harness splits into messages.
    events_per_request: usize,
}

impl HttpHarness {
    /// The messages in one accepted request.
    fn messages(
        &self,
        request: &outbox_testkit::services::Request,
    ) -> anyhow::Result<Vec<Received>> {
        let destination = request.path.trim_start_matches('/').to_owned();
        if self.events_per_request == 1 {
            return Ok(vec![Received {
                destination,
                key: None,
                headers: request
                    .headers
                    .iter()
                    .map(|(n, v)| {
                        let name = n.strip_prefix("outbox-").unwrap_or(n);
                        (name.to_owned(), v.clone())
                    })
                    .collect(),
                body: request.body.clone(),
            }]);
        }
        anyhow::ensure!(
            request.header("content-type") == Some("application/x-ndjson"),
            "a batched request's content-type is {:?}",
            request.header("content-type")
        );
        std::str::from_utf8(&request.body)?
            .lines()
            .map(|line| {
                let line = JsonLine::parse(line)?;
                Ok(Received {
                    destination: destination.clone(),
                    key: Some(line.key.clone()),
                    headers: line.headers.clone().into_iter().collect(),
                    body: Bytes::from(line.payload_bytes()?),
                })
            })
            .collect()
    }
}

impl SinkHarness for HttpHarness {
    type Sink = HttpSink;

    async fn sink(&self, target: &Target) -> anyhow::Result<HttpSink> {
        let config = HttpConfig {
            url: format!("{}/{}", self.receiver.url(), target.template),
            timeout: Duration::from_secs(3),
            events_per_request: NonZeroUsize::new(self.events_per_request).expect("not zero"),
            ..HttpConfig::default()
        };
        Ok(config.build().await?)
    }

    async fn received(&self, target: &Target, at_least: usize) -> anyhow::Result<Vec<Received>> {
        let ours = |path: &str| target.destinations.iter().any(|d| path == format!("/{d}"));
        let accepted_ours = |r: &&outbox_testkit::services::Request| r.accepted() && ours(&r.path);
        let messages = |requests: Vec<outbox_testkit::services::Request>| {
            requests
                .iter()
                .filter(accepted_ours)
                .map(|r| self.messages(r))
                .collect::<anyhow::Result<Vec<_>>>()
                .map(|m| m.into_iter().flatten().collect::<Vec<_>>())
        };
        let done = |requests: &[outbox_testkit::services::Request]| {
            messages(requests.to_vec()).is_ok_and(|m| m.len() >= at_least)
        };
        // On timeout, report what did arrive: the suite says what is missing.
        let requests = match self
            .receiver
            .wait_until("accepted messages", Duration::from_secs(10), done)
            .await
        {
            Ok(requests) => requests,
            Err(_) => self.receiver.received(),
        };
        messages(requests)
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

    /// A batched request's lines carry the message key (`aggregate_id`).
    fn keyed(&self) -> bool {
        self.events_per_request > 1
    }
}

#[tokio::test]
async fn http_webhook_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let receiver = HttpReceiver::start().await?;
    receiver.respond_when(|request| (request.body.len() > LIMIT).then_some(413));
    sink_conformance::run_all(&HttpHarness {
        receiver,
        events_per_request: 1,
    })
    .await
}

/// The batched mode (`events_per_request = 50`) keeps the same promises: every event
/// delivered once per acknowledgement, order per destination, the oversized event refused
/// alone (its request is answered 413, then each of its events is sent again alone).
#[tokio::test]
async fn the_batched_http_webhook_sink_passes_the_sink_conformance_suite() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let receiver = HttpReceiver::start().await?;
    receiver.respond_when(|request| (request.body.len() > LIMIT).then_some(413));
    sink_conformance::run_all(&HttpHarness {
        receiver,
        events_per_request: 50,
    })
    .await
}
