//! What moto cannot show: a batch call that SQS or Kinesis answers with some entries failed.
//! A small fault-injecting proxy sits between the sink (its `endpoint_url`) and a real moto
//! server: for the calls it is told to fail, it removes chosen entries from the request before
//! forwarding it (so moto never stores them) and adds them to the answer as failed, exactly as
//! AWS reports partial failures. Everything else passes through untouched.

#![cfg(all(feature = "sqs", feature = "kinesis", feature = "http"))]

#[path = "support/kinesis.rs"]
mod kinesis_support;
#[path = "support/sqs.rs"]
mod sqs_support;

use std::sync::{Arc, Mutex};

use anyhow::{Context as _, ensure};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use bytes::Bytes as Payload;
use outbox_core::{Destination, Event, Position, Sink as _, SinkErrorKind};
use outbox_sinks::{KinesisConfig, SqsConfig};
use outbox_testkit::services::Moto;
use serde_json::{Value, json};

/// Which entries of which call to fail, and what the proxy saw.
#[derive(Debug, Default)]
struct Script {
    /// `(call number from 1, entry position, sender's fault)`.
    failures: Vec<(usize, usize, bool)>,
    /// Batch calls seen so far.
    calls: usize,
    /// Entries per batch call, in order.
    sizes: Vec<usize>,
}

