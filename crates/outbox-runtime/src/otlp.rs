//! `[tracing]`: the relay's publish spans, exported over OTLP/HTTP (protobuf).
//!
//! With an endpoint set (`[tracing] otlp_endpoint`, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! or `OTEL_EXPORTER_OTLP_ENDPOINT`), every publish attempt of every event is one span of kind
//! PRODUCER, a child of the producer's span named by the row's `traceparent` (a new trace
//! without one, or with a malformed one). The message then carries the relay span's
//! `traceparent`, so a consumer's span is the relay span's child; a malformed header travels
//! unchanged, and `tracestate` always does. `docs/observability.md`, "Traces".
//!
//! Delivery never waits for the export: finished spans go into a bounded queue that a task
//! empties in batches; a full queue, a failed export or spans still queued at shutdown are
//! dropped and counted in `outbox_trace_spans_dropped_total{reason}`. The SDK's own batch
//! processor drops the same way but does not say how many, hence this one.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    SdkTracer, SdkTracerProvider, SpanData, SpanExporter, SpanProcessor,
};
use outbox_core::metrics as m;
use outbox_core::trace::{
    AttemptOutcome, AttemptSpan, PublishTracer, TRACEPARENT, TRACESTATE, TraceParent, header,
};
use outbox_core::{Event, SinkErrorKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
pub use crate::config::TracingConfig;
use crate::registry::SinkConfig;

/// Spans per export request.
const BATCH: usize = 512;
/// Longest a finished span waits in the queue before its batch is sent.
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// Longest the relay waits at shutdown to send the spans still queued.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);
/// Distinct `(aggregate_type, event_type)` pairs whose span names are kept.
const NAME_CACHE: usize = 1024;

/// The running exporter: the tracer the relay calls, and the task that sends the spans.
pub struct Tracing {
    tracer: Arc<OtlpTracer>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").finish_non_exhaustive()
    }
}

/// The OTLP/HTTP (protobuf) exporter to `url`.
#[cfg(feature = "otlp")]
fn exporter(
    url: &str,
    config: &TracingConfig,
) -> Result<opentelemetry_otlp::SpanExporter, RuntimeError> {
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    // reqwest is built without a crypto provider of its own (no aws-lc in a lean build): an
    // https endpoint uses ring, the provider the rest of the process uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url.to_owned())
        .with_timeout(config.export_timeout)
        .with_headers(config.headers.clone().into_iter().collect())
        .build()
        .map_err(|e| {
            RuntimeError::Tracing(format!(
                "tracing: cannot export to {}: {e}",
                outbox_core::redact::redact_url(url)
            ))
        })
}

/// A build without the `otlp` feature has no exporter: an endpoint is refused, saying so.
#[cfg(not(feature = "otlp"))]
fn exporter(url: &str, _config: &TracingConfig) -> Result<NoExporter, RuntimeError> {
    Err(RuntimeError::Tracing(format!(
        "tracing: spans are to be exported to {} ([tracing] otlp_endpoint or \
         OTEL_EXPORTER_OTLP_*), but this build has no OTLP exporter; build with the `otlp` \
         feature (on by default)",
        outbox_core::redact::redact_url(url)
    )))
}

/// The exporter of a build without one: never constructed.
#[cfg(not(feature = "otlp"))]
#[derive(Debug)]
enum NoExporter {}

#[cfg(not(feature = "otlp"))]
impl SpanExporter for NoExporter {
    async fn export(&self, _batch: Vec<SpanData>) -> OTelSdkResult {
        match *self {}
    }

    fn set_resource(&mut self, _resource: &Resource) {
        match *self {}
    }
}

