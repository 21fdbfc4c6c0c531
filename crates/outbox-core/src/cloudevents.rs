//! CloudEvents 1.0: the `format` a sink can shape its messages in, beside the plain message of
//! `docs/contract.md` (`docs/sinks.md`, "CloudEvents", has the per-broker tables).
//!
//! | `format` | message |
//! | --- | --- |
//! | `plain` (default) | today's message: contract headers, row headers, the payload as body |
//! | `cloudevents-binary` | the event's context attributes as headers named by the protocol's binding (`ce_id` on Kafka, `ce-id` on HTTP), `datacontenttype` in the protocol's content-type slot, the payload bytes unchanged as body |
//! | `cloudevents-structured` | one JSON envelope (`application/cloudevents+json`) as body: the attributes, and `data` (the payload's JSON text) or `data_base64` |
//!
//! The mapping of an outbox event onto a CloudEvent:
//!
//! | attribute | value |
//! | --- | --- |
//! | `specversion` | `1.0` |
//! | `id` | the event id (the consumer's deduplication key, as in the plain message) |
//! | `source` | the sink's `cloudevents_source` template rendered for the event, default `urn:outbox:{aggregate_type}` |
//! | `type` | `event_type` |
//! | `subject` | `aggregate_id` (left out when empty: CloudEvents forbids an empty subject) |
//! | `time` | when the producer wrote the event, RFC 3339 in UTC (left out when the source does not know it) |
//! | `datacontenttype` | the row's `content-type` header, else the sink's `cloudevents_content_type` (default `application/json`) |
//! | `aggregatetype` (extension) | `aggregate_type` |
//! | `aggregateseq` (extension) | the relay's `aggregate_seq` header, when it set one |
//! | `<name>` (extensions) | each row header whose name is a legal extension name (`[a-z0-9]+`, such as `traceparent`, `tracestate`) and is not one of the names above |
//! | `outboxheaders` (extension) | every other row header (a name with `-`, `_` or capitals, a repeated name, a name of a context attribute), in order, as the JSON array `[["name","value"], ...]`: nothing is dropped |
//!
//! An event whose `type` or `source` would be empty cannot be a CloudEvent: [`MessageFormat::encode`]
//! refuses it (the sink dead-letters it with the reason).

use std::borrow::Cow;
use std::fmt::Write as _;

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::message::{self, header};
use crate::{Destination, Event};

/// The CloudEvents version every message declares.
pub const SPEC_VERSION: &str = "1.0";
/// Content type of the structured mode's JSON envelope.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// `cloudevents_source` when none is configured.
pub const DEFAULT_SOURCE: &str = "urn:outbox:{aggregate_type}";
/// `cloudevents_content_type` when none is configured.
pub const DEFAULT_DATA_CONTENT_TYPE: &str = "application/json";

/// Names of the context attributes the relay sets.
pub mod attribute {
    /// `specversion`: always [`super::SPEC_VERSION`].
    pub const SPECVERSION: &str = "specversion";
    /// `id`: the event id.
    pub const ID: &str = "id";
    /// `source`: the rendered `cloudevents_source`.
    pub const SOURCE: &str = "source";
    /// `type`: the event type.
    pub const TYPE: &str = "type";
    /// `subject`: the aggregate id.
    pub const SUBJECT: &str = "subject";
    /// `time`: when the producer wrote the event.
    pub const TIME: &str = "time";
    /// `datacontenttype`: the media type of the data.
    pub const DATACONTENTTYPE: &str = "datacontenttype";
    /// `dataschema`: not set by the relay; a row header of this name travels as it.
    pub const DATASCHEMA: &str = "dataschema";
    /// Extension: the aggregate type.
    pub const AGGREGATETYPE: &str = "aggregatetype";
    /// Extension: the relay's `aggregate_seq` (1, 2, 3, ... per aggregate).
    pub const AGGREGATESEQ: &str = "aggregateseq";
    /// Extension: the row headers that cannot be attributes of their own, as JSON
    /// `[["name","value"], ...]`.
    pub const OUTBOXHEADERS: &str = "outboxheaders";
}