struct FaultProxy {
    url: String,
    script: Arc<Mutex<Script>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FaultProxy {
    /// A proxy in front of `upstream` that fails entries of `SendMessageBatch` (SQS) and
    /// `PutRecords` (Kinesis) calls as `failures` says.
    async fn start(upstream: &str, failures: Vec<(usize, usize, bool)>) -> anyhow::Result<Self> {
        let script = Arc::new(Mutex::new(Script {
            failures,
            ..Script::default()
        }));
        let client = reqwest::Client::new();
        let upstream = upstream.to_owned();
        let state = script.clone();
        let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let client = client.clone();
            let upstream = upstream.clone();
            let script = state.clone();
            async move {
                forward(&client, &upstream, &script, uri, headers, body)
                    .await
                    .unwrap_or_else(|e| {
                        (
                            StatusCode::BAD_GATEWAY,
                            HeaderMap::new(),
                            Bytes::from(e.to_string()),
                        )
                    })
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Self { url, script })
    }
}

async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    script: &Mutex<Script>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> anyhow::Result<(StatusCode, HeaderMap, Bytes)> {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let list = match target.as_str() {
        "AmazonSQS.SendMessageBatch" => Some("Entries"),
        "Kinesis_20131202.PutRecords" => Some("Records"),
        _ => None,
    };
    let mut body = body;
    let mut injected: Vec<(usize, bool, Value)> = Vec::new();
    if let Some(list) = list {
        let mut request: Value = serde_json::from_slice(&body)?;
        let entries = request[list].as_array_mut().context("no entry list")?;
        let mut script = lock(script);
        script.calls += 1;
        script.sizes.push(entries.len());
        let call = script.calls;
        let mut fail: Vec<(usize, bool)> = script
            .failures
            .iter()
            .filter(|(c, p, _)| *c == call && *p < entries.len())
            .map(|(_, p, sender)| (*p, *sender))
            .collect();
        fail.sort_unstable();
        for (position, sender) in fail.into_iter().rev() {
            injected.push((position, sender, entries.remove(position)));
        }
        injected.reverse();
        body = Bytes::from(serde_json::to_vec(&request)?);
    }
    if list.is_some() && !injected.is_empty() {
        let request: Value = serde_json::from_slice(&body)?;
        if request[list.unwrap_or_default()]
            .as_array()
            .is_some_and(Vec::is_empty)
        {
            // Every entry failed: answer as AWS would, without an (invalid) empty call.
            let answer = if target.starts_with("AmazonSQS") {
                json!({"Successful": [], "Failed": []})
            } else {
                json!({"Records": [], "FailedRecordCount": 0})
            };
            let mut answer_headers = HeaderMap::new();
            answer_headers.insert("content-type", "application/x-amz-json-1.0".parse()?);
            return Ok(inject(
                &target,
                &injected,
                StatusCode::OK,
                answer_headers,
                answer,
            ));
        }
    }
    let mut forwarded = client.post(format!("{upstream}{}", uri.path()));
    for (name, value) in &headers {
        if name != "host" && name != "content-length" {
            forwarded = forwarded.header(name, value);
        }
    }
    let answer = forwarded.body(body).send().await?;
    let status = StatusCode::from_u16(answer.status().as_u16())?;
    let mut answer_headers = HeaderMap::new();
    if let Some(ct) = answer.headers().get("content-type") {
        answer_headers.insert("content-type", ct.to_str()?.parse()?);
    }
    let answer_body = answer.bytes().await?;
    if injected.is_empty() || !status.is_success() {
        return Ok((status, answer_headers, answer_body));
    }
    let answer_json: Value = serde_json::from_slice(&answer_body)?;
    Ok(inject(
        &target,
        &injected,
        status,
        answer_headers,
        answer_json,
    ))
}

/// The answer with the removed entries added as failed: SQS lists them under `Failed`;
/// Kinesis puts a result with an `ErrorCode` at each one's position.
fn inject(
    target: &str,
    injected: &[(usize, bool, Value)],
    status: StatusCode,
    headers: HeaderMap,
    mut answer: Value,
) -> (StatusCode, HeaderMap, Bytes) {
    if target.starts_with("AmazonSQS") {
        let mut failed = answer["Failed"].as_array().cloned().unwrap_or_default();
        for (_, sender, entry) in injected {
            failed.push(json!({
                "Id": entry["Id"],
                "SenderFault": sender,
                "Code": if *sender { "InvalidParameterValue" } else { "InternalError" },
                "Message": "injected by the test proxy",
            }));
        }
        answer["Failed"] = Value::Array(failed);
    } else {
        let mut records = answer["Records"].as_array().cloned().unwrap_or_default();
        for (position, _, _) in injected {
            records.insert(
                (*position).min(records.len()),
                json!({
                    "ErrorCode": "ProvisionedThroughputExceededException",
                    "ErrorMessage": "Rate exceeded for shard (injected by the test proxy)",
                }),
            );
        }
        answer["Records"] = Value::Array(records);
        answer["FailedRecordCount"] = json!(injected.len());
    }
    let body = Bytes::from(serde_json::to_vec(&answer).unwrap_or_default());
    (status, headers, body)
}

fn event(aggregate_id: &str, payload: &str) -> Event {
    Event {
        id: uuid::Uuid::now_v7(),
        position: Position(0),
        aggregate_type: "Order".into(),
        aggregate_id: aggregate_id.into(),
        event_type: "order.placed".into(),
        payload: Payload::from(payload.to_owned()),
        headers: Vec::new(),
        created_at: time::OffsetDateTime::now_utc(),
        attempts: 0,
    }
}

fn unique() -> String {
    format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

#[tokio::test]
async fn sqs_entries_that_fail_on_aws_side_are_sent_again_alone_and_sender_faults_are_rejected()
-> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let client = sqs_support::client(moto).await;
    let queue = format!("{}.fifo", unique());
    let url = sqs_support::create_queue(&client, &queue).await?;
    // Call 1: entry 1 fails on SQS' side, entry 3 is the sender's fault. Call 2 (entry 1
    // again, alone) passes.
    let proxy = FaultProxy::start(moto.url(), vec![(1, 1, false), (1, 3, true)]).await?;
    let sink = SqsConfig {
        queue_url: Some(Destination::parse(&url)?),
        endpoint_url: Some(proxy.url.clone()),
        region: Some(Moto::REGION.into()),
        ..SqsConfig::default()
    }
    .build()
    .await?;
    let batch: Vec<Event> = (0..5)
        .map(|i| event(&format!("o_{i}"), &format!("e{i}")))
        .collect();
    let deliveries = sink.publish(&batch).await?;
    for (i, d) in deliveries.iter().enumerate() {
        if i == 3 {
            let err = d.as_ref().err().context("the sender's fault must fail")?;
            ensure!(err.kind() == SinkErrorKind::Rejected, "{err:?}");
            ensure!(
                err.report().contains("InvalidParameterValue"),
                "{}",
                err.report()
            );
        } else {
            ensure!(d.is_ok(), "event {i}: {d:?}");
        }
    }
    let sizes = lock(&proxy.script).sizes.clone();
    ensure!(
        sizes == [5, 1],
        "calls: first the batch, then the failed entry alone: {sizes:?}"
    );
    let got = sqs_support::drain(&client, &url, &queue, 100).await?;
    let mut bodies: Vec<String> = got
        .iter()
        .map(|d| String::from_utf8_lossy(&d.received.body).into_owned())
        .collect();
    bodies.sort();
    ensure!(
        bodies == ["e0", "e1", "e2", "e4"],
        "each delivered event once: {bodies:?}"
    );
    Ok(())
}

#[tokio::test]
async fn sqs_entries_failing_every_time_end_transient_without_holding_the_others()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let client = sqs_support::client(moto).await;
    let queue = unique();
    let url = sqs_support::create_queue(&client, &queue).await?;
    // Entry 0 fails in the batch and in both resends.
    let proxy = FaultProxy::start(
        moto.url(),
        vec![(1, 0, false), (2, 0, false), (3, 0, false)],
    )
    .await?;
    let sink = SqsConfig {
        queue_url: Some(Destination::parse(&url)?),
        endpoint_url: Some(proxy.url.clone()),
        ..SqsConfig::default()
    }
    .build()
    .await?;
    let batch = [event("o_1", "a"), event("o_2", "b")];
    let deliveries = sink.publish(&batch).await?;
    let err = deliveries[0].as_ref().err().context("must fail")?;
    ensure!(err.kind() == SinkErrorKind::Transient, "{err:?}");
    ensure!(err.report().contains("InternalError"), "{}", err.report());
    ensure!(deliveries[1].is_ok(), "{:?}", deliveries[1]);
    ensure!(lock(&proxy.script).sizes == [2, 1, 1]);
    Ok(())
}

