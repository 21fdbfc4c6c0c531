//! Trace context on the consumer side (feature `otel`; `docs/observability.md`, "Traces").
//!
//! Every consumer loop (and the webhook receiver) calls its handler through [`call`]: with the
//! `otel` feature, each handler attempt runs in a span of kind CONSUMER, a child of the span the
//! message's `traceparent` names (the relay's publish span when the relay exports traces, else
//! the producer's), created with the application's global tracer provider
//! (`opentelemetry::global`). The handler runs inside that span's context, so the spans it
//! starts itself (its database transaction, its calls) are the consumer span's children. A
//! message without a valid `traceparent` gets a span that starts a trace. Without the feature,
//! [`call`] is the handler call and nothing else.

use crate::InboxMessage;
use crate::lane::MessageHandler;

/// Calls `handler` with `message` (without the `otel` feature: just that).
#[cfg(not(feature = "otel"))]
pub(crate) fn call<H: MessageHandler>(handler: &H, message: InboxMessage) -> H::Future {
    handler.call(message)
}

/// Calls `handler` with `message` inside a CONSUMER span, ended with the handler's result.
#[cfg(feature = "otel")]
pub(crate) fn call<H: MessageHandler>(
    handler: &H,
    message: InboxMessage,
) -> impl Future<Output = Result<(), H::Error>> + Send + 'static {
    use opentelemetry::trace::{FutureExt as _, Status, TraceContextExt as _};

    let cx = consumer_span(&message);
    let call = {
        let _entered = cx.clone().attach();
        handler.call(message)
    };
    async move {
        let result = call.with_context(cx.clone()).await;
        let span = cx.span();
        if let Err(e) = &result {
            let text = e.to_string();
            span.set_attribute(opentelemetry::KeyValue::new("outbox.error", text.clone()));
            span.set_status(Status::error(text));
        }
        span.end();
        result
    }
}

/// A context holding a new CONSUMER span for `message`, child of its trace context.
#[cfg(feature = "otel")]
fn consumer_span(message: &InboxMessage) -> opentelemetry::Context {
    use opentelemetry::KeyValue;
    use opentelemetry::trace::{SpanKind, TraceContextExt as _, Tracer as _};

    let tracer = opentelemetry::global::tracer_with_scope(
        opentelemetry::InstrumentationScope::builder("outbox-inbox")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    );
    let parent = message.trace_context();
    let mut attributes = vec![
        KeyValue::new("messaging.operation.type", "process"),
        KeyValue::new("messaging.message.id", message.id.to_string()),
        KeyValue::new("outbox.aggregate_type", message.aggregate_type.clone()),
        KeyValue::new("outbox.aggregate_id", message.aggregate_id.clone()),
        KeyValue::new("outbox.event_type", message.event_type.clone()),
    ];
    if let Some(seq) = message.aggregate_seq {
        attributes.push(KeyValue::new(
            "outbox.aggregate_seq",
            i64::try_from(seq).unwrap_or(i64::MAX),
        ));
    }
    let span = tracer
        .span_builder(format!("outbox process {}", message.event_type))
        .with_kind(SpanKind::Consumer)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    parent.with_span(span)
}

#[cfg(feature = "otel")]
impl InboxMessage {
    /// The trace context the message's `traceparent` / `tracestate` headers name, as the
    /// parent for a span of the consumer's own (an empty context when there is none or it is
    /// malformed). The consumer loops already run the handler in a CONSUMER span that is its
    /// child; this is for consumers that read the broker themselves. Feature `otel`.
    pub fn trace_context(&self) -> opentelemetry::Context {
        outbox_core::trace::remote_context(&self.headers).unwrap_or_default()
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use opentelemetry::trace::{SpanKind, TraceContextExt as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn message(headers: Vec<(String, String)>) -> InboxMessage {
        InboxMessage {
            id: uuid::Uuid::from_u128(7),
            event_type: "order.placed".into(),
            aggregate_type: "Order".into(),
            aggregate_id: "o_1".into(),
            aggregate_seq: Some(3),
            headers,
            payload: bytes::Bytes::new(),
        }
    }

    /// One test owns the global tracer provider of this test binary.
    #[tokio::test]
    async fn the_handler_runs_in_a_consumer_span_child_of_the_message() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        opentelemetry::global::set_tracer_provider(provider.clone());

        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let inside = seen.clone();
        let handler = move |m: InboxMessage| {
            // The handler's own context is the consumer span's.
            let cx = opentelemetry::Context::current();
            inside
                .lock()
                .expect("lock")
                .push(cx.span().span_context().span_id());
            async move {
                if m.aggregate_id == "fails" {
                    Err("no stock")
                } else {
                    Ok(())
                }
            }
        };
        let traced = message(vec![("traceparent".into(), PARENT.into())]);
        call(&handler, traced).await.expect("ok");
        let mut failing = message(vec![("traceparent".into(), "00-bad".into())]);
        failing.aggregate_id = "fails".into();
        assert!(call(&handler, failing).await.is_err());
        provider.force_flush().expect("flush");

        let spans = exporter.get_finished_spans().expect("spans");
        assert_eq!(spans.len(), 2, "{spans:#?}");
        let ok = &spans[0];
        assert_eq!(ok.span_kind, SpanKind::Consumer);
        assert_eq!(ok.name, "outbox process order.placed");
        assert_eq!(
            ok.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(ok.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert_eq!(seen.lock().expect("lock")[0], ok.span_context.span_id());
        // A malformed traceparent parents nothing; the failure is the span's status.
        let failed = &spans[1];
        assert_eq!(failed.parent_span_id, opentelemetry::trace::SpanId::INVALID);
        assert_eq!(
            failed.status,
            opentelemetry::trace::Status::error("no stock")
        );
    }
}