/// Names a row header can never take as an extension: the context attributes of the spec
/// (but `dataschema`, which a producer may set), `data`, and the relay's own extensions.
const RESERVED: [&str; 10] = [
    attribute::SPECVERSION,
    attribute::ID,
    attribute::SOURCE,
    attribute::TYPE,
    attribute::SUBJECT,
    attribute::TIME,
    attribute::DATACONTENTTYPE,
    "data",
    attribute::AGGREGATETYPE,
    attribute::AGGREGATESEQ,
];

/// A sink's `format` key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// The plain message of `docs/contract.md` (the default).
    #[default]
    Plain,
    /// CloudEvents binary content mode: attributes as headers, the payload as body.
    CloudeventsBinary,
    /// CloudEvents structured content mode: a JSON envelope as body.
    CloudeventsStructured,
}

impl Format {
    /// Every value of the key, as written in the config.
    pub const NAMES: [&'static str; 3] = ["plain", "cloudevents-binary", "cloudevents-structured"];

    /// The value as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Plain => Self::NAMES[0],
            Self::CloudeventsBinary => Self::NAMES[1],
            Self::CloudeventsStructured => Self::NAMES[2],
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a protocol carries the binary content mode (its CloudEvents binding, or the rule a
/// sink chose where there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// Prefix of the header of each attribute: `ce_` (Kafka), `ce-` (HTTP, NATS, ...).
    pub prefix: &'static str,
    /// The header that carries `datacontenttype` (`content-type`; NATS: `ce-datacontenttype`),
    /// or `None` when the sink carries it itself (AMQP's `content_type` property): then it is
    /// in [`Encoded::content_type`].
    pub data_content_type: Option<&'static str>,
    /// The header that carries the structured mode's content type, or `None` when the sink
    /// carries it itself ([`Encoded::content_type`]).
    pub structured_content_type: Option<&'static str>,
    /// Percent-encode header values as the HTTP and NATS bindings require (space, `"`, `%`
    /// and everything outside printable ASCII become `%XX` of their UTF-8 bytes).
    pub percent_encode: bool,
}

/// Why the CloudEvents keys of a sink were refused: the key (relative to `[sink]`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct SettingsError {
    /// `cloudevents_source` or `cloudevents_content_type`.
    pub key: &'static str,
    /// Why.
    pub message: String,
}

/// The CloudEvents settings of a sink, checked: the `source` template and the default
/// `datacontenttype`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    source: Destination,
    content_type: String,
}

