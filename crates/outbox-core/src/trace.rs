//! Trace context: the W3C `traceparent` / `tracestate` headers an event carries from its
//! producer to its consumers, and the hook through which the relay reports each publish attempt
//! (a span per attempt when the runtime exports traces; `docs/observability.md`, "Traces").
//!
//! The headers are ordinary row headers: every sink sends them like any other, so a producer in
//! any language only sets them. With the `otel` feature, `NewEvent::with_trace_context` fills
//! them from the current OpenTelemetry context, and [`remote_context`] reads them back.
//!
//! The relay calls a [`PublishTracer`] only when one is set ([`crate::Relay::with_tracer`]):
//! without one there is no span, no header parsing, nothing per event.

use crate::{Event, SinkError};

/// The W3C Trace Context header naming the trace and the parent span:
/// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C Trace Context header with vendor-specific trace state, sent beside `traceparent`.
pub const TRACESTATE: &str = "tracestate";

/// The value of header `name` among `headers` (names compared ASCII case-insensitively, as in
/// HTTP), first match.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Sets header `name` in `headers` to `value`: replaces the value of the first header named
/// so (any case, the name kept as it is) and appends one otherwise.
pub fn set_header(headers: &mut Vec<(String, String)>, name: &str, value: String) {
    match headers
        .iter_mut()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
    {
        Some((_, v)) => *v = value,
        None => headers.push((name.to_owned(), value)),
    }
}

/// A parsed `traceparent` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (never all zeros).
    pub trace_id: [u8; 16],
    /// The parent span id (never all zeros).
    pub span_id: [u8; 8],
    /// The trace flags; bit 0 is `sampled`.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value per W3C Trace Context level 1: version `00` with
    /// exactly four fields, or a later version (not `ff`) whose first four fields have the
    /// version-00 shape; lower-case hex; neither id all zeros. `None` for anything else: such
    /// a header is passed on unchanged and never used as a parent.
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim().as_bytes();
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex_byte(&v[0..2])?;
        if version == 0xff || (version == 0 && v.len() != 55) || (v.len() > 55 && v[55] != b'-') {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, b) in trace_id.iter_mut().enumerate() {
            *b = hex_byte(&v[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, b) in span_id.iter_mut().enumerate() {
            *b = hex_byte(&v[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&v[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// True when the `sampled` flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl std::fmt::Display for TraceParent {
    /// The version-00 header value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Written into one buffer: the relay formats one per published event.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        let bytes = self
            .trace_id
            .iter()
            .chain(&self.span_id)
            .chain([&self.flags]);
        let at = (3..35).step_by(2).chain((36..52).step_by(2)).chain([53]);
        for (b, i) in bytes.zip(at) {
            out[i] = HEX[usize::from(b >> 4)];
            out[i + 1] = HEX[usize::from(b & 0xf)];
        }
        f.write_str(std::str::from_utf8(&out).map_err(|_| std::fmt::Error)?)
    }
}

/// Two lower-case hex digits.
fn hex_byte(pair: &[u8]) -> Option<u8> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(digit(pair[0])? << 4 | digit(pair[1])?)
}

/// What became of one publish attempt, as the relay decided it.
#[derive(Debug, Clone, Copy)]
pub enum AttemptOutcome<'a> {
    /// The broker acknowledged the event.
    Delivered,
    /// The broker refused it for now; it is retried after a backoff.
    Retry {
        /// Why the publish failed.
        error: &'a SinkError,
    },
    /// It is dead-lettered.
    DeadLetter {
        /// Why the publish failed.
        error: &'a SinkError,
        /// The reason recorded with the dead letter.
        reason: &'a str,
    },
    /// The broker could not be reached: the event goes back untouched, no attempt counted.
    Released {
        /// What made the broker count as unavailable.
        error: &'a SinkError,
    },
}

impl AttemptOutcome<'_> {
    /// `delivered`, `retry`, `dead-letter` or `released`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retry { .. } => "retry",
            Self::DeadLetter { .. } => "dead-letter",
            Self::Released { .. } => "released",
        }
    }

    /// The failure, unless delivered.
    pub fn error(&self) -> Option<&SinkError> {
        match self {
            Self::Delivered => None,
            Self::Retry { error } | Self::DeadLetter { error, .. } | Self::Released { error } => {
                Some(error)
            }
        }
    }
}

/// Records publish attempts (the runtime's OTLP exporter implements it). The relay calls
/// [`start`](Self::start) for each event right before the publish call of its wave, and ends
/// the returned span once the event's outcome is decided, before the batch is settled.
pub trait PublishTracer: Send + Sync + 'static {
    /// Starts the span of `event`'s publish attempt to the sink named `sink`. May rewrite the
    /// event's trace headers before it is published (the relay's own span as the consumers'
    /// parent); the row itself is never changed.
    fn start(&self, event: &mut Event, sink: &'static str) -> Box<dyn AttemptSpan>;
}

/// One publish attempt's span, started by [`PublishTracer::start`].
pub trait AttemptSpan: Send {
    /// Records the outcome and ends the span.
    fn end(self: Box<Self>, outcome: AttemptOutcome<'_>);
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::Context;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };

