//! An event as a CloudEvent's context attributes (the mapping in the module docs of
//! [`crate::cloudevents`]), checked against the sink's [`CloudEvents`] settings, and those
//! attributes as the binary mode's headers.

use super::timestamp::Timestamp;
use super::{Binding, SPEC_VERSION, SettingsError, attribute, percent_encode};
use crate::message::header;
use crate::{Destination, Event};

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
    pub(super) data_content_type: &'a str,
    aggregate_type: &'a str,
    aggregate_seq: Option<&'a str>,
    extensions: Vec<(&'a str, &'a str)>,
    overflow: Option<String>,
    pub(super) payload: &'a [u8],
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
}
