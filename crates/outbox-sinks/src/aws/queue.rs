//! The message rules of SQS and SNS (`docs/contract.md`, "The message on the broker"): text
//! bodies, at most ten message attributes, FIFO group and deduplication ids, and the batch
//! entry ids.

use base64::Engine as _;
use outbox_core::cloudevents::{Binding, MessageFormat};
use outbox_core::{Event, SinkError};

use super::{EntryOutcome, Pending};

/// The outcomes of a batch call of `count` entries whose ids are `e<position>`, from the
/// service's lists of successful ids and failed `(id, sender_fault, reason)`.
pub(crate) fn outcomes_by_id<'a>(
    count: usize,
    successful: impl IntoIterator<Item = &'a str>,
    failed: impl IntoIterator<Item = (&'a str, bool, String)>,
) -> Vec<EntryOutcome> {
    let mut outcomes = vec![
        EntryOutcome::Failed {
            retry: true,
            reason: "no answer for this entry of the batch".to_owned(),
        };
        count
    ];
    for id in successful {
        if let Some(slot) = entry_position(id).and_then(|i| outcomes.get_mut(i)) {
            *slot = EntryOutcome::Sent;
        }
    }
    for (id, sender_fault, reason) in failed {
        if let Some(slot) = entry_position(id).and_then(|i| outcomes.get_mut(i)) {
            *slot = EntryOutcome::Failed {
                retry: !sender_fault,
                reason,
            };
        }
    }
    outcomes
}

/// The attributes of the CloudEvents formats on SQS and SNS. Neither has a CloudEvents
/// binding; these follow the HTTP binding's names (`ce-<attribute>`, `content-type`) with
/// values as they are (String attributes carry any legal text). The ten-attribute rule below
/// applies to them as to every header: what does not fit goes in `outbox-headers`.
pub(crate) const BINDING: Binding = Binding {
    prefix: "ce-",
    data_content_type: Some("content-type"),
    structured_content_type: Some("content-type"),
    percent_encode: false,
};

/// An SQS or SNS message of one event, with the FIFO ids when the target is FIFO.
#[derive(Debug)]
pub(crate) struct QueueMessage {
    pub(crate) message: TextMessage,
    /// `MessageGroupId`: [`group_id`] of `aggregate_id`.
    pub(crate) group_id: Option<String>,
    /// `MessageDeduplicationId`: the event id.
    pub(crate) dedup_id: Option<String>,
}

/// The SQS or SNS message of `event` for a target named `name` (FIFO when it ends in
/// `.fifo`), or `Rejected` when it is larger than `max_size`.
pub(crate) fn queue_message(
    index: usize,
    event: &Event,
    name: Result<&str, String>,
    format: &MessageFormat,
    (service, max_size): (&str, usize),
) -> Result<Pending<QueueMessage>, SinkError> {
    let name = name.map_err(SinkError::rejected)?;
    let message = text_message(event, format)
        .map_err(|reason| crate::cloudevents::not_a_cloudevent(event, reason))?;
    if message.size > max_size {
        return Err(SinkError::rejected(format!(
            "message of {} bytes (body and attributes) exceeds the {service} limit of {max_size} \
             bytes (sink.max_message_size)",
            message.size
        )));
    }
    let fifo = name.ends_with(".fifo");
    Ok(Pending {
        index,
        size: message.size,
        message: QueueMessage {
            group_id: fifo.then(|| group_id(&event.aggregate_id).into_owned()),
            dedup_id: fifo.then(|| event.id.to_string()),
            message,
        },
    })
}

/// The id of the entry at `position` of a batch call.
pub(crate) fn entry_id(position: usize) -> String {
    format!("e{position}")
}

fn entry_position(id: &str) -> Option<usize> {
    id.strip_prefix('e')?.parse().ok()
}

/// The attribute that says how the body encodes the payload.
pub(crate) const ENCODING_ATTRIBUTE: &str = "content-transfer-encoding";
/// The attribute that carries, as JSON `[[name, value], ...]`, the headers that cannot be
/// attributes of their own.
pub(crate) const OVERFLOW_ATTRIBUTE: &str = "outbox-headers";
/// SQS and SNS allow ten message attributes.
pub(crate) const MAX_ATTRIBUTES: usize = 10;
/// The data type of every attribute the sinks send.
pub(crate) const STRING_TYPE: &str = "String";
/// The body sent for an empty payload (SQS and SNS refuse an empty body), with
/// `content-transfer-encoding: empty`.
pub(crate) const EMPTY_BODY: &str = "-";