impl CloudEvents {
    /// Checks `cloudevents_source` (a template with `{aggregate_type}`, `{event_type}`,
    /// `{aggregate_id}`; a URI-reference, so no whitespace) and `cloudevents_content_type`
    /// (a media type `type/subtype`).
    pub fn new(source: &str, content_type: &str) -> Result<Self, SettingsError> {
        let source_error = |message: String| SettingsError {
            key: "cloudevents_source",
            message,
        };
        if source.trim().is_empty() {
            return Err(source_error(
                "must not be empty (CloudEvents requires a source)".to_owned(),
            ));
        }
        if source.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(source_error(format!(
                "`{source}` holds whitespace or a control character; a CloudEvents source is a \
                 URI-reference such as `urn:outbox:{{aggregate_type}}` or `https://orders.example.com`"
            )));
        }
        let template = Destination::parse(source).map_err(|e| {
            source_error(match e {
                crate::DestinationError::UnknownPlaceholder(p) => format!(
                    "unknown placeholder `{{{p}}}` (use {{aggregate_type}}, {{event_type}} or {{aggregate_id}})"
                ),
                other => other.to_string(),
            })
        })?;
        let media = content_type.trim();
        let valid_media = media == content_type
            && media
                .split(';')
                .next()
                .and_then(|m| m.split_once('/'))
                .is_some_and(|(t, s)| !t.trim().is_empty() && !s.trim().is_empty())
            && !media.chars().any(char::is_control);
        if !valid_media {
            return Err(SettingsError {
                key: "cloudevents_content_type",
                message: format!(
                    "`{content_type}` is not a media type such as `application/json` or \
                     `application/x-protobuf`"
                ),
            });
        }
        Ok(Self {
            source: template,
            content_type: content_type.to_owned(),
        })
    }

    /// The context attributes of `event`'s CloudEvent, or why it cannot be one.
    pub fn attributes<'a>(&'a self, event: &'a Event) -> Result<Attributes<'a>, String> {
        if event.event_type.is_empty() {
            return Err(
                "its event_type is empty, and a CloudEvent's `type` must not be empty".to_owned(),
            );
        }
        let source = self.source.render(event);
        if source.is_empty() {
            return Err(format!(
                "sink.cloudevents_source `{}` renders to an empty `source` for it",
                self.source
            ));
        }
        let time = (event.created_at != time::OffsetDateTime::UNIX_EPOCH)
            .then(|| Timestamp::rfc3339(event.created_at))
            .flatten();
        let mut data_content_type: Option<&str> = None;
        let mut aggregate_seq = None;
        let mut extensions: Vec<(&str, &str)> = Vec::new();
        let mut overflow: Vec<[&str; 2]> = Vec::new();
        for (name, value) in &event.headers {
            let name = name.as_str();
            if is_contract_header(name) {
                // The plain message drops these too: the event's own fields win.
                continue;
            }
            if name == header::AGGREGATE_SEQ && aggregate_seq.is_none() {
                aggregate_seq = Some(value.as_str());
            } else if name.eq_ignore_ascii_case("content-type") && data_content_type.is_none() {
                data_content_type = Some(value.as_str());
            } else if is_extension_name(name)
                && !RESERVED.contains(&name)
                && name != attribute::OUTBOXHEADERS
                && !extensions.iter().any(|(n, _)| *n == name)
            {
                extensions.push((name, value.as_str()));
            } else {
                overflow.push([name, value.as_str()]);
            }
        }
        let overflow = (!overflow.is_empty())
            .then(|| serde_json::to_string(&overflow).unwrap_or_else(|_| "[]".to_owned()));
        Ok(Attributes {
            id: {
                let mut id = [0; uuid::fmt::Hyphenated::LENGTH];
                event.id.hyphenated().encode_lower(&mut id);
                id
            },
            source,
            event_type: &event.event_type,
            subject: (!event.aggregate_id.is_empty()).then_some(event.aggregate_id.as_str()),
            time,
            data_content_type: data_content_type.unwrap_or(&self.content_type),
            aggregate_type: &event.aggregate_type,
            aggregate_seq,
            extensions,
            overflow,
            payload: &event.payload,
        })
    }
}

/// An RFC 3339 UTC timestamp (`2026-11-22T10:15:30.123456Z`, the fraction as long as needed),
/// formatted without allocating: this runs for every event.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Timestamp {
    text: [u8; 30],
    len: usize,
}

impl Timestamp {
    /// `at` in UTC; `None` for a year RFC 3339 cannot write (before 0 or after 9999).
    fn rfc3339(at: time::OffsetDateTime) -> Option<Self> {
        /// Writes `value` as `out.len()` decimal digits, zero-padded.
        fn digits(out: &mut [u8], mut value: u32) {
            for slot in out.iter_mut().rev() {
                *slot = b'0' + u8::try_from(value % 10).unwrap_or(0);
                value /= 10;
            }
        }
        let at = at.to_offset(time::UtcOffset::UTC);
        let year = u32::try_from(at.year()).ok().filter(|y| *y <= 9999)?;
        let mut text = *b"0000-00-00T00:00:00.000000000Z";
        digits(&mut text[0..4], year);
        digits(&mut text[5..7], u32::from(u8::from(at.month())));
        digits(&mut text[8..10], u32::from(at.day()));
        digits(&mut text[11..13], u32::from(at.hour()));
        digits(&mut text[14..16], u32::from(at.minute()));
        digits(&mut text[17..19], u32::from(at.second()));
        let mut nanos = at.nanosecond();
        let mut len = 19;
        if nanos != 0 {
            let mut width = 9;
            while nanos.is_multiple_of(10) {
                nanos /= 10;
                width -= 1;
            }
            digits(&mut text[20..20 + width], nanos);
            len = 20 + width;
        }
        text[len] = b'Z';
        Some(Self { text, len: len + 1 })
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text[..self.len]).unwrap_or_default()
    }
}

fn is_contract_header(name: &str) -> bool {
    matches!(
        name,
        header::ID | header::EVENT_TYPE | header::AGGREGATE_TYPE | header::AGGREGATE_ID
    )
}

