//! A consumer of SQS queues on moto, as an application would write one with the AWS SDK: it
//! receives, decodes by the documented rules (`docs/sinks.md`, "SQS and SNS"), and deletes.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{Message, MessageSystemAttributeName, QueueAttributeName};
use base64::Engine as _;
use bytes::Bytes;
use outbox_testkit::services::Moto;
use outbox_testkit::sink_conformance::{Received, Target};

/// An SQS client for `moto` (dummy credentials from [`Moto::set_aws_env`]).
pub(crate) async fn client(moto: &Moto) -> Client {
    Moto::set_aws_env();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(moto.url())
        .region(aws_config::Region::new(Moto::REGION))
        .load()
        .await;
    Client::new(&config)
}

/// Creates queue `name` (FIFO when it ends with `.fifo`) and returns its URL.
pub(crate) async fn create_queue(client: &Client, name: &str) -> anyhow::Result<String> {
    let mut request = client.create_queue().queue_name(name);
    if name.ends_with(".fifo") {
        request = request.attributes(QueueAttributeName::FifoQueue, "true");
    }
    let out = request
        .send()
        .await
        .with_context(|| format!("creating queue {name}"))?;
    out.queue_url()
        .map(str::to_owned)
        .context("CreateQueue answered no URL")
}

/// One message as a consumer decodes it, with the SQS details the tests check.
#[derive(Debug, Clone)]
pub(crate) struct Decoded {
    /// Headers and body per the documented rules.
    pub(crate) received: Received,
    /// `MessageGroupId` (FIFO queues).
    pub(crate) group_id: Option<String>,
    /// The raw attributes as SQS delivered them.
    pub(crate) attributes: HashMap<String, String>,
    /// The raw body.
    pub(crate) raw_body: String,
}

/// Receives (and deletes) what `queue_url` holds now, up to `max` messages.
pub(crate) async fn drain(
    client: &Client,
    queue_url: &str,
    destination: &str,
    max: usize,
) -> anyhow::Result<Vec<Decoded>> {
    let mut out = Vec::new();
    while out.len() < max {
        let answer = client
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .wait_time_seconds(0)
            .send()
            .await
            .with_context(|| format!("receiving from {queue_url}"))?;
        let messages = answer.messages();
        if messages.is_empty() {
            break;
        }
        for message in messages {
            out.push(decode(message, destination)?);
            if let Some(handle) = message.receipt_handle() {
                client
                    .delete_message()
                    .queue_url(queue_url)
                    .receipt_handle(handle)
                    .send()
                    .await?;
            }
        }
    }
    Ok(out)
}

/// Decodes one message: `content-transfer-encoding` says how the body holds the payload,
/// `outbox-headers` holds the headers that were not attributes of their own.
pub(crate) fn decode(message: &Message, destination: &str) -> anyhow::Result<Decoded> {
    let raw_body = message.body().unwrap_or_default().to_owned();
    let attributes: HashMap<String, String> = message
        .message_attributes()
        .map(|a| {
            a.iter()
                .map(|(n, v)| (n.clone(), v.string_value().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let group_id = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
        .cloned();
    let received = decode_parts(&raw_body, &attributes, destination)?;
    Ok(Decoded {
        received,
        group_id,
        attributes,
        raw_body,
    })
}

/// The documented decoding, from a body and String attributes (also used for SNS).
pub(crate) fn decode_parts(
    body: &str,
    attributes: &HashMap<String, String>,
    destination: &str,
) -> anyhow::Result<Received> {
    let payload = match attributes
        .get("content-transfer-encoding")
        .map(String::as_str)
    {
        None => Bytes::from(body.to_owned()),
        Some("base64") => Bytes::from(base64::engine::general_purpose::STANDARD.decode(body)?),
        Some("empty") => Bytes::new(),
        Some(other) => anyhow::bail!("unknown content-transfer-encoding `{other}`"),
    };
    // Contract headers first, in the documented order, then the rest by name (SQS does not
    // keep attribute order), then the overflow in its own order.
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut names: Vec<&String> = attributes
        .keys()
        .filter(|n| *n != "content-transfer-encoding" && *n != "outbox-headers")
        .collect();
    let contract = ["id", "event_type", "aggregate_type", "aggregate_id"];
    names.sort_by_key(|n| {
        (
            contract
                .iter()
                .position(|c| c == n)
                .unwrap_or(contract.len()),
            (*n).clone(),
        )
    });
    for name in names {
        headers.push((name.clone(), attributes[name].clone()));
    }
    if let Some(overflow) = attributes.get("outbox-headers") {
        let pairs: Vec<(String, String)> =
            serde_json::from_str(overflow).context("outbox-headers is not JSON pairs")?;
        headers.extend(pairs);
    }
    Ok(Received {
        destination: destination.to_owned(),
        key: None,
        headers,
        body: payload,
    })
}

/// What a conformance harness reads through SQS queues: one queue per destination, read
/// (and deleted) as it fills, everything read kept so that every call returns it all.
#[derive(Debug)]
pub(crate) struct QueueReader {
    pub(crate) client: Client,
    /// Destination → URL of the queue that receives its messages.
    queues: Mutex<HashMap<String, String>>,
    /// Everything read so far per destination.
    seen: Mutex<HashMap<String, Vec<Received>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl QueueReader {
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            queues: Mutex::default(),
            seen: Mutex::default(),
        }
    }

    /// Remembers that `destination`'s messages arrive in the queue at `url`.
    pub(crate) fn add(&self, destination: &str, url: String) {
        lock(&self.queues).insert(destination.to_owned(), url);
    }

    /// Every destination added so far.
    pub(crate) fn destinations(&self) -> Vec<String> {
        lock(&self.queues).keys().cloned().collect()
    }

    /// See `SinkHarness::received`.
    pub(crate) async fn received(
        &self,
        target: &Target,
        at_least: usize,
    ) -> anyhow::Result<Vec<Received>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for destination in &target.destinations {
                let url = lock(&self.queues).get(destination).cloned();
                let Some(url) = url else { continue };
                let got = drain(&self.client, &url, destination, 1000).await?;
                lock(&self.seen)
                    .entry(destination.clone())
                    .or_default()
                    .extend(got.into_iter().map(|d| d.received));
            }
            let all: Vec<Received> = {
                let seen = lock(&self.seen);
                target
                    .destinations
                    .iter()
                    .flat_map(|d| seen.get(d).cloned().unwrap_or_default())
                    .collect()
            };
            if all.len() >= at_least || Instant::now() >= deadline {
                return Ok(all);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