impl Tracing {
    /// Starts exporting when `config` (or the environment) names an endpoint; `Ok(None)`
    /// otherwise. Call inside the tokio runtime, after the metrics recorder is installed.
    /// `sink` names each span's destination.
    pub fn start(config: &TracingConfig, sink: &SinkConfig) -> Result<Option<Self>, RuntimeError> {
        let Some(url) = config.traces_url().map_err(RuntimeError::Tracing)? else {
            return Ok(None);
        };
        let mut exporter = exporter(&url, config)?;
        let mut resource = Resource::builder();
        match &config.service_name {
            Some(name) => resource = resource.with_service_name(name.clone()),
            None if std::env::var_os("OTEL_SERVICE_NAME").is_some() => {}
            None => resource = resource.with_service_name("outbox-relay"),
        }
        let resource = resource.build();
        exporter.set_resource(&resource);

        let dropped = Dropped::new();
        let (tx, rx) = mpsc::channel(config.queue_size.get());
        let stop = CancellationToken::new();
        let task = tokio::spawn(export(
            exporter,
            rx,
            dropped.clone(),
            config.export_timeout,
            stop.clone(),
        ));
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(BoundedQueue { tx, dropped })
            .build();
        let tracer = provider.tracer_with_scope(
            opentelemetry::InstrumentationScope::builder("outbox-relay")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        tracing::info!(
            endpoint = %outbox_core::redact::redact_url(&url),
            queue_size = config.queue_size.get(),
            "exporting a span per publish attempt over OTLP/HTTP"
        );
        Ok(Some(Self {
            tracer: Arc::new(OtlpTracer {
                tracer,
                _provider: provider,
                sink: sink.clone(),
                names: Mutex::new(HashMap::new()),
            }),
            stop,
            task,
        }))
    }

    /// What the relay calls for each publish attempt.
    pub fn tracer(&self) -> Arc<dyn PublishTracer> {
        self.tracer.clone()
    }

    /// Sends the spans still queued (at most `SHUTDOWN_FLUSH`), then stops. Call after the
    /// relay stopped.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let mut task = self.task;
        if tokio::time::timeout(SHUTDOWN_FLUSH + Duration::from_secs(1), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// The drop counters, by reason.
#[derive(Clone)]
struct Dropped {
    queue_full: metrics::Counter,
    export_failed: metrics::Counter,
    shutdown: metrics::Counter,
}

impl Dropped {
    fn new() -> Self {
        let counter = |reason: &'static str| {
            let c = metrics::counter!(m::TRACE_SPANS_DROPPED, "reason" => reason);
            // Shown at 0 from the start: a dashboard sees the series before the first drop.
            c.increment(0);
            c
        };
        Self {
            queue_full: counter("queue_full"),
            export_failed: counter("export_failed"),
            shutdown: counter("shutdown"),
        }
    }
}

/// The span processor: hands finished spans to the export task without ever waiting.
struct BoundedQueue {
    tx: mpsc::Sender<SpanData>,
    dropped: Dropped,
}

impl std::fmt::Debug for BoundedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedQueue")
            .field("capacity", &self.tx.max_capacity())
            .finish()
    }
}

impl SpanProcessor for BoundedQueue {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        match self.tx.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped.queue_full.increment(1),
            Err(mpsc::error::TrySendError::Closed(_)) => self.dropped.shutdown.increment(1),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task: batches of up to [`BATCH`] spans, sent when full or [`BATCH_DELAY`]
/// after their first span, one request at a time; at `stop`, what is queued is sent within
/// [`SHUTDOWN_FLUSH`] and the rest counted as dropped.
async fn export<E: SpanExporter + 'static>(
    exporter: E,
    mut rx: mpsc::Receiver<SpanData>,
    dropped: Dropped,
    timeout: Duration,
    stop: CancellationToken,
) {
    let mut failing = false;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => if n == 0 { break },
            () = stop.cancelled() => break,
        }
        let deadline = tokio::time::Instant::now() + BATCH_DELAY;
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            tokio::select! {
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
                () = tokio::time::sleep_until(deadline) => break,
                () = stop.cancelled() => break,
            }
        }
        // A hung export must not hold up shutdown: its spans count as dropped at shutdown.
        // (Biased: `send` is polled first and takes the batch at once.)
        let spans = batch.len() as u64;
        tokio::select! {
            biased;
            () = send(&exporter, &mut batch, timeout, &dropped, &mut failing) => {}
            () = stop.cancelled() => {
                dropped.shutdown.increment(spans);
                break;
            }
        }
        if stop.is_cancelled() {
            break;
        }
    }
    // Shutdown: what is queued now, within the flush budget.
    rx.close();
    let flush_until = tokio::time::Instant::now() + SHUTDOWN_FLUSH;
    loop {
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(span) => batch.push(span),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            break;
        }
        let left = flush_until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            dropped.shutdown.increment(batch.len() as u64);
            batch.clear();
            continue;
        }
        send(
            &exporter,
            &mut batch,
            timeout.min(left),
            &dropped,
            &mut failing,
        )
        .await;
    }
    let _ = exporter.shutdown();
}