/// True for a legal CloudEvents attribute name: one or more of `a-z` and `0-9`.
pub fn is_extension_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// True for a JSON media type (`application/json`, `text/json`, `*/*+json`, with or without
/// parameters): the structured mode then embeds JSON payloads as `data`.
pub fn is_json_media_type(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || media == "text/json" || media.ends_with("+json")
}

/// The context attributes of one event's CloudEvent (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes<'a> {
    id: [u8; uuid::fmt::Hyphenated::LENGTH],
    source: String,
    event_type: &'a str,
    subject: Option<&'a str>,
    time: Option<Timestamp>,
    data_content_type: &'a str,
    aggregate_type: &'a str,
    aggregate_seq: Option<&'a str>,
    extensions: Vec<(&'a str, &'a str)>,
    overflow: Option<String>,
    payload: &'a [u8],
}

impl<'a> Attributes<'a> {
    /// `id`: the event id.
    pub fn id(&self) -> &str {
        // Hyphenated lower-case hex: ASCII.
        std::str::from_utf8(&self.id).unwrap_or_default()
    }

    /// `datacontenttype`.
    pub fn data_content_type(&self) -> &'a str {
        self.data_content_type
    }

    /// Calls `f(name, value)` for every attribute but `data`, in this order: `specversion`,
    /// `id`, `source`, `type`, `subject`, `time`, `datacontenttype`, `aggregatetype`,
    /// `aggregateseq`, the row headers' extensions, `outboxheaders`.
    pub fn for_each(&self, mut f: impl FnMut(&str, &str)) {
        f(attribute::SPECVERSION, SPEC_VERSION);
        f(attribute::ID, self.id());
        f(attribute::SOURCE, &self.source);
        f(attribute::TYPE, self.event_type);
        if let Some(subject) = self.subject {
            f(attribute::SUBJECT, subject);
        }
        if let Some(time) = &self.time {
            f(attribute::TIME, time.as_str());
        }
        f(attribute::DATACONTENTTYPE, self.data_content_type);
        f(attribute::AGGREGATETYPE, self.aggregate_type);
        if let Some(seq) = self.aggregate_seq {
            f(attribute::AGGREGATESEQ, seq);
        }
        for (name, value) in &self.extensions {
            f(name, value);
        }
        if let Some(overflow) = &self.overflow {
            f(attribute::OUTBOXHEADERS, overflow);
        }
    }

    /// Calls `f(header, value)` for every header of the binary mode on `binding`: each
    /// attribute under the binding's prefix, `datacontenttype` under its own header (or not
    /// at all when the sink carries it), values percent-encoded when the binding says so.
    pub fn for_each_header(&self, binding: &Binding, mut f: impl FnMut(&str, &str)) {
        let mut name_buffer = String::with_capacity(binding.prefix.len() + 16);
        let mut value_buffer = String::new();
        self.for_each(|name, value| {
            let header = if name == attribute::DATACONTENTTYPE {
                match binding.data_content_type {
                    Some(header) if !header.starts_with(binding.prefix) => {
                        // A content-type header holds a media type as it is.
                        f(header, value);
                        return;
                    }
                    Some(header) => header,
                    None => return,
                }
            } else {
                name_buffer.clear();
                name_buffer.push_str(binding.prefix);
                name_buffer.push_str(name);
                name_buffer.as_str()
            };
            if binding.percent_encode {
                f(header, percent_encode(value, &mut value_buffer));
            } else {
                f(header, value);
            }
        });
    }

    /// Appends the structured mode's JSON envelope to `out`: the attributes in the order of
    /// [`for_each`](Self::for_each), then `data` (the payload's JSON text, surrounding
    /// whitespace dropped) when `datacontenttype` is a JSON type and the payload is a JSON
    /// text, else `data_base64` (standard base64 with padding; also for an empty payload).
    pub fn write_envelope(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        let mut first = true;
        self.for_each(|name, value| {
            if !first {
                out.push(b',');
            }
            first = false;
            write_json_string(out, name);
            out.push(b':');
            write_json_string(out, value);
        });
        match json_data(self.payload, self.data_content_type) {
            Some(json) => {
                out.extend_from_slice(b",\"data\":");
                out.extend_from_slice(json.as_bytes());
            }
            None => {
                out.extend_from_slice(b",\"data_base64\":\"");
                let engine = base64::engine::general_purpose::STANDARD;
                let start = out.len();
                out.resize(
                    start + base64::encoded_len(self.payload.len(), true).unwrap_or(0),
                    0,
                );
                let written = engine
                    .encode_slice(self.payload, &mut out[start..])
                    .unwrap_or(0);
                out.truncate(start + written);
                out.push(b'"');
            }
        }
        out.push(b'}');
    }

    /// The structured mode's JSON envelope.
    pub fn envelope(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.payload.len() * 4 / 3);
        self.write_envelope(&mut out);
        out
    }
}