/// An SQS or SNS message of one event: its text body and its attributes.
#[derive(Debug)]
pub(crate) struct TextMessage {
    /// The body: the payload itself, base64, or [`EMPTY_BODY`].
    pub(crate) body: String,
    /// `(name, value)` String attributes, at most [`MAX_ATTRIBUTES`].
    pub(crate) attributes: Vec<(String, String)>,
    /// What the service counts against its size limit: body, attribute names, types, values.
    pub(crate) size: usize,
}

/// True when SQS and SNS accept `c` in a body or a String attribute value (XML 1.0
/// characters: tab, line feed, carriage return, U+0020..U+D7FF, U+E000..U+FFFD, above U+FFFF).
fn is_legal_text_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}')
        || u32::from(c) > 0xFFFF
}

/// True when `value` is a legal, non-empty String attribute value.
fn is_legal_value(value: &str) -> bool {
    !value.is_empty() && value.chars().all(is_legal_text_char)
}

/// True when `name` is a legal message attribute name: at most 256 of `A-Za-z0-9_-.`, no
/// leading, trailing or doubled `.`, not starting with `AWS.` or `Amazon.` (any case).
pub(crate) fn is_legal_attribute_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
}

/// The message of `event` for SQS or SNS in `format`, per `docs/contract.md` (the body and
/// headers of the CloudEvents formats take the payload's and the headers' places), or why the
/// event cannot be a CloudEvent:
///
/// - body: the payload when it is legal text for the service, else base64 with the attribute
///   `content-transfer-encoding: base64`; an empty payload is the body `-` with
///   `content-transfer-encoding: empty` (the services refuse an empty body);
/// - attributes: every header (contract headers first) as a String attribute of its own name
///   when its name and value are legal and all fit in ten; otherwise the headers that do not
///   fit or are not legal go, in order, in one attribute `outbox-headers` holding the JSON
///   array `[[name, value], ...]`. Nothing is dropped.
pub(crate) fn text_message(event: &Event, format: &MessageFormat) -> Result<TextMessage, String> {
    let mut headers: Vec<(String, String)> = Vec::with_capacity(8 + event.headers.len());
    let encoded = format.encode(event, &BINDING, |name, value| {
        headers.push((name.to_owned(), value.to_owned()));
    })?;
    let payload = &encoded.body[..];
    let (body, encoding) = if payload.is_empty() {
        (EMPTY_BODY.to_owned(), Some("empty"))
    } else {
        match std::str::from_utf8(payload) {
            Ok(text) if text.chars().all(is_legal_text_char) => (text.to_owned(), None),
            _ => (
                base64::engine::general_purpose::STANDARD.encode(payload),
                Some("base64"),
            ),
        }
    };
    let mut attributes = Vec::with_capacity(6);
    if let Some(encoding) = encoding {
        attributes.push((ENCODING_ATTRIBUTE.to_owned(), encoding.to_owned()));
    }
    let fits_alone = |(name, value): &(String, String)| {
        is_legal_attribute_name(name)
            && is_legal_value(value)
            && name != ENCODING_ATTRIBUTE
            && name != OVERFLOW_ATTRIBUTE
    };
    let all_alone = headers.iter().all(fits_alone);
    let room = MAX_ATTRIBUTES - attributes.len();
    if all_alone && headers.len() <= room {
        attributes.extend(headers);
    } else {
        let mut overflow: Vec<(String, String)> = Vec::new();
        for header in headers {
            if fits_alone(&header) && attributes.len() < MAX_ATTRIBUTES - 1 {
                attributes.push(header);
            } else {
                overflow.push(header);
            }
        }
        attributes.push((OVERFLOW_ATTRIBUTE.to_owned(), overflow_json(&overflow)));
    }
    let size = body.len()
        + attributes
            .iter()
            .map(|(n, v)| n.len() + STRING_TYPE.len() + v.len())
            .sum::<usize>();
    Ok(TextMessage {
        body,
        attributes,
        size,
    })
}

