//! The JSON-lines encoding of events shared by the stdout / file sinks and the HTTP sink's
//! batched mode: one JSON object per event, one per line (the format is described in
//! [`crate::stdout`]'s documentation), or one CloudEvents envelope per line.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::sink::Delivery;
use outbox_core::{Event, SinkError, message};
use serde::Serialize;
use serde::ser::{SerializeMap as _, Serializer};
use serde_json::value::RawValue;
use time::OffsetDateTime;
use uuid::Uuid;

/// The line as written (borrowing from the event).
#[derive(Serialize)]
struct Line<'a> {
    id: Uuid,
    destination: String,
    key: &'a str,
    event_type: &'a str,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    headers: Headers<'a>,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
}

/// The message headers as a JSON object, in message order, first value of a name kept.
struct Headers<'a>(&'a Event);

impl Serialize for Headers<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(4 + self.0.headers.len());
        message::for_each_header(self.0, |name, value| {
            if !pairs.iter().any(|(n, _)| n == name) {
                pairs.push((name.to_owned(), value.to_owned()));
            }
        });
        let mut map = serializer.serialize_map(Some(pairs.len()))?;
        for (name, value) in &pairs {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// The payload as an embeddable JSON value, or `None` when it is not a JSON text.
fn json_payload(payload: &[u8]) -> Option<Box<RawValue>> {
    let text = std::str::from_utf8(payload).ok()?;
    let value: &RawValue = serde_json::from_str(text).ok()?;
    let json = value.get();
    if json.contains(['\n', '\r']) {
        // Inside a valid JSON text, raw line breaks can only be whitespace between tokens
        // (strings must escape them), so replacing them keeps the value and the line.
        RawValue::from_string(json.replace(['\n', '\r'], " ")).ok()
    } else {
        Some(value.to_owned())
    }
}

/// A line has no headers: only the structured mode, whose content type does not travel.
const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: None,
    structured_content_type: None,
    percent_encode: false,
};

/// Appends the CloudEvents envelope of `event` to `out` as one line.
pub(crate) fn render_envelope(
    format: &MessageFormat,
    event: &Event,
    out: &mut Vec<u8>,
) -> Delivery {
    let envelope = format
        .encode(event, &BINDING, |_, _| {})
        .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?
        .body;
    // Outside strings the envelope has no raw line break; inside an embedded JSON `data` one
    // is whitespace between tokens, which a space keeps.
    out.extend(envelope.iter().map(|&b| match b {
        b'\n' | b'\r' => b' ',
        other => other,
    }));
    out.push(b'\n');
    Ok(())
}

/// Appends the line of `event` to `out`; on failure `out` is left as it was.
pub(crate) fn render_line(destination: &str, event: &Event, out: &mut Vec<u8>) -> Delivery {
    let payload = json_payload(&event.payload);
    let payload_base64 = payload.is_none().then(|| STANDARD.encode(&event.payload));
    let line = Line {
        id: event.id,
        destination: destination.to_owned(),
        key: &event.aggregate_id,
        event_type: &event.event_type,
        aggregate_type: &event.aggregate_type,
        aggregate_id: &event.aggregate_id,
        headers: Headers(event),
        created_at: event.created_at.to_offset(time::UtcOffset::UTC),
        payload,
        payload_base64,
    };
    let start = out.len();
    if let Err(e) = serde_json::to_writer(&mut *out, &line) {
        out.truncate(start);
        return Err(SinkError::rejected(format!(
            "cannot encode event {} as a JSON line",
            event.id
        ))
        .with_source(e));
    }
    out.push(b'\n');
    Ok(())
}
