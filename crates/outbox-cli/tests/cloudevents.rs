//! End to end through the binary for `[sink] format = "cloudevents-binary"` and
//! `"cloudevents-structured"`: plain-SQL producers, PostgreSQL, `outbox relay`, real brokers,
//! and the CloudEvents Python SDK (PyPI `cloudevents`, `tests/cloudevents/ce_consumer.py`)
//! reading what arrived, as a consumer in another language would. The SDK must parse every
//! message, and its id, type, source, subject, time, datacontenttype, extensions and data
//! must be the outbox event's. Kafka and RabbitMQ messages are read with the Rust clients
//! and handed to the SDK's `kafka` and `rabbitmq` bindings; webhooks go straight to a Python
//! HTTP server that parses them with `from_http`. NATS (no binding in the Python SDK), Kafka
//! and signed webhooks (the inbox's `WebhookReceiver`) are also read back by the inbox
//! (`outbox_inbox::InboxMessage`): the event id stays the deduplication key. An unknown `format` is a clear error of `check-config` and `relay`.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use base64::Engine as _;
use outbox_testkit::services::Postgres;
use serde_json::{Value, json};
use support::{Workdir, terminate, wait_drained};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

const WAIT: Duration = Duration::from_secs(30);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A name no other test uses.
fn unique() -> String {
    format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

/// One event as the producer wrote it.
#[derive(Debug, Clone)]
struct Written {
    id: String,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: Vec<u8>,
    headers: Vec<(String, String)>,
    created_at: OffsetDateTime,
    /// Its position within its aggregate (the relay's `aggregate_seq`).
    seq: u64,
}

impl Written {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Migrates a fresh database with `config` and writes four events the way a producer in any
/// language would: JSON with trace context and a header that is no legal extension name,
/// binary bytes for an aggregate id with a space and non-ASCII, text with its own content
/// type, and a multi-line JSON array. Returns the pool and the events in commit order.
async fn produce(
    work: &Workdir,
    config: &str,
    url: &str,
) -> anyhow::Result<(sqlx::PgPool, Vec<Written>)> {
    let out = work.run(&["migrate", "--config", config]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = sqlx::PgPool::connect(url).await?;
    let events: [(&str, &str, &str, &[u8], Value); 4] = [
        (
            "Order",
            "o_1",
            "order.placed",
            br#"{"order_id":"o_1","total_cents":1250}"#,
            json!({"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE", "tenant_id": "acme"}),
        ),
        (
            "Order",
            "Zürich 1",
            "order.paid",
            b"\x00\xff\xfe binary\r\n",
            json!({"content-type": "application/octet-stream"}),
        ),
        (
            "Invoice",
            "i_1",
            "invoice.sent",
            "plain text, 100% not JSON".as_bytes(),
            json!({"content-type": "text/plain; charset=utf-8"}),
        ),
        ("Order", "o_1", "order.shipped", b"[1, 2,\n 3]", json!({})),
    ];
    for (aggregate_type, aggregate_id, event_type, payload, headers) in &events {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(event_type)
        .bind(payload.to_vec())
        .bind(headers.clone())
        .execute(&pool)
        .await?;
    }
    let rows = sqlx::query_as::<_, (String, String, String, String, Vec<u8>, OffsetDateTime)>(
        "SELECT id::text, aggregate_type, aggregate_id, event_type, payload, created_at \
         FROM outbox ORDER BY seq",
    )
    .fetch_all(&pool)
    .await?;
    ensure!(rows.len() == events.len(), "{rows:?}");
    let mut seqs: HashMap<(String, String), u64> = HashMap::new();
    let written = rows
        .into_iter()
        .zip(&events)
        .map(
            |((id, aggregate_type, aggregate_id, event_type, payload, created_at), e)| {
                let seq = seqs
                    .entry((aggregate_type.clone(), aggregate_id.clone()))
                    .or_default();
                *seq += 1;
                let headers =
                    e.4.as_object()
                        .into_iter()
                        .flatten()
                        .map(|(n, v)| (n.clone(), v.as_str().unwrap_or_default().to_owned()))
                        .collect();
                Written {
                    id,
                    aggregate_type,
                    aggregate_id,
                    event_type,
                    payload,
                    headers,
                    created_at,
                    seq: *seq,
                }
            },
        )
        .collect();
    Ok((pool, written))
}

/// Writes `sink` (the `[sink]` section) with a PostgreSQL source, migrates, produces the
/// events, runs the relay until they are all delivered, stops it (SIGTERM, exit 0) and
/// returns them.
async fn relay(
    work: &Workdir,
    url: &str,
    sink: &str,
    mut until_delivered: impl FnMut() -> Option<String>,
) -> anyhow::Result<Vec<Written>> {
    let config = work.write_config(
        "outbox.toml",
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n{sink}"),
    )?;
    let config = config.to_str().context("utf-8 path")?;
    let (pool, written) = produce(work, config, url).await?;
    let mut relay = work.spawn_relay(Path::new(config), "relay.log")?;
    wait_drained(&pool, WAIT)
        .await
        .with_context(|| work.read_log("relay.log"))?;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'dead'")
        .fetch_one(&pool)
        .await?;
    ensure!(
        dead == 0,
        "{dead} events dead-lettered: {}{}",
        until_delivered().unwrap_or_default(),
        work.read_log("relay.log")
    );
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}: {}",
        work.read_log("relay.log")
    );
    pool.close().await;
    Ok(written)
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cloudevents/ce_consumer.py")
}

const SDK_MISSING: &str = "running python3 with the CloudEvents SDK (pip install 'cloudevents>=2,<3'; scripts/services.sh installs it)";

/// Hands `messages` to the SDK (`ce_consumer.py decode`); one parsed event per message.
async fn sdk_decode(messages: &[Value]) -> anyhow::Result<Vec<Value>> {
    let mut child = tokio::process::Command::new("python3")
        .arg(script())
        .arg("decode")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context(SDK_MISSING)?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut input = String::new();
    for m in messages {
        input.push_str(&m.to_string());
        input.push('\n');
    }
    stdin.write_all(input.as_bytes()).await?;
    drop(stdin);
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .context("the SDK did not finish")??;
    ensure!(
        out.status.success(),
        "the CloudEvents SDK refused a message ({SDK_MISSING}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)?
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Checks what the SDK parsed against the events written: every event exactly once, with
/// its attributes and data.
fn check_parsed(
    parsed: &[Value],
    written: &[Written],
    source: impl Fn(&Written) -> String,
) -> anyhow::Result<()> {
    ensure!(
        parsed.len() == written.len(),
        "{} events parsed, {} written: {parsed:#?}",
        parsed.len(),
        written.len()
    );
    for w in written {
        let found: Vec<&Value> = parsed.iter().filter(|p| p["id"] == w.id.as_str()).collect();
        ensure!(
            found.len() == 1,
            "event {} parsed {} times",
            w.id,
            found.len()
        );
        let p = found[0];
        let text = |name: &str| p[name].as_str().map(str::to_owned);
        ensure!(text("specversion").as_deref() == Some("1.0"), "{p}");
        ensure!(
            text("type").as_deref() == Some(w.event_type.as_str()),
            "{p}"
        );
        ensure!(text("source") == Some(source(w)), "{p}");
        ensure!(
            text("subject").as_deref() == Some(w.aggregate_id.as_str()),
            "{p}"
        );
        let time = OffsetDateTime::parse(&text("time").context("time")?, &Rfc3339)?;
        ensure!(time == w.created_at, "time {time} vs {}: {p}", w.created_at);
        let content_type = w.header("content-type").unwrap_or("application/json");
        ensure!(
            text("datacontenttype").as_deref() == Some(content_type),
            "{p}"
        );
        ensure!(
            text("aggregatetype").as_deref() == Some(w.aggregate_type.as_str()),
            "{p}"
        );
        ensure!(text("aggregateseq") == Some(w.seq.to_string()), "{p}");
        if w.header("traceparent").is_some() {
            ensure!(text("traceparent").as_deref() == Some(TRACEPARENT), "{p}");
            ensure!(
                text("tracestate").as_deref() == Some("congo=t61rcWkgMzE"),
                "{p}"
            );
            let overflow: Vec<(String, String)> =
                serde_json::from_str(&text("outboxheaders").context("outboxheaders")?)?;
            ensure!(
                overflow == [("tenant_id".to_owned(), "acme".to_owned())],
                "{overflow:?}"
            );
        }
        if content_type == "application/json" {
            let expected: Value = serde_json::from_slice(&w.payload)?;
            ensure!(p["data_json"] == expected, "data of {}: {p}", w.id);
        } else {
            let data = base64::engine::general_purpose::STANDARD
                .decode(p["data_b64"].as_str().context("data")?)?;
            ensure!(data == w.payload, "data of {}: {p}", w.id);
        }
    }
    Ok(())
}

fn default_source(w: &Written) -> String {
    format!("urn:outbox:{}", w.aggregate_type)
}

/// Checks what the inbox read back: the event id, the contract, the row headers, and (for
/// the binary mode and data_base64) the exact payload.
fn check_inbox(
    read: &[outbox_inbox::InboxMessage],
    written: &[Written],
    structured: bool,
) -> anyhow::Result<()> {
    ensure!(read.len() == written.len(), "{read:?}");
    for w in written {
        let m = read
            .iter()
            .find(|m| m.id.to_string() == w.id)
            .with_context(|| format!("event {} not read back: {read:?}", w.id))?;
        ensure!(m.event_type == w.event_type, "{m:?}");
        ensure!(m.aggregate_type == w.aggregate_type, "{m:?}");
        ensure!(m.aggregate_id == w.aggregate_id, "{m:?}");
        ensure!(m.aggregate_seq == Some(w.seq), "{m:?}");
        for (name, value) in &w.headers {
            ensure!(
                m.headers.contains(&(name.clone(), value.clone())),
                "header {name} of {}: {m:?}",
                w.id
            );
        }
        // A structured JSON `data` is the payload's JSON text as embedded; the others are
        // the bytes exactly.
        if !structured || w.header("content-type").is_some() || w.payload.starts_with(b"{") {
            ensure!(m.payload == w.payload, "payload of {}: {m:?}", w.id);
        } else {
            let a: Value = serde_json::from_slice(&m.payload)?;
            let b: Value = serde_json::from_slice(&w.payload)?;
            ensure!(a == b, "payload of {}: {m:?}", w.id);
        }
    }
    Ok(())
}

#[cfg(feature = "kafka")]
async fn kafka_scenario(format: &str) -> anyhow::Result<()> {
    use rdkafka::Message as _;
    use rdkafka::message::Headers as _;

    let url = Postgres::shared().await?.fresh_database().await?;
    let kafka = outbox_testkit::services::Kafka::shared().await?;
    let scope = unique();
    let work = Workdir::new()?;
    let sink = format!(
        "[sink]\nkind = \"kafka\"\nbrokers = \"{}\"\ndestination = \"{scope}.{{aggregate_type}}\"\n\
         create_topics = true\ndelivery_timeout = \"10s\"\nformat = \"{format}\"\n",
        kafka.brokers()
    );
    let written = relay(&work, &url, &sink, || None).await?;
    let topics = [format!("{scope}.Order"), format!("{scope}.Invoice")];
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = kafka
        .consume(&topics, written.len(), Duration::from_secs(15))
        .await?;

    let mut messages = Vec::new();
    let mut inbox = Vec::new();
    for r in &records {
        let headers: Vec<(String, String)> = r
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| {
                        let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                        (h.key.to_owned(), value.into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let body = r.payload().unwrap_or_default();
        let key = r.key().map(|k| String::from_utf8_lossy(k).into_owned());
        if format == "cloudevents-binary" {
            ensure!(
                headers.iter().any(|(n, _)| n == "ce_id")
                    && !headers.iter().any(|(n, _)| n == "id"),
                "binary mode: ce_ headers instead of the plain ones: {headers:?}"
            );
        } else {
            ensure!(
                headers
                    == [(
                        "content-type".to_owned(),
                        "application/cloudevents+json".to_owned()
                    )],
                "structured mode: only the content type: {headers:?}"
            );
        }
        messages.push(json!({
            "binding": "kafka",
            "headers": headers,
            "key": key,
            "body_b64": b64(body),
        }));
        let refs = headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        inbox.push(outbox_inbox::InboxMessage::from_headers(
            refs,
            &[],
            body.to_vec().into(),
        )?);
    }
    let parsed = sdk_decode(&messages).await?;
    check_parsed(&parsed, &written, default_source)?;
    for p in &parsed {
        // The SDK's Kafka binding reads the record key as the `partitionkey` extension.
        let w = written
            .iter()
            .find(|w| p["id"] == w.id.as_str())
            .context("id")?;
        ensure!(p["partitionkey"] == w.aggregate_id.as_str(), "{p}");
    }
    check_inbox(&inbox, &written, format == "cloudevents-structured")
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_binary_mode_is_read_by_the_cloudevents_sdk_and_the_inbox() -> anyhow::Result<()> {
    kafka_scenario("cloudevents-binary").await
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_structured_mode_is_read_by_the_cloudevents_sdk_and_the_inbox() -> anyhow::Result<()>
{
    kafka_scenario("cloudevents-structured").await
}

/// The Python webhook receiver (`ce_consumer.py serve`): parses each request with the SDK's
/// `from_http` and appends what it parsed to a file. Dies with the test (kill on drop).
#[cfg(feature = "http")]
struct PythonReceiver {
    _child: tokio::process::Child,
    port: u16,
    out: PathBuf,
}

#[cfg(feature = "http")]
impl PythonReceiver {
    async fn start(work: &Workdir) -> anyhow::Result<Self> {
        let out = work.path().join("received.jsonl");
        let mut child = tokio::process::Command::new("python3")
            .arg(script())
            .arg("serve")
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context(SDK_MISSING)?;
        let stdout = child.stdout.take().context("stdout")?;
        // Ready once it says where it listens (it has bound the port by then).
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .context("the Python receiver did not start")??
            .with_context(|| format!("the Python receiver exited ({SDK_MISSING})"))?;
        let port = line
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("unexpected first line `{line}`"))?;
        Ok(Self {
            _child: child,
            port,
            out,
        })
    }

    fn received(&self) -> anyhow::Result<Vec<Value>> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
            .collect()
    }
}

#[cfg(feature = "http")]
async fn webhook_scenario(format: &str) -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let receiver = PythonReceiver::start(&work).await?;
    let sink = format!(
        "[relay]\nmax_attempts = 1\n[sink]\nkind = \"http\"\n\
         url = \"http://127.0.0.1:{}/hooks/{{aggregate_type}}\"\n\
         secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\nformat = \"{format}\"\n\
         cloudevents_source = \"https://shop.example.com/{{aggregate_type}}\"\n",
        receiver.port
    );
    let written = relay(&work, &url, &sink, || {
        Some(format!(
            "the receiver got: {:?}\n",
            receiver.received().ok()
        ))
    })
    .await?;
    let parsed = receiver.received()?;
    ensure!(
        parsed.iter().all(|p| p.get("error").is_none()),
        "the SDK refused requests: {parsed:#?}"
    );
    check_parsed(&parsed, &written, |w| {
        format!("https://shop.example.com/{}", w.aggregate_type)
    })
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_binary_mode_is_read_by_from_http() -> anyhow::Result<()> {
    webhook_scenario("cloudevents-binary").await
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_structured_mode_is_read_by_from_http() -> anyhow::Result<()> {
    webhook_scenario("cloudevents-structured").await
}

/// The relay's signed CloudEvents webhooks into the inbox's `WebhookReceiver`: the signature
/// (over the body as sent) verifies, and the receiver reads the event back.
#[cfg(feature = "http")]
async fn inbox_webhook_scenario(format: &str) -> anyhow::Result<()> {
    use std::sync::{Arc, Mutex};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let received: Arc<Mutex<Vec<outbox_inbox::InboxMessage>>> = Arc::default();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = {
        let received = Arc::clone(&received);
        let receiver = outbox_inbox::http::WebhookReceiver::new(SECRET)?;
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let handler = move |m: outbox_inbox::InboxMessage| {
                let received = Arc::clone(&received);
                async move {
                    received
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(m);
                    Ok::<(), String>(())
                }
            };
            receiver.serve(listener, handler, shutdown).await
        })
    };
    let sink = format!(
        "[relay]\nmax_attempts = 1\n[sink]\nkind = \"http\"\n\
         url = \"http://127.0.0.1:{port}/hooks/{{aggregate_type}}\"\nsecret = \"{SECRET}\"\n\
         format = \"{format}\"\n"
    );
    let written = relay(&work, &url, &sink, || None).await?;
    shutdown.cancel();
    let report = server.await??;
    ensure!(
        report.rejected == 0 && report.acked == written.len() as u64,
        "{report:?}"
    );
    let read = received
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    check_inbox(&read, &written, format == "cloudevents-structured")
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_webhook_receiver_reads_signed_binary_mode_webhooks() -> anyhow::Result<()> {
    inbox_webhook_scenario("cloudevents-binary").await
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_webhook_receiver_reads_signed_structured_mode_webhooks() -> anyhow::Result<()> {
    inbox_webhook_scenario("cloudevents-structured").await
}

#[cfg(feature = "rabbitmq")]
async fn rabbitmq_scenario(format: &str) -> anyhow::Result<()> {
    use lapin::options::{
        BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{Connection, ConnectionProperties, ExchangeKind};

    let url = Postgres::shared().await?.fresh_database().await?;
    let broker = outbox_testkit::services::RabbitMq::shared().await?;
    let scope = unique();
    let (exchange, queue) = (format!("x.{scope}"), format!("q.{scope}"));
    let connection = Connection::connect(broker.url(), ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            format!("{scope}.#").into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    let work = Workdir::new()?;
    let sink = format!(
        "[sink]\nkind = \"rabbitmq\"\nurl = \"{}\"\nexchange = \"{exchange}\"\n\
         destination = \"{scope}.{{aggregate_type}}\"\nformat = \"{format}\"\n",
        broker.url()
    );
    let written = relay(&work, &url, &sink, || None).await?;

    let mut messages = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await?
    {
        let delivery = message.delivery;
        let properties = &delivery.properties;
        let mut headers = Vec::new();
        for (name, value) in properties.headers().iter().flat_map(|t| t.inner()) {
            let AMQPValue::LongString(s) = value else {
                bail!("header {name} is not a long string: {value:?}");
            };
            headers.push((name.to_string(), String::from_utf8(s.as_bytes().to_vec())?));
        }
        let id = properties.message_id().as_ref().map(ToString::to_string);
        ensure!(
            written.iter().any(|w| Some(&w.id) == id.as_ref()),
            "message_id is the event id in every format: {id:?}"
        );
        messages.push(json!({
            "binding": "rabbitmq",
            "headers": headers,
            "content_type": properties.content_type().as_ref().map(ToString::to_string),
            "body_b64": b64(&delivery.data),
        }));
    }
    connection.close(200, "done".into()).await?;
    let parsed = sdk_decode(&messages).await?;
    check_parsed(&parsed, &written, default_source)
}

#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_binary_mode_is_read_by_the_cloudevents_sdk() -> anyhow::Result<()> {
    rabbitmq_scenario("cloudevents-binary").await
}

#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_structured_mode_is_read_by_the_cloudevents_sdk() -> anyhow::Result<()> {
    rabbitmq_scenario("cloudevents-structured").await
}

#[cfg(feature = "nats")]
async fn nats_scenario(format: &str) -> anyhow::Result<Vec<support::Received>> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let nats = outbox_testkit::services::Nats::shared().await?;
    let scope = unique();
    let work = Workdir::new()?;
    let sink = format!(
        "[sink]\nkind = \"nats\"\nurl = \"{}\"\ndestination = \"{scope}.{{aggregate_type}}\"\n\
         stream = \"{scope}\"\nformat = \"{format}\"\n",
        nats.url()
    );
    let written = relay(&work, &url, &sink, || None).await?;
    let client = async_nats::connect(nats.url()).await?;
    let received = support::read_stream(&client, &scope).await?;
    let mut inbox = Vec::new();
    for r in &received {
        let header = |name: &str| r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        ensure!(
            header("Nats-Msg-Id").is_some_and(|id| written.iter().any(|w| &w.id == id)),
            "JetStream deduplicates by the event id in every format: {:?}",
            r.headers
        );
        let refs = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        inbox.push(outbox_inbox::InboxMessage::from_percent_encoded_headers(
            refs,
            &["Nats-Msg-Id"],
            r.payload.clone().into(),
        )?);
    }
    check_inbox(&inbox, &written, format == "cloudevents-structured")?;
    Ok(received)
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_binary_mode_carries_percent_encoded_ce_headers_the_inbox_reads() -> anyhow::Result<()>
{
    let received = nats_scenario("cloudevents-binary").await?;
    let subject = received
        .iter()
        .flat_map(|r| &r.headers)
        .find(|(n, v)| n == "ce-subject" && v.starts_with('Z'))
        .context("ce-subject")?;
    ensure!(subject.1 == "Z%C3%BCrich%201", "{subject:?}");
    ensure!(
        received
            .iter()
            .all(|r| r.headers.iter().any(|(n, _)| n == "ce-datacontenttype")),
        "the NATS binding carries datacontenttype as ce-datacontenttype"
    );
    Ok(())
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_structured_mode_is_an_envelope_the_inbox_reads() -> anyhow::Result<()> {
    let received = nats_scenario("cloudevents-structured").await?;
    for r in &received {
        let envelope: Value = serde_json::from_slice(&r.payload)?;
        ensure!(envelope["specversion"] == "1.0", "{envelope}");
        ensure!(
            r.headers
                .iter()
                .any(|(n, v)| n == "Content-Type" && v == "application/cloudevents+json"),
            "{:?}",
            r.headers
        );
    }
    Ok(())
}

#[tokio::test]
async fn an_unknown_format_is_a_clear_error_naming_the_key_and_the_values() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        "[source]\nkind = \"sqlite\"\nurl = \"sqlite://events.db\"\n\
         [sink]\nkind = \"stdout\"\nformat = \"cloudevents-json\"\n",
    )?;
    let config = config.to_str().context("utf-8 path")?;
    for command in ["check-config", "relay"] {
        let out = work.run(&[command, "--config", config]).await?;
        out.assert_clear_error("sink.format")?;
        ensure!(
            out.stderr
                .contains("plain, cloudevents-binary, cloudevents-structured"),
            "{command}: {}",
            out.stderr
        );
    }
    let config = work.write_config(
        "binary.toml",
        "[sink]\nkind = \"stdout\"\nformat = \"cloudevents-binary\"\n",
    )?;
    let out = work
        .run(&[
            "check-config",
            "--config",
            config.to_str().context("utf-8 path")?,
        ])
        .await?;
    out.assert_clear_error("sink.format: `cloudevents-binary`")?;
    Ok(())
}
