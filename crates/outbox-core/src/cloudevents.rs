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
//!
//! By concern: this module holds the settings and the [`MessageFormat`] a sink encodes with;
//! `attributes` maps an event onto its context attributes and the binary mode's headers,
//! `structured` writes and reads the structured mode's JSON envelope, `percent` is the HTTP
//! and NATS bindings' value encoding, `timestamp` the `time` attribute.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::Event;
use crate::message;

mod attributes;
mod percent;
mod structured;
mod timestamp;

pub use attributes::{Attributes, CloudEvents, is_extension_name, is_json_media_type};
pub use percent::{percent_decode, percent_encode};
pub use structured::{Envelope, parse_header_pairs};
#[cfg(test)]
use timestamp::Timestamp;

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

#[cfg(test)]
mod tests;