async fn send<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    timeout: Duration,
    dropped: &Dropped,
    failing: &mut bool,
) {
    if batch.is_empty() {
        return;
    }
    let spans = batch.len() as u64;
    let result = tokio::time::timeout(timeout, exporter.export(std::mem::take(batch))).await;
    let error = match result {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "no answer within {timeout:?} (tracing.export_timeout)"
        )),
    };
    match error {
        None => {
            if std::mem::take(failing) {
                tracing::info!("OTLP export works again");
            }
        }
        Some(error) => {
            dropped.export_failed.increment(spans);
            if !std::mem::replace(failing, true) {
                tracing::warn!(
                    %error,
                    spans,
                    "OTLP export failed: publish spans are dropped until it works again (outbox_trace_spans_dropped_total); delivery goes on"
                );
            }
        }
    }
}

/// The relay's [`PublishTracer`]: one SDK span per publish attempt.
struct OtlpTracer {
    tracer: SdkTracer,
    /// Kept alive with the tracer (dropping the provider would shut its processor down).
    _provider: SdkTracerProvider,
    sink: SinkConfig,
    /// Span names and destinations by aggregate type, then event type (looked up by `&str`).
    names: Mutex<HashMap<String, HashMap<String, Names>>>,
}

/// What a span is called and where it publishes, for one `(aggregate_type, event_type)`.
#[derive(Clone)]
struct Names {
    /// `outbox publish <destination>`, with `{aggregate_id}` unrendered (span names must not
    /// grow with the aggregates).
    span: Cow<'static, str>,
    /// The destination, unless it depends on the aggregate id.
    destination: Option<opentelemetry::StringValue>,
    /// The aggregate and event types, shared by every span of the pair.
    aggregate_type: opentelemetry::StringValue,
    event_type: opentelemetry::StringValue,
}