/// `[[name, value], ...]` as JSON that is itself a legal attribute value: serde escapes the
/// control characters; U+FFFE and U+FFFF, which it leaves as they are, are escaped here.
fn overflow_json(headers: &[(String, String)]) -> String {
    let pairs: Vec<[&str; 2]> = headers
        .iter()
        .map(|(n, v)| [n.as_str(), v.as_str()])
        .collect();
    let json = serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned());
    if json.contains(['\u{FFFE}', '\u{FFFF}']) {
        json.replace('\u{FFFE}', "\\ufffe")
            .replace('\u{FFFF}', "\\uffff")
    } else {
        json
    }
}

/// A FIFO `MessageGroupId` for `aggregate_id`: itself when legal (1 to 128 printable ASCII
/// characters), else `sha256:<hex>` of it.
pub(crate) fn group_id(aggregate_id: &str) -> std::borrow::Cow<'_, str> {
    crate::cloud::ordering_key(aggregate_id, 128, |c| c.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use outbox_core::Position;
    use time::OffsetDateTime;
    use uuid::Uuid;

    use super::*;

    fn event(payload: &'static [u8], headers: &[(&str, &str)]) -> Event {
        Event {
            id: Uuid::now_v7(),
            position: Position(0),
            aggregate_type: "Order".into(),
            aggregate_id: "o_1".into(),
            event_type: "order.placed".into(),
            payload: Bytes::from_static(payload),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            created_at: OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    fn plain(e: &Event) -> TextMessage {
        text_message(e, &MessageFormat::Plain).expect("a plain message is always made")
    }

    #[test]
    fn cloudevents_attributes_follow_the_same_rules() {
        use outbox_core::cloudevents::{DEFAULT_DATA_CONTENT_TYPE, DEFAULT_SOURCE, Format};
        let e = event(
            b"{\"total\":1}",
            &[("traceparent", "00-ab-cd-01"), ("X-Trace", "x")],
        );
        let binary = MessageFormat::new(
            Format::CloudeventsBinary,
            DEFAULT_SOURCE,
            DEFAULT_DATA_CONTENT_TYPE,
        )
        .expect("valid");
        let m = text_message(&e, &binary).expect("a CloudEvent");
        assert_eq!(m.body, "{\"total\":1}", "the data is the payload");
        let names: Vec<&str> = m.attributes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "ce-specversion",
                "ce-id",
                "ce-source",
                "ce-type",
                "ce-subject",
                "content-type",
                "ce-aggregatetype",
                "ce-traceparent",
                "ce-outboxheaders",
            ]
        );
        assert_eq!(attribute(&m, "ce-id"), Some(e.id.to_string().as_str()));
        assert_eq!(
            attribute(&m, "ce-outboxheaders"),
            Some(r#"[["X-Trace","x"]]"#)
        );

        let many: Vec<(String, String)> = (0..3).map(|i| (format!("h{i}"), "v".into())).collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let m = text_message(&event(b"\xff", &refs), &binary).expect("a CloudEvent");
        assert_eq!(m.attributes.len(), MAX_ATTRIBUTES);
        assert_eq!(attribute(&m, ENCODING_ATTRIBUTE), Some("base64"));
        let overflow: Vec<[String; 2]> =
            serde_json::from_str(attribute(&m, OVERFLOW_ATTRIBUTE).expect("overflow"))
                .expect("JSON");
        // Eight attributes before the row headers (the encoding, the CloudEvents ones), `h0`
        // fills the ninth, the other two go in the tenth: nothing is dropped.
        assert_eq!(attribute(&m, "ce-h0"), Some("v"));
        let names: Vec<&str> = overflow.iter().map(|[n, _]| n.as_str()).collect();
        assert_eq!(names, ["ce-h1", "ce-h2"]);

        let structured = MessageFormat::new(
            Format::CloudeventsStructured,
            DEFAULT_SOURCE,
            DEFAULT_DATA_CONTENT_TYPE,
        )
        .expect("valid");
        let m = text_message(&e, &structured).expect("a CloudEvent");
        assert_eq!(
            m.attributes,
            [(
                "content-type".to_owned(),
                "application/cloudevents+json".to_owned()
            )]
        );
        let envelope: serde_json::Value = serde_json::from_str(&m.body).expect("JSON");
        assert_eq!(envelope["id"], e.id.to_string());
        assert_eq!(envelope["data"]["total"], 1);

        let mut nameless = e.clone();
        nameless.event_type.clear();
        assert!(text_message(&nameless, &structured).is_err());
    }

    fn attribute<'a>(m: &'a TextMessage, name: &str) -> Option<&'a str> {
        m.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn text_goes_as_is_and_binary_or_control_characters_as_base64() {
        let text = plain(&event("caf\u{e9} {\"a\":1}\n".as_bytes(), &[]));
        assert_eq!(text.body, "caf\u{e9} {\"a\":1}\n");
        assert_eq!(attribute(&text, ENCODING_ATTRIBUTE), None);

        for payload in [&b"\x00\xffbin"[..], b"nul\x00inside", b"bell\x07"] {
            let leaked: &'static [u8] = Box::leak(payload.to_vec().into_boxed_slice());
            let m = plain(&event(leaked, &[]));
            assert_eq!(attribute(&m, ENCODING_ATTRIBUTE), Some("base64"));
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(&m.body)
                .expect("base64");
            assert_eq!(decoded, payload);
        }
        let empty = plain(&event(b"", &[]));
        assert_eq!(empty.body, EMPTY_BODY);
        assert_eq!(attribute(&empty, ENCODING_ATTRIBUTE), Some("empty"));
    }

    #[test]
    fn headers_are_attributes_and_the_overflow_is_one_json_attribute() {
        let few = plain(&event(b"x", &[("tenant", "acme")]));
        assert_eq!(attribute(&few, "id").map(str::len), Some(36));
        assert_eq!(attribute(&few, "tenant"), Some("acme"));
        assert_eq!(attribute(&few, OVERFLOW_ATTRIBUTE), None);

        let many: Vec<(String, String)> =
            (0..8).map(|i| (format!("h{i}"), format!("v{i}"))).collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let full = plain(&event(b"x", &refs));
        assert_eq!(full.attributes.len(), MAX_ATTRIBUTES);
        let overflow: Vec<(String, String)> =
            serde_json::from_str(attribute(&full, OVERFLOW_ATTRIBUTE).expect("overflow attribute"))
                .expect("JSON pairs");
        // Four contract headers and five own headers fit beside the overflow attribute.
        assert_eq!(
            overflow,
            vec![
                ("h5".to_owned(), "v5".to_owned()),
                ("h6".to_owned(), "v6".to_owned()),
                ("h7".to_owned(), "v7".to_owned())
            ]
        );
        assert_eq!(attribute(&full, "h4"), Some("v4"));

        let odd = plain(&event(
            b"x",
            &[
                ("AWS.trace", "1"),
                ("with space", "2"),
                ("empty", ""),
                ("ctl", "a\u{1}b"),
            ],
        ));
        let overflow: Vec<(String, String)> =
            serde_json::from_str(attribute(&odd, OVERFLOW_ATTRIBUTE).expect("overflow"))
                .expect("JSON pairs");
        assert_eq!(overflow.len(), 4, "{overflow:?}");
        assert_eq!(overflow[3], ("ctl".to_owned(), "a\u{1}b".to_owned()));
        assert!(
            odd.attributes
                .iter()
                .all(|(n, v)| is_legal_attribute_name(n) && is_legal_value(v))
        );
    }

    #[test]
    fn attribute_names_follow_aws_rules() {
        for ok in ["id", "event_type", "trace-id", "a.b", "X_1"] {
            assert!(is_legal_attribute_name(ok), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "aws.x", "Amazon.y", "sp ace", "ünï"] {
            assert!(!is_legal_attribute_name(bad), "{bad}");
        }
    }

    #[test]
    fn group_ids_are_printable_ascii_up_to_128() {
        assert_eq!(group_id("o_1"), "o_1");
        assert!(group_id("caf\u{e9}").starts_with("sha256:"));
        assert!(group_id(&"a".repeat(129)).starts_with("sha256:"));
    }
}