    use super::{TRACEPARENT, TRACESTATE, TraceParent, header, set_header};
    use crate::NewEvent;

    impl TraceParent {
        /// The span context this header names, as a remote parent, with `tracestate` (an
        /// invalid one is dropped, as the W3C propagator does).
        pub fn to_span_context(&self, tracestate: Option<&str>) -> SpanContext {
            let state = tracestate
                .and_then(|s| s.parse::<TraceState>().ok())
                .unwrap_or_default();
            SpanContext::new(
                TraceId::from_bytes(self.trace_id),
                SpanId::from_bytes(self.span_id),
                TraceFlags::new(self.flags) & TraceFlags::SAMPLED,
                true,
                state,
            )
        }

        /// The header of a valid span context, `None` for an invalid one.
        pub fn of(span: &SpanContext) -> Option<Self> {
            span.is_valid().then(|| Self {
                trace_id: span.trace_id().to_bytes(),
                span_id: span.span_id().to_bytes(),
                flags: (span.trace_flags() & TraceFlags::SAMPLED).to_u8(),
            })
        }
    }

    /// The remote parent named by the `traceparent` (and `tracestate`) among `headers`, as a
    /// context to start a child span in; `None` when there is no `traceparent` or it is
    /// malformed.
    pub fn remote_context(headers: &[(String, String)]) -> Option<Context> {
        let parent = TraceParent::parse(header(headers, TRACEPARENT)?)?;
        let span = parent.to_span_context(header(headers, TRACESTATE));
        Some(Context::new().with_remote_span_context(span))
    }

    /// Sets `traceparent` (and `tracestate`, when the span has one) in `headers` to `span`,
    /// replacing the values of headers already named so (any case) and appending otherwise.
    /// Nothing changes for an invalid span context.
    pub fn inject(span: &SpanContext, headers: &mut Vec<(String, String)>) {
        let Some(parent) = TraceParent::of(span) else {
            return;
        };
        set_header(headers, TRACEPARENT, parent.to_string());
        let state = span.trace_state().header();
        if state.is_empty() {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(TRACESTATE));
        } else {
            set_header(headers, TRACESTATE, state);
        }
    }

    impl NewEvent {
        /// Writes the current OpenTelemetry context ([`Context::current`]) into the event's
        /// `traceparent` / `tracestate` headers (W3C Trace Context, whatever propagator the
        /// application installed: it is the message contract), replacing earlier ones. Without
        /// an active span the event is returned unchanged. Feature `otel`.
        ///
        /// An application that traces with the `tracing` crate and `tracing-opentelemetry`
        /// passes that span's context instead:
        /// `event.with_trace_context_from(&tracing::Span::current().context())`.
        pub fn with_trace_context(self) -> Self {
            self.with_trace_context_from(&Context::current())
        }

        /// As [`with_trace_context`](Self::with_trace_context), from the span of `cx`.
        pub fn with_trace_context_from(mut self, cx: &Context) -> Self {
            inject(cx.span().span_context(), &mut self.headers);
            self
        }
    }
}

#[cfg(feature = "otel")]
pub use otel::{inject, remote_context};

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses_and_prints_back() {
        let p = TraceParent::parse(VALID).expect("valid");
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.span_id[7], 0xb7);
        assert!(p.sampled());
        assert_eq!(p.to_string(), VALID);
        // A later version may carry more fields after the four it shares with 00.
        assert!(TraceParent::parse(&format!("01{}-later", &VALID[2..])).is_some());
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn header_names_match_in_any_case() {
        let headers = vec![("TraceParent".to_owned(), VALID.to_owned())];
        assert_eq!(header(&headers, TRACEPARENT), Some(VALID));
        assert_eq!(header(&headers, TRACESTATE), None);
    }

    #[cfg(feature = "otel")]
    #[test]
    fn the_context_goes_into_the_headers_and_back() {
        use opentelemetry::trace::TraceContextExt as _;

        let headers = vec![
            ("tenant".to_owned(), "acme".to_owned()),
            (TRACEPARENT.to_owned(), VALID.to_owned()),
            (TRACESTATE.to_owned(), "congo=t61rcWkgMzE".to_owned()),
        ];
        let cx = remote_context(&headers).expect("a parent");
        let span = cx.span().span_context().clone();
        assert!(span.is_remote() && span.is_sampled());
        assert_eq!(span.trace_state().header(), "congo=t61rcWkgMzE");

        let event = crate::NewEvent::new("Order", "o_1", "order.placed", "{}")
            .with_header("TRACEPARENT", "old")
            .with_trace_context_from(&cx);
        assert_eq!(
            event.headers,
            vec![
                ("TRACEPARENT".to_owned(), VALID.to_owned()),
                (TRACESTATE.to_owned(), "congo=t61rcWkgMzE".to_owned()),
            ]
        );
        // No active span: nothing is written.
        let plain = crate::NewEvent::new("Order", "o_1", "order.placed", "{}")
            .with_trace_context_from(&opentelemetry::Context::new());
        assert!(plain.headers.is_empty());
        let malformed = vec![(TRACEPARENT.to_owned(), "00-zz".to_owned())];
        assert!(remote_context(&malformed).is_none());
    }
}