/// The payload's JSON text when it goes as `data`.
fn json_data<'p>(payload: &'p [u8], content_type: &str) -> Option<&'p str> {
    if payload.is_empty() || !is_json_media_type(content_type) {
        return None;
    }
    let text = std::str::from_utf8(payload).ok()?;
    let value: &RawValue = serde_json::from_str(text).ok()?;
    Some(value.get())
}

fn write_json_string(out: &mut Vec<u8>, value: &str) {
    // Writing a string into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// `value` percent-encoded per the HTTP and NATS bindings: space, `"`, `%` and every
/// character outside printable ASCII become `%XX` (upper-case hex) of their UTF-8 bytes.
/// Returns `value` itself when nothing needs encoding, else the encoding written to `buffer`.
pub fn percent_encode<'v>(value: &'v str, buffer: &'v mut String) -> &'v str {
    let needs = |b: u8| !(0x21..=0x7E).contains(&b) || b == b'"' || b == b'%';
    if !value.bytes().any(needs) {
        return value;
    }
    buffer.clear();
    for b in value.bytes() {
        if needs(b) {
            let _ = write!(buffer, "%{b:02X}");
        } else {
            buffer.push(char::from(b));
        }
    }
    buffer.as_str()
}

/// `value` percent-decoded (one round, as the HTTP and NATS bindings say), or `None` when
/// the result is not UTF-8. A `%` not followed by two hex digits stays as it is.
pub fn percent_decode(value: &str) -> Option<Cow<'_, str>> {
    if !value.contains('%') {
        return Some(Cow::Borrowed(value));
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let byte = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(byte).unwrap_or(0));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

/// A sink's message format, checked: what shapes each message's headers and body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum MessageFormat {
    /// The plain message of `docs/contract.md`.
    #[default]
    Plain,
    /// CloudEvents binary content mode.
    Binary(CloudEvents),
    /// CloudEvents structured content mode.
    Structured(CloudEvents),
}

/// One event's message as [`MessageFormat::encode`] shaped it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded<'a> {
    /// The body: the payload (plain, binary) or the JSON envelope (structured).
    pub body: Bytes,
    /// The content type for sinks that carry it outside the headers (AMQP's property):
    /// `datacontenttype` in binary mode, [`STRUCTURED_CONTENT_TYPE`] in structured mode, when
    /// the [`Binding`] names no header for it; `None` in plain mode.
    pub content_type: Option<&'a str>,
}

impl MessageFormat {
    /// Checks the three keys of a sink's config (`format`, `cloudevents_source`,
    /// `cloudevents_content_type`); the CloudEvents keys only matter with a CloudEvents format.
    pub fn new(format: Format, source: &str, content_type: &str) -> Result<Self, SettingsError> {
        Ok(match format {
            Format::Plain => Self::Plain,
            Format::CloudeventsBinary => Self::Binary(CloudEvents::new(source, content_type)?),
            Format::CloudeventsStructured => {
                Self::Structured(CloudEvents::new(source, content_type)?)
            }
        })
    }

    /// The `format` key this came from.
    pub fn format(&self) -> Format {
        match self {
            Self::Plain => Format::Plain,
            Self::Binary(_) => Format::CloudeventsBinary,
            Self::Structured(_) => Format::CloudeventsStructured,
        }
    }

    /// True for the plain message.
    pub fn is_plain(&self) -> bool {
        matches!(self, Self::Plain)
    }

