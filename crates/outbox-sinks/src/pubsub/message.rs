//! The Pub/Sub message of one event and Pub/Sub's limits on it: the attributes (the
//! contract headers or the CloudEvents ones), the data, the ordering key, the topic id, and
//! the size the message adds to a publish request.

use std::collections::BTreeMap;

use base64::Engine as _;
use bytes::Bytes;
use outbox_core::cloudevents::MessageFormat;
use outbox_core::{Event, SinkError};

use super::{
    BINDING, MAX_ATTRIBUTE_KEY_BYTES, MAX_ATTRIBUTE_VALUE_BYTES, MAX_ATTRIBUTES,
    MAX_ORDERING_KEY_BYTES, MAX_REQUEST_BYTES, PubSubSink,
};

/// One event ready to go: its topic id and its message as JSON.
pub(super) struct Prepared {
    pub(super) index: usize,
    pub(super) topic: String,
    pub(super) json: String,
    /// Its size as a `messages` entry of the protobuf request.
    pub(super) size: usize,
}

/// The JSON of one message of the REST API.
#[derive(serde::Serialize)]
struct WireMessage<'a> {
    data: String,
    attributes: &'a BTreeMap<String, String>,
    #[serde(rename = "orderingKey")]
    ordering_key: &'a str,
}

impl PubSubSink {
    /// The message of `event`, or why Pub/Sub cannot take it.
    pub(super) fn prepare(&self, index: usize, event: &Event) -> Result<Prepared, SinkError> {
        let topic = self.topic.render(event);
        if let Some(problem) = topic_name_problem(&topic) {
            return Err(SinkError::rejected(format!(
                "topic template `{}` renders to `{topic}` for this event, which is not a Pub/Sub \
                 topic id: {problem}",
                self.topic
            )));
        }
        let (attributes, data) = attributes(event, &self.format)?;
        if data.len() > self.max_payload {
            let whose = if self.max_payload < MAX_REQUEST_BYTES {
                "sink.max_payload"
            } else {
                "Pub/Sub's message limit"
            };
            return Err(SinkError::rejected(format!(
                "payload of {} bytes exceeds the limit of {} bytes ({whose})",
                data.len(),
                self.max_payload
            )));
        }
        let ordering_key =
            crate::cloud::ordering_key(&event.aggregate_id, MAX_ORDERING_KEY_BYTES, |c: char| {
                !c.is_control()
            });
        let mut size = field_len(data.len()) + field_len(ordering_key.len());
        for (name, value) in &attributes {
            size += field_len(field_len(name.len()) + field_len(value.len()));
        }
        let size = field_len(size);
        let request = field_len(self.topic_path(&topic).len()) + size;
        if request > MAX_REQUEST_BYTES {
            return Err(SinkError::rejected(format!(
                "message of {request} bytes (payload, attributes, ordering key) exceeds Pub/Sub's \
                 limit of {MAX_REQUEST_BYTES} bytes per publish request"
            )));
        }
        let json = serde_json::to_string(&WireMessage {
            data: base64::engine::general_purpose::STANDARD.encode(&data),
            attributes: &attributes,
            ordering_key: &ordering_key,
        })
        .map_err(|e| SinkError::rejected("cannot encode the message as JSON").with_source(e))?;
        Ok(Prepared {
            index,
            topic,
            json,
            size,
        })
    }
}

/// The attributes (the message headers) and data of `event`'s message in `format`, or the
/// limit one breaks.
pub(super) fn attributes(
    event: &Event,
    format: &MessageFormat,
) -> Result<(BTreeMap<String, String>, Bytes), SinkError> {
    let mut attributes = BTreeMap::new();
    let mut count = 0;
    let mut problem: Option<String> = None;
    let encoded = format.encode(event, &BINDING, |name, value| {
        count += 1;
        if problem.is_some() {
            return;
        }
        problem = if name.is_empty() {
            Some("a header with an empty name cannot be a Pub/Sub attribute".to_owned())
        } else if name.len() > MAX_ATTRIBUTE_KEY_BYTES {
            Some(format!(
                "header name `{}` of {} bytes exceeds Pub/Sub's limit of \
                 {MAX_ATTRIBUTE_KEY_BYTES} bytes per attribute key",
                shorten(name),
                name.len()
            ))
        } else if value.len() > MAX_ATTRIBUTE_VALUE_BYTES {
            Some(format!(
                "header `{}` of {} bytes exceeds Pub/Sub's limit of \
                 {MAX_ATTRIBUTE_VALUE_BYTES} bytes per attribute value",
                shorten(name),
                value.len()
            ))
        } else if name.starts_with("goog") {
            Some(format!(
                "header `{}` cannot be a Pub/Sub attribute: keys starting with `goog` are \
                 reserved (a Pub/Sub limit)",
                shorten(name)
            ))
        } else {
            None
        };
        if problem.is_none() {
            // `for_each_header` already drops row headers named like contract headers; a
            // row header named twice would lose one value in the attribute map.
            if let Some(first) = attributes.insert(name.to_owned(), value.to_owned())
                && first != value
            {
                problem = Some(format!(
                    "header `{}` appears twice with different values; Pub/Sub attributes \
                     are a map with one value per key",
                    shorten(name)
                ));
            }
        }
    });
    let data = encoded
        .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?
        .body;
    if let Some(problem) = problem {
        return Err(SinkError::rejected(problem));
    }
    if count > MAX_ATTRIBUTES {
        return Err(SinkError::rejected(format!(
            "{count} headers (the 4 contract headers included) exceed Pub/Sub's limit of \
             {MAX_ATTRIBUTES} attributes per message"
        )));
    }
    Ok((attributes, data))
}

/// Why `name` is not a Pub/Sub topic id, or `None` when it is one.
pub(crate) fn topic_name_problem(name: &str) -> Option<String> {
    let length = name.chars().count();
    if !(3..=255).contains(&length) {
        return Some(format!(
            "it must have 3 to 255 characters, not {length} (a Pub/Sub limit)"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Some("it must start with a letter".to_owned());
    }
    if name.starts_with("goog") {
        return Some("it must not start with `goog`".to_owned());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '%' | '+')))
    {
        return Some(format!(
            "`{}` is not allowed (letters, digits and `-._~%+` only)",
            c.escape_default()
        ));
    }
    None
}

/// The size of a length-delimited protobuf field (1-byte tag) of `len` bytes.
pub(super) fn field_len(len: usize) -> usize {
    let mut varint = 1;
    let mut rest = len >> 7;
    while rest > 0 {
        varint += 1;
        rest >>= 7;
    }
    1 + varint + len
}

/// At most 60 characters of `text`, for messages.
pub(super) fn shorten(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}
