//! Trace context end to end through the binary (`docs/observability.md`, "Traces"): SQLite
//! outbox, `outbox relay` with `[tracing]` exporting to the testkit's OTLP/HTTP receiver.
//!
//! - one trace from a producer span through the relay's publish span over NATS JetStream to the
//!   inbox's consumer span, with the right parents;
//! - a retried publish is two spans (attempt 1 `retry`, attempt 2 `delivered`), both children of
//!   the producer's span, each message carrying its own attempt's span as parent;
//! - a malformed `traceparent` travels unchanged and parents nothing; a row without one gets the
//!   relay span's;
//! - an OTLP endpoint that refuses connections, or accepts and never answers, changes nothing
//!   for delivery, and the dropped spans are counted.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_testkit::otlp::{OtlpReceiver, ReceivedSpan};
use outbox_testkit::services::HttpReceiver;
use support::{Workdir, terminate};

const WAIT: Duration = Duration::from_secs(30);

/// A producer's span, as another service would have written it into the row.
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

fn producer_traceparent() -> String {
    format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01")
}

/// Migrates the SQLite outbox of `config` and returns a pool on it.
async fn sqlite(work: &Workdir, config: &str) -> anyhow::Result<sqlx::SqlitePool> {
    let out = work.run(&["migrate", "--config", config]).await?;
    ensure!(out.code == Some(0), "migrate: {out:?}");
    Ok(outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(
        work.path().join("outbox.db"),
    ))
    .await?)
}

/// A port nothing listens on.
fn closed_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn scrape(addr: SocketAddr) -> String {
    let Ok(response) = reqwest_get(addr).await else {
        return String::new();
    };
    response
}

async fn reqwest_get(addr: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    Ok(body)
}

/// The value of the counter sample `series` (full name with labels) in a scrape.
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