#[tokio::test]
async fn a_kinesis_record_that_fails_is_written_again_and_every_key_keeps_its_order()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let client = kinesis_support::client(moto).await;
    let stream = unique();
    kinesis_support::create_stream(&client, &stream, 2).await?;
    // Call 1: records 0 and 2 throttled; call 2 resends them alone and passes.
    let proxy = FaultProxy::start(moto.url(), vec![(1, 0, false), (1, 2, false)]).await?;
    let sink = KinesisConfig {
        stream: Some(Destination::parse(&stream)?),
        endpoint_url: Some(proxy.url.clone()),
        ..KinesisConfig::default()
    }
    .build()
    .await?;
    // Three batches of one event per aggregate, as the relay hands them over.
    for round in 0..3 {
        let batch: Vec<Event> = (0..4)
            .map(|a| event(&format!("o_{a}"), &format!("o_{a}#{round}")))
            .collect();
        let deliveries = sink.publish(&batch).await?;
        ensure!(
            deliveries.iter().all(Result::is_ok),
            "round {round}: {deliveries:?}"
        );
    }
    ensure!(lock(&proxy.script).sizes[..2] == [4, 2]);
    let records = kinesis_support::read_all(&client, &stream).await?;
    ensure!(records.len() == 12, "{} records", records.len());
    for a in 0..4 {
        let key = format!("o_{a}");
        let got: Vec<String> = records
            .iter()
            .filter(|r| r.received.key.as_deref() == Some(key.as_str()))
            .map(|r| String::from_utf8_lossy(&r.received.body).into_owned())
            .collect();
        let expected: Vec<String> = (0..3).map(|round| format!("{key}#{round}")).collect();
        ensure!(got == expected, "{key}: {got:?}");
    }
    Ok(())
}

#[tokio::test]
async fn an_illegal_rendered_queue_name_is_rejected_while_the_others_flow() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let client = sqs_support::client(moto).await;
    let prefix = unique();
    let url = sqs_support::create_queue(&client, &format!("{prefix}-Order")).await?;
    let sink = SqsConfig {
        queue_url: Some(Destination::parse(&format!(
            "{}/{}/{prefix}-{{aggregate_type}}",
            moto.url(),
            Moto::ACCOUNT
        ))?),
        endpoint_url: Some(moto.url().to_owned()),
        ..SqsConfig::default()
    }
    .build()
    .await?;
    let mut odd = event("i_1", "x");
    odd.aggregate_type = "In.voice".into();
    let batch = [event("o_1", "ok"), odd];
    let deliveries = sink.publish(&batch).await?;
    ensure!(deliveries[0].is_ok(), "{:?}", deliveries[0]);
    let err = deliveries[1].as_ref().err().context("must be rejected")?;
    ensure!(err.kind() == SinkErrorKind::Rejected, "{err:?}");
    ensure!(
        err.report().contains("not a legal SQS queue name"),
        "{}",
        err.report()
    );
    let got = sqs_support::drain(&client, &url, "q", 10).await?;
    ensure!(got.len() == 1, "{got:?}");
    Ok(())
}
