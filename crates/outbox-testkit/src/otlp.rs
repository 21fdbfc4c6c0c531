//! [`OtlpReceiver`]: a real OTLP/HTTP trace receiver on 127.0.0.1, for tests of the relay's
//! publish spans and the inbox's consumer spans.
//!
//! It accepts `POST /v1/traces` with a protobuf `ExportTraceServiceRequest` (optionally
//! `Content-Encoding: gzip`), decodes it with the official `opentelemetry-proto` messages, and
//! keeps every span for assertions, flattened into [`ReceivedSpan`]. It answers `200` with an
//! empty `ExportTraceServiceResponse`, or the status set by [`OtlpReceiver::respond_with`].

use std::collections::BTreeMap;
use std::io::Read as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{span, status};
use prost::Message as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::lock;

/// One span as the receiver got it, ids as lower-case hex.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits; empty for a root span.
    pub parent_span_id: String,
    /// The W3C trace state the span carried (`vendor=value,...`).
    pub trace_state: String,
    /// The span name.
    pub name: String,
    /// `internal`, `server`, `client`, `producer`, `consumer` or `unspecified`.
    pub kind: &'static str,
    /// The resource's `service.name`.
    pub service: String,
    /// The instrumentation scope's name.
    pub scope: String,
    /// Attributes, values as text (integers in decimal, booleans `true` / `false`).
    pub attributes: BTreeMap<String, String>,
    /// `unset`, `ok` or `error`.
    pub status: &'static str,
    /// The status message (the error text of a failed span).
    pub status_message: String,
    /// Start and end, nanoseconds since the Unix epoch.
    pub start_unix_nano: u64,
    /// See `start_unix_nano`.
    pub end_unix_nano: u64,
}