fn span_for<'a>(
    spans: &'a [ReceivedSpan],
    event_id: &str,
    attempt: u32,
) -> Option<&'a ReceivedSpan> {
    spans.iter().find(|s| {
        s.attribute("messaging.message.id") == Some(event_id)
            && s.attribute("outbox.attempt") == Some(attempt.to_string().as_str())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_producer_span_through_the_relay_to_the_consumer_span()
-> anyhow::Result<()> {
    use opentelemetry::trace::{SpanKind, TraceContextExt as _, Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use outbox_inbox::nats::JetStreamConsumer;
    use outbox_testkit::services::Nats;

    // The test's own spans (the producer's and the inbox's consumer spans) are kept in
    // memory; the relay's arrive at the OTLP receiver.
    let memory = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(memory.clone())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let collector = OtlpReceiver::start().await?;
    let nats = Nats::shared().await?;
    let scope = format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    let stream = scope.to_uppercase();
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "sqlite"
path = "outbox.db"
[sink]
kind = "nats"
url = "{nats}"
destination = "{scope}.event.{{aggregate_type}}"
stream = "{stream}"
stream_subjects = ["{scope}.event.>"]
[tracing]
otlp_endpoint = "{otlp}"
"#,
            nats = nats.url(),
            otlp = collector.url()
        ),
    )?;
    let cfg = config.to_str().context("utf-8 path")?;
    let pool = sqlite(&work, cfg).await?;

    // The producer: its span is current while it builds the event.
    let shop = provider.tracer("shop");
    let event = {
        let cx = opentelemetry::Context::current_with_span(shop.start("place order"));
        let _entered = cx.clone().attach();
        let event =
            NewEvent::new("Order", "o_1", "order.placed", b"{}".to_vec()).with_trace_context();
        cx.span().end();
        event
    };
    let id = outbox_sqlite::enqueue(&pool, &event).await?.to_string();

    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let relayed = collector
        .wait_until(WAIT, |s| span_for(s, &id, 1).is_some())
        .await
        .with_context(|| work.read_log("relay.log"))?;
    let relay_span = span_for(&relayed, &id, 1).context("relay span")?.clone();

    // The consumer: the inbox's JetStream loop, whose handler notes what it saw.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let noted = seen.clone();
    let handler = move |m: outbox_inbox::InboxMessage| {
        let current = opentelemetry::Context::current()
            .span()
            .span_context()
            .span_id();
        noted.lock().expect("lock").push((m, current));
        async { Ok::<(), String>(()) }
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let consumer = JetStreamConsumer::new(nats.url(), stream.clone(), "traced");
    let running = tokio::spawn({
        let stop = stop.clone();
        async move { consumer.run(handler, stop).await }
    });
    outbox_testkit::wait::eventually(WAIT, || async { !seen.lock().expect("lock").is_empty() })
        .await
        .context("the consumer got nothing")?;
    stop.cancel();
    running.await??;
    ensure!(terminate(&mut relay, WAIT).await? == Some(0));
    provider.force_flush()?;

    let spans = memory.get_finished_spans()?;
    let producer = spans
        .iter()
        .find(|s| s.name == "place order")
        .context("producer span")?;
    let consumer = spans
        .iter()
        .find(|s| s.span_kind == SpanKind::Consumer)
        .with_context(|| format!("no consumer span: {spans:#?}"))?;
    let trace = producer.span_context.trace_id().to_string();
    // producer -> relay -> consumer, one trace.
    ensure!(
        relay_span.trace_id == trace,
        "{relay_span:#?} vs {producer:#?}"
    );
    ensure!(
        relay_span.parent_span_id == producer.span_context.span_id().to_string(),
        "{relay_span:#?}"
    );
    ensure!(relay_span.kind == "producer" && relay_span.service == "outbox-relay");
    ensure!(
        relay_span.name == format!("outbox publish NATS subject {scope}.event.Order"),
        "{relay_span:#?}"
    );
    ensure!(relay_span.attribute("outbox.outcome") == Some("delivered"));
    ensure!(
        consumer.span_context.trace_id().to_string() == trace,
        "{consumer:#?}"
    );
    ensure!(
        consumer.parent_span_id.to_string() == relay_span.span_id,
        "{consumer:#?} vs {relay_span:#?}"
    );
    ensure!(consumer.name == "outbox process order.placed");
    // The message named the relay span; the handler ran inside the consumer span.
    let seen = seen.lock().expect("lock");
    let (message, current) = &seen[0];
    ensure!(message.id.to_string() == id);
    ensure!(
        outbox_core::trace::header(&message.headers, "traceparent")
            == Some(relay_span.traceparent().as_str()),
        "{message:#?}"
    );
    ensure!(*current == consumer.span_context.span_id());

    // The trace as text (docs/observability.md shows one; `--no-capture` prints it).
    let millis = |start: std::time::SystemTime, end: std::time::SystemTime| {
        end.duration_since(start).unwrap_or_default().as_secs_f64() * 1e3
    };
    eprintln!(
        "trace {trace}\n└─ {} [{}] {:.2} ms\n   └─ {} [{}, {}] {:.2} ms {:?}\n      └─ {} [{:?}] {:.2} ms",
        producer.name,
        producer.span_context.span_id(),
        millis(producer.start_time, producer.end_time),
        relay_span.name,
        relay_span.span_id,
        relay_span.service,
        (relay_span.end_unix_nano - relay_span.start_unix_nano) as f64 / 1e6,
        relay_span.attributes,
        consumer.name,
        consumer.span_context.span_id(),
        millis(consumer.start_time, consumer.end_time),
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_a_second_attempt_span_and_each_message_names_its_own_span() -> anyhow::Result<()>
{
    let collector = OtlpReceiver::start().await?;
    let hooks = HttpReceiver::start().await?;
    // The first delivery attempt gets a 503 (rules see every request: the healthcheck's too).
    let failed_once = std::sync::atomic::AtomicBool::new(false);
    hooks.respond_when(move |r| {
        (r.method == "POST" && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst))
            .then_some(503)
    });
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "sqlite"
path = "outbox.db"
[relay]
backoff = {{ initial = "100ms", max = "200ms", jitter = 0.0 }}
[sink]
kind = "http"
url = "{hook}"
[tracing]
otlp_endpoint = "{otlp}"
service_name = "relay-under-test"
"#,
            hook = hooks.url_for("/in/{aggregate_type}"),
            otlp = collector.url()
        ),
    )?;
    let cfg = config.to_str().context("utf-8 path")?;
    let pool = sqlite(&work, cfg).await?;
    let event = NewEvent::new("Order", "o_1", "order.placed", b"{}".to_vec())
        .with_header("traceparent", producer_traceparent())
        .with_header("tracestate", "congo=t61rcWkgMzE");
    let id = outbox_sqlite::enqueue(&pool, &event).await?.to_string();

    let mut relay = work.spawn_relay(&config, "relay.log")?;
    hooks.wait_for_accepted(1, WAIT).await?;
    let spans = collector
        .wait_until(WAIT, |spans| span_for(spans, &id, 2).is_some())
        .await
        .with_context(|| work.read_log("relay.log"))?;
    ensure!(
        terminate(&mut relay, WAIT).await? == Some(0),
        "relay exit: {}",
        work.read_log("relay.log")
    );

    let first = span_for(&spans, &id, 1).context("no span for attempt 1")?;
    let second = span_for(&spans, &id, 2).context("no span for attempt 2")?;
    for (span, outcome) in [(first, "retry"), (second, "delivered")] {
        ensure!(span.trace_id == PRODUCER_TRACE, "{span:#?}");
        ensure!(span.parent_span_id == PRODUCER_SPAN, "{span:#?}");
        ensure!(span.trace_state == "congo=t61rcWkgMzE", "{span:#?}");
        ensure!(span.kind == "producer" && span.service == "relay-under-test");
        let name = format!("outbox publish HTTP POST {}", hooks.url_for("/in/Order"));
        ensure!(span.name == name, "{span:#?}");
        ensure!(
            span.attribute("outbox.outcome") == Some(outcome),
            "{span:#?}"
        );
        ensure!(span.attribute("messaging.system") == Some("http"));
        ensure!(span.attribute("outbox.aggregate_type") == Some("Order"));
        ensure!(span.attribute("outbox.aggregate_id") == Some("o_1"));
        ensure!(span.attribute("outbox.event_type") == Some("order.placed"));
        ensure!(
            span.attribute("messaging.destination.name")
                == Some(format!("HTTP POST {}", hooks.url_for("/in/Order")).as_str()),
            "{span:#?}"
        );
    }
    ensure!(first.span_id != second.span_id);
    ensure!(
        first.status == "error" && first.status_message.contains("503"),
        "{first:#?}"
    );
    ensure!(
        first.attribute("error.type") == Some("transient"),
        "{first:#?}"
    );
    ensure!(
        first
            .attribute("outbox.error")
            .is_some_and(|e| e.contains("503"))
    );
    ensure!(second.status == "unset" && second.attribute("outbox.error").is_none());

    // Each attempt's message names that attempt's span; tracestate travels unchanged.
    let all: Vec<_> = hooks
        .received()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    ensure!(all.len() == 2, "{all:#?}");
    for (request, span) in all.iter().zip([first, second]) {
        ensure!(
            request.header("outbox-traceparent") == Some(span.traceparent().as_str()),
            "{request:#?} vs {span:#?}"
        );
        ensure!(request.header("outbox-tracestate") == Some("congo=t61rcWkgMzE"));
    }
    ensure!(
        all.iter()
            .all(|r| r.header("outbox-id") == Some(id.as_str()))
    );
    // The row keeps the producer's header: a later attempt is again the producer's child.
    let stored: String = sqlx::query_scalar("SELECT headers FROM outbox")
        .fetch_one(&pool)
        .await?;
    ensure!(stored.contains(&producer_traceparent()), "{stored}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_travels_unchanged_and_parents_nothing() -> anyhow::Result<()> {
    let collector = OtlpReceiver::start().await?;
    let hooks = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "sqlite"
path = "outbox.db"
[sink]
kind = "http"
url = "{hook}"
[tracing]
otlp_endpoint = "{otlp}"
"#,
            hook = hooks.url_for("/in"),
            otlp = collector.url()
        ),
    )?;
    let cfg = config.to_str().context("utf-8 path")?;
    let pool = sqlite(&work, cfg).await?;
    const MALFORMED: &str = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
    let bad = NewEvent::new("Order", "o_bad", "order.placed", b"{}".to_vec())
        .with_header("traceparent", MALFORMED);
    let bad = outbox_sqlite::enqueue(&pool, &bad).await?.to_string();
    let none = NewEvent::new("Order", "o_none", "order.placed", b"{}".to_vec());
    let none = outbox_sqlite::enqueue(&pool, &none).await?.to_string();

    let mut relay = work.spawn_relay(&config, "relay.log")?;
    hooks.wait_for_accepted(2, WAIT).await?;
    let spans = collector
        .wait_until(WAIT, |s| {
            span_for(s, &bad, 1).is_some() && span_for(s, &none, 1).is_some()
        })
        .await?;
    ensure!(terminate(&mut relay, WAIT).await? == Some(0));

    let received = hooks.received();
    let message = |id: &str| {
        received
            .iter()
            .find(|r| r.header("outbox-id") == Some(id))
            .with_context(|| format!("no message for {id}"))
    };
    // Malformed: the header is passed on as it was, and the span starts a trace of its own.
    let bad_span = span_for(&spans, &bad, 1).context("span")?;
    ensure!(message(&bad)?.header("outbox-traceparent") == Some(MALFORMED));
    ensure!(bad_span.parent_span_id.is_empty(), "{bad_span:#?}");
    ensure!(bad_span.trace_id != PRODUCER_TRACE.to_ascii_lowercase());
    ensure!(bad_span.attribute("outbox.outcome") == Some("delivered"));
    // None: the relay's span is the root, and the message names it for the consumers.
    let root = span_for(&spans, &none, 1).context("span")?;
    ensure!(root.parent_span_id.is_empty(), "{root:#?}");
    ensure!(
        message(&none)?.header("outbox-traceparent") == Some(root.traceparent().as_str()),
        "{root:#?}"
    );
    ensure!(root.trace_id != bad_span.trace_id);
    Ok(())
}