    /// Shapes `event`'s message for `binding`: calls `f(name, value)` for every header (plain:
    /// [`message::for_each_header`]; binary: [`Attributes::for_each_header`]; structured:
    /// only the content type, when the binding names a header for it) and returns the body.
    /// `Err` says why the event cannot be a CloudEvent.
    pub fn encode<'a>(
        &'a self,
        event: &'a Event,
        binding: &Binding,
        mut f: impl FnMut(&str, &str),
    ) -> Result<Encoded<'a>, String> {
        match self {
            Self::Plain => {
                message::for_each_header(event, f);
                Ok(Encoded {
                    body: event.payload.clone(),
                    content_type: None,
                })
            }
            Self::Binary(settings) => {
                let attributes = settings.attributes(event)?;
                attributes.for_each_header(binding, f);
                Ok(Encoded {
                    body: event.payload.clone(),
                    content_type: binding
                        .data_content_type
                        .is_none()
                        .then_some(attributes.data_content_type()),
                })
            }
            Self::Structured(settings) => {
                let attributes = settings.attributes(event)?;
                let body = Bytes::from(attributes.envelope());
                match binding.structured_content_type {
                    Some(header) => {
                        f(header, STRUCTURED_CONTENT_TYPE);
                        Ok(Encoded {
                            body,
                            content_type: None,
                        })
                    }
                    None => Ok(Encoded {
                        body,
                        content_type: Some(STRUCTURED_CONTENT_TYPE),
                    }),
                }
            }
        }
    }
}

/// The pairs of an `outboxheaders` attribute (`[["name","value"], ...]`), or `None` when
/// `text` is not that.
pub fn parse_header_pairs(text: &str) -> Option<Vec<(String, String)>> {
    let pairs: Vec<[String; 2]> = serde_json::from_str(text).ok()?;
    Some(pairs.into_iter().map(|[n, v]| (n, v)).collect())
}

/// An outbox event read back out of a structured CloudEvent (the inbox's side): the
/// attributes as they were sent, `data` as the payload bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Every attribute but `data` / `data_base64`, in the envelope's order; non-string values
    /// as their JSON text.
    pub attributes: Vec<(String, String)>,
    /// `data`'s JSON text, or the bytes of `data_base64`; empty when neither is present.
    pub data: Bytes,
}

impl Envelope {
    /// Parses a structured-mode body; `None` when it is not a JSON object with a
    /// `specversion` (not a CloudEvent) or `data_base64` is not base64.
    pub fn parse(body: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(body).ok()?;
        let fields: Vec<(String, &RawValue)> = {
            struct Fields<'t>(Vec<(String, &'t RawValue)>);
            impl<'de: 't, 't> Deserialize<'de> for Fields<'t> {
                fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    struct Visit<'t>(std::marker::PhantomData<&'t ()>);
                    impl<'de: 't, 't> serde::de::Visitor<'de> for Visit<'t> {
                        type Value = Fields<'t>;
                        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                            f.write_str("a JSON object")
                        }
                        fn visit_map<M: serde::de::MapAccess<'de>>(
                            self,
                            mut map: M,
                        ) -> Result<Self::Value, M::Error> {
                            let mut out = Vec::new();
                            while let Some((k, v)) = map.next_entry::<String, &'t RawValue>()? {
                                out.push((k, v));
                            }
                            Ok(Fields(out))
                        }
                    }
                    d.deserialize_map(Visit(std::marker::PhantomData))
                }
            }
            serde_json::from_str::<Fields<'_>>(text).ok()?.0
        };
        if !fields.iter().any(|(k, _)| k == attribute::SPECVERSION) {
            return None;
        }
        let mut attributes = Vec::with_capacity(fields.len());
        let mut data = Bytes::new();
        for (name, raw) in fields {
            match name.as_str() {
                "data" => data = Bytes::copy_from_slice(raw.get().as_bytes()),
                "data_base64" => {
                    let encoded: String = serde_json::from_str(raw.get()).ok()?;
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .ok()?;
                    data = Bytes::from(decoded);
                }
                _ => {
                    let value = serde_json::from_str::<String>(raw.get())
                        .unwrap_or_else(|_| raw.get().to_owned());
                    attributes.push((name, value));
                }
            }
        }
        Some(Self { attributes, data })
    }
}

#[cfg(test)]
mod tests;