impl OtlpTracer {
    fn names(&self, event: &Event) -> (Names, opentelemetry::StringValue) {
        let lock = || {
            self.names
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let cached = lock()
            .get(event.aggregate_type.as_str())
            .and_then(|by_type| by_type.get(event.event_type.as_str()))
            .cloned();
        let names = match cached {
            Some(names) => names,
            None => {
                let names = self.describe(event);
                let mut cache = lock();
                if cache.values().map(HashMap::len).sum::<usize>() < NAME_CACHE {
                    cache
                        .entry(event.aggregate_type.clone())
                        .or_default()
                        .insert(event.event_type.clone(), names.clone());
                }
                names
            }
        };
        let destination = names.destination.clone().unwrap_or_else(|| {
            outbox_core::redact::redact_url(&self.sink.describe_destination(event)).into()
        });
        (names, destination)
    }

    /// The sink's description of where `event` goes, rendered with the aggregate id left as
    /// its placeholder.
    fn describe(&self, event: &Event) -> Names {
        const PLACEHOLDER: &str = "{aggregate_id}";
        let probe = Event {
            id: event.id,
            position: event.position,
            aggregate_type: event.aggregate_type.clone(),
            aggregate_id: PLACEHOLDER.to_owned(),
            event_type: event.event_type.clone(),
            payload: Default::default(),
            headers: Vec::new(),
            created_at: event.created_at,
            attempts: event.attempts,
        };
        let template = outbox_core::redact::redact_url(&self.sink.describe_destination(&probe));
        let by_aggregate = template.contains(PLACEHOLDER);
        // Shared, so that each span's copy is a reference count, not an allocation.
        let shared = |s: &str| opentelemetry::StringValue::from(Arc::<str>::from(s));
        Names {
            span: Cow::Owned(format!("outbox publish {template}")),
            destination: (!by_aggregate).then(|| shared(&template)),
            aggregate_type: shared(&event.aggregate_type),
            event_type: shared(&event.event_type),
        }
    }
}

impl PublishTracer for OtlpTracer {
    fn start(&self, event: &mut Event, sink: &'static str) -> Box<dyn AttemptSpan> {
        // The producer's span, if the row names a valid one. A malformed `traceparent` is
        // no parent (the span starts a trace) and travels unchanged.
        let (parent, replace) = match header(&event.headers, TRACEPARENT) {
            None => (Context::new(), true),
            Some(value) => match TraceParent::parse(value) {
                Some(p) => (
                    Context::new().with_remote_span_context(
                        p.to_span_context(header(&event.headers, TRACESTATE)),
                    ),
                    true,
                ),
                None => (Context::new(), false),
            },
        };
        let (names, destination) = self.names(event);
        let id = event
            .id
            .hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .to_owned();
        let attributes = vec![
            KeyValue::new("messaging.system", sink),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.destination.name", destination),
            KeyValue::new("messaging.message.id", id),
            KeyValue::new("outbox.aggregate_type", names.aggregate_type),
            KeyValue::new("outbox.aggregate_id", event.aggregate_id.clone()),
            KeyValue::new("outbox.event_type", names.event_type),
            KeyValue::new("outbox.attempt", i64::from(event.attempts) + 1),
        ];
        let span = self
            .tracer
            .span_builder(names.span)
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        if replace && let Some(own) = TraceParent::of(span.span_context()) {
            outbox_core::trace::set_header(&mut event.headers, TRACEPARENT, own.to_string());
        }
        Box::new(OtlpSpan(span))
    }
}

/// One publish attempt's SDK span.
struct OtlpSpan(opentelemetry_sdk::trace::Span);

impl AttemptSpan for OtlpSpan {
    fn end(self: Box<Self>, outcome: AttemptOutcome<'_>) {
        let mut span = self.0;
        if !span.is_recording() {
            return;
        }
        span.set_attribute(KeyValue::new("outbox.outcome", outcome.as_str()));
        if let Some(error) = outcome.error() {
            let kind = match error.kind() {
                SinkErrorKind::Unavailable => "unavailable",
                SinkErrorKind::Transient => "transient",
                SinkErrorKind::Rejected => "rejected",
            };
            let text = match &outcome {
                AttemptOutcome::DeadLetter { reason, .. } => (*reason).to_owned(),
                _ => error.report(),
            };
            span.set_attribute(KeyValue::new("error.type", kind));
            span.set_attribute(KeyValue::new("outbox.error", text.clone()));
            span.set_status(Status::error(text));
        }
        span.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tracing::with_traces_path;

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(
            with_traces_path("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            with_traces_path("http://c:4318/otlp/"),
            "http://c:4318/otlp/v1/traces"
        );
        assert_eq!(
            with_traces_path("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }

    #[test]
    fn config_keys_are_checked_and_secrets_never_printed() {
        let c: TracingConfig = toml::from_str(
            "otlp_endpoint = \"https://user:Pw-Secret@collector:4318\"\nheaders = { x-api-key = \"Key-Secret\" }",
        )
        .expect("valid");
        c.validate().expect("valid");
        let debug = format!("{c:?}");
        let printed = toml::to_string(&c).expect("printable");
        for shown in [&debug, &printed] {
            assert!(
                !shown.contains("Pw-Secret") && !shown.contains("Key-Secret"),
                "{shown}"
            );
            assert!(shown.contains("collector:4318"), "{shown}");
        }
        assert!(toml::from_str::<TracingConfig>("endpoint = \"http://x\"").is_err());
        let bad = TracingConfig {
            otlp_endpoint: Some("collector:4318".into()),
            ..TracingConfig::default()
        };
        assert!(
            bad.validate()
                .expect_err("no scheme")
                .starts_with("tracing.otlp_endpoint:")
        );
    }
}