/// Runs a relay exporting to `otlp`, writes `first` events, waits for them, waits for `gate`,
/// writes `second` more; checks that every event is delivered promptly and that the relay
/// still drains on SIGTERM; returns its last `/metrics` and its log.
async fn deliver_despite(
    otlp: &str,
    extra: &str,
    first: usize,
    gate: impl std::future::Future<Output = ()>,
    second: usize,
    counted: impl Fn(&str) -> bool,
) -> anyhow::Result<(String, String)> {
    let hooks = HttpReceiver::start().await?;
    let metrics: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "sqlite"
path = "outbox.db"
[relay]
batch_size = 10
[sink]
kind = "http"
url = "{hook}"
[metrics]
listen = "{metrics}"
[tracing]
otlp_endpoint = "{otlp}"
{extra}
"#,
            hook = hooks.url_for("/in"),
        ),
    )?;
    let cfg = config.to_str().context("utf-8 path")?;
    let pool = sqlite(&work, cfg).await?;
    let events = |from: usize, n: usize| -> Vec<NewEvent> {
        (from..from + n)
            .map(|i| {
                NewEvent::new("Order", format!("o_{i}"), "order.placed", b"{}".to_vec())
                    .with_header("traceparent", producer_traceparent())
            })
            .collect()
    };
    let n = first + second;
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let started = Instant::now();
    outbox_sqlite::enqueue_batch(&pool, &events(0, first)).await?;
    hooks
        .wait_for_accepted(first, WAIT)
        .await
        .with_context(|| work.read_log("relay.log"))?;
    gate.await;
    outbox_sqlite::enqueue_batch(&pool, &events(first, second)).await?;
    hooks
        .wait_for_accepted(n, WAIT)
        .await
        .with_context(|| work.read_log("relay.log"))?;
    let delivered_in = started.elapsed();
    let last = std::sync::Mutex::new(String::new());
    let scraped = outbox_testkit::wait::eventually(WAIT, || async {
        let body = scrape(metrics).await;
        let done = sample(&body, "outbox_events_published_total{sink=\"http\"}")
            .is_some_and(|v| v >= n as f64)
            && counted(&body);
        *last.lock().expect("lock") = body;
        done
    })
    .await;
    let last = last.into_inner().expect("lock");
    scraped.with_context(|| format!("{last}\n{}", work.read_log("relay.log")))?;
    let stop = Instant::now();
    ensure!(
        terminate(&mut relay, WAIT).await? == Some(0),
        "{}",
        work.read_log("relay.log")
    );
    // The flush at shutdown is bounded (5 s), whatever the endpoint does.
    ensure!(
        stop.elapsed() < Duration::from_secs(12),
        "SIGTERM took {:?}",
        stop.elapsed()
    );
    ensure!(
        delivered_in < Duration::from_secs(20),
        "delivery took {delivered_in:?}"
    );
    Ok((last, work.read_log("relay.log")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_endpoint_refusing_connections_never_holds_delivery_and_drops_are_counted()
-> anyhow::Result<()> {
    let otlp = format!("http://127.0.0.1:{}", closed_port()?);
    const FAILED: &str = "outbox_trace_spans_dropped_total{reason=\"export_failed\"}";
    let (last, log) = deliver_despite(
        &otlp,
        "export_timeout = \"2s\"",
        100,
        async {},
        100,
        |scrape| sample(scrape, FAILED).is_some_and(|v| v > 0.0),
    )
    .await?;
    ensure!(sample(&last, FAILED).is_some_and(|v| v > 0.0), "{last}");
    ensure!(log.contains("OTLP export failed"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otlp_endpoint_that_never_answers_fills_the_queue_and_spans_are_dropped()
-> anyhow::Result<()> {
    const FULL: &str = "outbox_trace_spans_dropped_total{reason=\"queue_full\"}";
    // Accepts connections and reads requests, never answers; says when the first arrived.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (arrived, mut first_request) = tokio::sync::watch::channel(false);
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            use tokio::io::AsyncReadExt as _;
            let mut buf = [0u8; 1024];
            if socket.read(&mut buf).await.is_ok_and(|n| n > 0) {
                arrived.send_replace(true);
            }
            held.push(socket);
        }
    });
    // The first export hangs (answer wanted within 60 s); the second wave of events finds the
    // 8-span queue full.
    let gate = async move {
        let _ = first_request.wait_for(|a| *a).await;
    };
    let last = deliver_despite(
        &format!("http://{addr}"),
        "queue_size = 8\nexport_timeout = \"60s\"",
        20,
        gate,
        200,
        |scrape| sample(scrape, FULL).is_some_and(|v| v >= 150.0),
    )
    .await;
    silent.abort();
    let (last, _) = last?;
    let full = sample(&last, FULL);
    ensure!(full.is_some_and(|v| v >= 150.0), "{last}");
    Ok(())
}