impl ReceivedSpan {
    /// The value of attribute `key`.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// The `traceparent` header naming this span as a parent (sampled).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

struct Shared {
    spans: Mutex<Vec<ReceivedSpan>>,
    requests: Mutex<u64>,
    status: Mutex<u16>,
    /// Bumped after each request.
    changed: watch::Sender<u64>,
}

/// An OTLP/HTTP trace receiver (see the module documentation).
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use std::time::Duration;
/// use outbox_testkit::otlp::OtlpReceiver;
///
/// let collector = OtlpReceiver::start().await?;
/// // ... `[tracing] otlp_endpoint = collector.url()` ...
/// let spans = collector.wait_for(2, Duration::from_secs(10)).await?;
/// # Ok(()) }
/// ```
pub struct OtlpReceiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl std::fmt::Debug for OtlpReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpReceiver")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl OtlpReceiver {
    /// Starts a receiver on a free port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            spans: Mutex::new(Vec::new()),
            requests: Mutex::new(0),
            status: Mutex::new(200),
            changed,
        });
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(shared.clone());
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { until.cancelled().await })
                .await;
        });
        Ok(Self { addr, shared, stop })
    }

    /// `http://127.0.0.1:PORT`: the base endpoint (`[tracing] otlp_endpoint`,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`); spans go to `/v1/traces` below it.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers every later request with `status` (the spans of a non-2xx answer are not kept).
    pub fn respond_with(&self, status: u16) {
        *lock(&self.shared.status) = status;
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        lock(&self.shared.spans).clone()
    }

    /// Export requests received so far (whatever the answer).
    pub fn requests(&self) -> u64 {
        *lock(&self.shared.requests)
    }

    /// Waits until at least `n` spans arrived; returns them all.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> anyhow::Result<Vec<ReceivedSpan>> {
        self.wait_until(timeout, |spans| spans.len() >= n)
            .await
            .with_context(|| format!("waiting for {n} spans"))
    }

    /// Waits until `done(spans)` holds; returns the spans then. The error lists what arrived.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> anyhow::Result<Vec<ReceivedSpan>> {
        let mut changed = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return Ok(spans);
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                anyhow::bail!(
                    "the receiver got {} spans in {timeout:?}, not what was awaited: {:#?}",
                    spans.len(),
                    spans
                        .iter()
                        .map(|s| format!(
                            "{} {} {}<-{} {:?}",
                            s.name, s.trace_id, s.span_id, s.parent_span_id, s.attributes
                        ))
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Vec<u8>) {
    let status = *lock(&shared.status);
    let answer = |code: StatusCode, body: Vec<u8>| {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/x-protobuf"),
        );
        (code, h, body)
    };
    let decoded = decode(&headers, &body);
    *lock(&shared.requests) += 1;
    let result = match decoded {
        Err(e) => answer(StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
        Ok(_) if !(200..300).contains(&status) => answer(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Vec::new(),
        ),
        Ok(spans) => {
            lock(&shared.spans).extend(spans);
            answer(
                StatusCode::OK,
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
    };
    shared.changed.send_modify(|n| *n += 1);
    result
}

/// The spans of one request body (gzip or not).
fn decode(headers: &HeaderMap, body: &[u8]) -> anyhow::Result<Vec<ReceivedSpan>> {
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let mut plain = Vec::new();
    let bytes: &[u8] = if gzip {
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut plain)
            .context("gunzip")?;
        &plain
    } else {
        body
    };
    let request =
        ExportTraceServiceRequest::decode(bytes).context("not an ExportTraceServiceRequest")?;
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
            .map(|kv| text(kv.value.as_ref()))
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
            for s in scope_spans.spans {
                let status = s.status.unwrap_or_default();
                out.push(ReceivedSpan {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    trace_state: s.trace_state,
                    name: s.name,
                    kind: match span::SpanKind::try_from(s.kind) {
                        Ok(span::SpanKind::Internal) => "internal",
                        Ok(span::SpanKind::Server) => "server",
                        Ok(span::SpanKind::Client) => "client",
                        Ok(span::SpanKind::Producer) => "producer",
                        Ok(span::SpanKind::Consumer) => "consumer",
                        _ => "unspecified",
                    },
                    service: service.clone(),
                    scope: scope.clone(),
                    attributes: attributes(&s.attributes),
                    status: match status::StatusCode::try_from(status.code) {
                        Ok(status::StatusCode::Ok) => "ok",
                        Ok(status::StatusCode::Error) => "error",
                        _ => "unset",
                    },
                    status_message: status.message,
                    start_unix_nano: s.start_time_unix_nano,
                    end_unix_nano: s.end_time_unix_nano,
                });
            }
        }
    }
    Ok(out)
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BytesValue(b)) => hex(b),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

    fn request() -> ExportTraceServiceRequest {
        let string = |s: &str| AnyValue {
            value: Some(any_value::Value::StringValue(s.to_owned())),
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(string("svc")),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: vec![0xab; 16],
                        span_id: vec![0x01; 8],
                        name: "outbox publish x".into(),
                        kind: span::SpanKind::Producer as i32,
                        attributes: vec![KeyValue {
                            key: "outbox.attempt".into(),
                            value: Some(AnyValue {
                                value: Some(any_value::Value::IntValue(2)),
                            }),
                            ..Default::default()
                        }],
                        status: Some(Status {
                            message: "boom".into(),
                            code: status::StatusCode::Error as i32,
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[tokio::test]
    async fn received_spans_are_decoded_plain_and_gzipped() -> anyhow::Result<()> {
        use std::io::Write as _;

        let receiver = OtlpReceiver::start().await?;
        let client = reqwest::Client::new();
        let body = request().encode_to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&body)?;
        let zipped = gz.finish()?;
        let url = format!("{}/v1/traces", receiver.url());
        let plain = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await?;
        anyhow::ensure!(plain.status() == 200, "{plain:?}");
        let gzipped = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .header("content-encoding", "gzip")
            .body(zipped)
            .send()
            .await?;
        anyhow::ensure!(gzipped.status() == 200, "{gzipped:?}");
        let spans = receiver.wait_for(2, Duration::from_secs(5)).await?;
        let s = &spans[1];
        anyhow::ensure!(s.trace_id == "ab".repeat(16) && s.span_id == "01".repeat(8));
        anyhow::ensure!(s.parent_span_id.is_empty() && s.kind == "producer");
        anyhow::ensure!(s.service == "svc" && s.attribute("outbox.attempt") == Some("2"));
        anyhow::ensure!(s.status == "error" && s.status_message == "boom");
        let garbage = client.post(&url).body("not protobuf").send().await?;
        anyhow::ensure!(garbage.status() == 400);
        anyhow::ensure!(receiver.requests() == 3);
        Ok(())
    }
}
