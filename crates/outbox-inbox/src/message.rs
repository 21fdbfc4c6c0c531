//! [`InboxMessage`]: a delivered message with the contract headers of `docs/contract.md` parsed
//! back (`id`, `event_type`, `aggregate_type`, `aggregate_id`, then the row's own headers).
//!
//! A message a sink sent with `format = "cloudevents-binary"` or `"cloudevents-structured"`
//! is read back too (`docs/sinks.md`, "CloudEvents"): the `id` attribute is the event id,
//! `type` the event type, `subject` the aggregate id (empty when absent), the `aggregatetype`
//! and `aggregateseq` extensions the aggregate type and position; the other extensions and
//! the pairs of `outboxheaders` become the row's headers again, and `datacontenttype` the
//! header `content-type`. In binary mode the attributes are the headers prefixed `ce_` or
//! `ce-` (any case); in structured mode (no contract header, no `ce_id` / `ce-id`) the body
//! is the JSON envelope and the payload is its `data` (the JSON text) or `data_base64`.

use std::borrow::Cow;

use bytes::Bytes;
use outbox_core::cloudevents::{self, Envelope, attribute};
use outbox_core::message::header;
use uuid::Uuid;

/// A message as a consumer receives it, whatever the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxMessage {
    /// The event id: the inbox's deduplication key.
    pub id: Uuid,
    /// Event kind, e.g. `order.placed`.
    pub event_type: String,
    /// Aggregate kind, e.g. `Order`.
    pub aggregate_type: String,
    /// Aggregate instance, e.g. `o_91f2`: the ordering key of the consumer loops.
    pub aggregate_id: String,
    /// The event's delivery position within its aggregate (header `aggregate_seq`: 1, 2, 3,
    /// … with no gaps), set by the polling relay when ordering is on and by the PostgreSQL
    /// and MySQL CDC relays; `None` without it (DynamoDB, `ordering = "none"` polling, a relay
    /// from before it). The loops' order gate
    /// holds a message until its predecessor is applied.
    pub aggregate_seq: Option<u64>,
    /// The row's own headers (not the contract headers, nor broker headers the loop
    /// knows, such as `Nats-Msg-Id`).
    pub headers: Vec<(String, String)>,
    /// The payload bytes exactly as the producer stored them.
    pub payload: Bytes,
}

/// Why a delivered message does not follow the contract. Such a message can never be
/// processed, so the loops dead-letter it (or answer 400) instead of retrying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// A contract header is missing.
    #[error("the message has no `{0}` header")]
    MissingHeader(&'static str),
    /// The `id` header is not a UUID.
    #[error("the `id` header `{0}` is not a UUID")]
    InvalidId(String),
    /// A CloudEvents message whose attributes cannot be read back.
    #[error("the CloudEvent cannot be read: {0}")]
    InvalidCloudEvent(String),
}

impl InboxMessage {
    /// Parses the contract headers out of `headers`; every other header is kept in
    /// [`InboxMessage::headers`] except those named in `skip` (broker bookkeeping). A
    /// CloudEvents message (see the module documentation) is read from its attributes, with
    /// header values as they are (the Kafka, RabbitMQ and attribute-based bindings).
    pub fn from_headers<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
        skip: &[&str],
        payload: Bytes,
    ) -> Result<Self, MessageError> {
        Self::parse(headers, skip, payload, false)
    }

    /// As [`from_headers`](Self::from_headers), for brokers whose CloudEvents binding
    /// percent-encodes the `ce-` header values (HTTP, NATS): those are decoded first.
    pub fn from_percent_encoded_headers<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
        skip: &[&str],
        payload: Bytes,
    ) -> Result<Self, MessageError> {
        Self::parse(headers, skip, payload, true)
    }

    fn parse<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
        skip: &[&str],
        payload: Bytes,
        percent_encoded: bool,
    ) -> Result<Self, MessageError> {
        let headers: Vec<(&str, &str)> = headers.into_iter().collect();
        if headers.iter().any(|(name, _)| *name == header::ID) {
            return Self::from_contract(headers, skip, payload, false);
        }
        if headers
            .iter()
            .any(|(name, _)| ce_attribute(name) == Some(attribute::ID))
        {
            let translated = from_binary(&headers, percent_encoded)?;
            let refs = translated.iter().map(|(n, v)| (n.as_ref(), v.as_ref()));
            return Self::from_contract(refs, skip, payload, true);
        }
        if let Some(envelope) = Envelope::parse(&payload) {
            let translated = from_attributes(
                envelope
                    .attributes
                    .iter()
                    .map(|(n, v)| (n.as_str(), Cow::Borrowed(v.as_str()))),
            )?;
            let refs = translated.iter().map(|(n, v)| (n.as_ref(), v.as_ref()));
            return Self::from_contract(refs, &[], envelope.data, true);
        }
        Self::from_contract(headers, skip, payload, false)
    }

    /// The contract headers and the rest; a CloudEvent without `subject` had an empty
    /// aggregate id.
    fn from_contract<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
        skip: &[&str],
        payload: Bytes,
        cloudevent: bool,
    ) -> Result<Self, MessageError> {
        let (mut id, mut event_type, mut aggregate_type, mut aggregate_id) =
            (None, None, None, None);
        let mut aggregate_seq = None;
        let mut own = Vec::new();
        for (name, value) in headers {
            let slot = match name {
                header::ID => &mut id,
                header::EVENT_TYPE => &mut event_type,
                header::AGGREGATE_TYPE => &mut aggregate_type,
                header::AGGREGATE_ID => &mut aggregate_id,
                header::AGGREGATE_SEQ => {
                    aggregate_seq = aggregate_seq.or(outbox_core::aggregate_seq::parse(value));
                    continue;
                }
                other if skip.iter().any(|s| s.eq_ignore_ascii_case(other)) => continue,
                other => {
                    own.push((other.to_owned(), value.to_owned()));
                    continue;
                }
            };
            slot.get_or_insert_with(|| value.to_owned());
        }
        if cloudevent {
            aggregate_id.get_or_insert_with(String::new);
        }
        let id = id.ok_or(MessageError::MissingHeader(header::ID))?;
        let id = Uuid::parse_str(&id).map_err(|_| MessageError::InvalidId(id))?;
        Ok(Self {
            id,
            event_type: event_type.ok_or(MessageError::MissingHeader(header::EVENT_TYPE))?,
            aggregate_type: aggregate_type
                .ok_or(MessageError::MissingHeader(header::AGGREGATE_TYPE))?,
            aggregate_id: aggregate_id.ok_or(MessageError::MissingHeader(header::AGGREGATE_ID))?,
            aggregate_seq,
            headers: own,
            payload,
        })
    }
}

/// Header names and values, borrowed from the message or made while reading it.
type Pairs<'h> = Vec<(Cow<'h, str>, Cow<'h, str>)>;

/// The attribute a CloudEvents binary-mode header carries (`ce_id`, `CE-Id` → `id`), `None`
/// for other headers.
fn ce_attribute(name: &str) -> Option<&str> {
    let prefix = name.get(..3)?;
    (prefix.eq_ignore_ascii_case("ce_") || prefix.eq_ignore_ascii_case("ce-"))
        .then(|| &name[3..])
        .filter(|attribute| !attribute.is_empty())
}

/// The headers of a binary-mode CloudEvent as contract and row headers: the attributes
/// through [`from_attributes`], `content-type` as the `datacontenttype`, other headers kept.
fn from_binary<'h>(
    headers: &[(&'h str, &'h str)],
    percent_encoded: bool,
) -> Result<Pairs<'h>, MessageError> {
    let mut attributes: Pairs<'h> = Vec::with_capacity(headers.len());
    let mut others = Vec::new();
    for &(name, value) in headers {
        if let Some(attribute) = ce_attribute(name) {
            let value = if percent_encoded {
                cloudevents::percent_decode(value).ok_or_else(|| {
                    MessageError::InvalidCloudEvent(format!(
                        "header `{name}` is not percent-encoded UTF-8"
                    ))
                })?
            } else {
                Cow::Borrowed(value)
            };
            attributes.push((Cow::Owned(attribute.to_ascii_lowercase()), value));
        } else if name.eq_ignore_ascii_case("content-type") {
            attributes.push((
                Cow::Borrowed(attribute::DATACONTENTTYPE),
                Cow::Borrowed(value),
            ));
        } else {
            others.push((Cow::Borrowed(name), Cow::Borrowed(value)));
        }
    }
    let mut out = from_attributes(attributes.iter().map(|(n, v)| (n.as_ref(), v.clone())))?;
    out.extend(others);
    Ok(out)
}

/// CloudEvents attributes as contract and row headers: `id`, `type` → `event_type`,
/// `subject` → `aggregate_id`, `aggregatetype`, `aggregateseq`, `datacontenttype` →
/// `content-type`, the pairs of `outboxheaders`, other extensions by their names;
/// `specversion`, `source` and `time` are not row headers.
fn from_attributes<'a, 'h>(
    attributes: impl IntoIterator<Item = (&'a str, Cow<'h, str>)>,
) -> Result<Pairs<'h>, MessageError> {
    let mut out = Vec::new();
    let mut overflow = Vec::new();
    for (name, value) in attributes {
        let mapped = match name {
            attribute::ID => header::ID,
            attribute::TYPE => header::EVENT_TYPE,
            attribute::SUBJECT => header::AGGREGATE_ID,
            attribute::AGGREGATETYPE => header::AGGREGATE_TYPE,
            attribute::AGGREGATESEQ => header::AGGREGATE_SEQ,
            attribute::DATACONTENTTYPE => "content-type",
            attribute::SPECVERSION | attribute::SOURCE | attribute::TIME => continue,
            attribute::OUTBOXHEADERS => {
                let pairs = cloudevents::parse_header_pairs(&value).ok_or_else(|| {
                    MessageError::InvalidCloudEvent(format!(
                        "`{}` is not a JSON array of [name, value] pairs",
                        attribute::OUTBOXHEADERS
                    ))
                })?;
                overflow.extend(
                    pairs
                        .into_iter()
                        .map(|(n, v)| (Cow::Owned(n), Cow::Owned(v))),
                );
                continue;
            }
            other => {
                out.push((Cow::Owned(other.to_owned()), value));
                continue;
            }
        };
        out.push((Cow::Borrowed(mapped), value));
    }
    out.extend(overflow);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_headers_are_parsed_and_the_rest_kept_except_skipped_ones() {
        let m = InboxMessage::from_headers(
            [
                ("id", "00000000-0000-0000-0000-000000000001"),
                ("event_type", "order.placed"),
                ("aggregate_type", "Order"),
                ("aggregate_id", "o_1"),
                ("aggregate_seq", "7"),
                ("tenant", "acme"),
                ("Nats-Msg-Id", "00000000-0000-0000-0000-000000000001"),
            ],
            &["nats-msg-id"],
            Bytes::from_static(b"{}"),
        )
        .expect("valid");
        assert_eq!(m.id, Uuid::from_u128(1));
        assert_eq!(m.aggregate_id, "o_1");
        assert_eq!(m.aggregate_seq, Some(7));
        assert_eq!(m.headers, vec![("tenant".to_owned(), "acme".to_owned())]);
    }

    /// The messages a sink makes of one event in each CloudEvents mode, read back.
    #[test]
    fn cloudevents_messages_read_back_as_the_event() {
        use outbox_core::cloudevents::{Binding, DEFAULT_SOURCE, Format, MessageFormat};
        let event = outbox_core::Event {
            id: Uuid::from_u128(7),
            position: outbox_core::Position(1),
            aggregate_type: "Order".into(),
            aggregate_id: "Zürich 1".into(),
            event_type: "order.placed".into(),
            payload: Bytes::from_static(b"{\"total\": 1250}"),
            headers: vec![
                ("traceparent".into(), "00-ab-cd-01".into()),
                ("X-Tenant".into(), "acme 100%".into()),
                ("aggregate_seq".into(), "4".into()),
            ],
            created_at: time::OffsetDateTime::now_utc(),
            attempts: 0,
        };
        let check = |m: InboxMessage, what: &str| {
            assert_eq!(m.id, event.id, "{what}");
            assert_eq!(m.event_type, "order.placed", "{what}");
            assert_eq!(m.aggregate_type, "Order", "{what}");
            assert_eq!(m.aggregate_id, "Zürich 1", "{what}");
            assert_eq!(m.aggregate_seq, Some(4), "{what}");
            assert_eq!(&m.payload[..], b"{\"total\": 1250}", "{what}");
            for (name, value) in [
                ("traceparent", "00-ab-cd-01"),
                ("X-Tenant", "acme 100%"),
                ("content-type", "application/json"),
            ] {
                assert!(
                    m.headers.contains(&(name.to_owned(), value.to_owned())),
                    "{what}: {name} in {:?}",
                    m.headers
                );
            }
        };
        let binary = MessageFormat::new(
            Format::CloudeventsBinary,
            DEFAULT_SOURCE,
            "application/json",
        )
        .expect("valid");
        for (binding, percent_encoded) in [
            (
                Binding {
                    prefix: "ce_",
                    data_content_type: Some("content-type"),
                    structured_content_type: Some("content-type"),
                    percent_encode: false,
                },
                false,
            ),
            (
                Binding {
                    prefix: "ce-",
                    data_content_type: Some("ce-datacontenttype"),
                    structured_content_type: Some("Content-Type"),
                    percent_encode: true,
                },
                true,
            ),
        ] {
            let mut headers = vec![("Nats-Msg-Id".to_owned(), "x".to_owned())];
            let encoded = binary
                .encode(&event, &binding, |n, v| {
                    headers.push((n.to_owned(), v.to_owned()))
                })
                .expect("a CloudEvent");
            let refs = headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
            let m = if percent_encoded {
                InboxMessage::from_percent_encoded_headers(refs, &["nats-msg-id"], encoded.body)
            } else {
                InboxMessage::from_headers(refs, &["nats-msg-id"], encoded.body)
            };
            check(m.expect("reads back"), binding.prefix);
        }
        let structured = MessageFormat::new(
            Format::CloudeventsStructured,
            DEFAULT_SOURCE,
            "application/json",
        )
        .expect("valid");
        let encoded = structured
            .encode(
                &event,
                &Binding {
                    prefix: "ce_",
                    data_content_type: None,
                    structured_content_type: None,
                    percent_encode: false,
                },
                |_, _| {},
            )
            .expect("a CloudEvent");
        check(
            InboxMessage::from_headers([], &[], encoded.body).expect("reads back"),
            "structured",
        );
        let not_json = InboxMessage::from_headers([], &[], Bytes::from_static(b"{\"a\":1}"));
        assert_eq!(not_json, Err(MessageError::MissingHeader("id")));
    }

    #[test]
    fn a_message_without_a_valid_id_is_refused() {
        let missing = InboxMessage::from_headers([("event_type", "x")], &[], Bytes::new());
        assert_eq!(missing, Err(MessageError::MissingHeader("id")));
        let bad = InboxMessage::from_headers([("id", "nope")], &[], Bytes::new());
        assert_eq!(bad, Err(MessageError::InvalidId("nope".to_owned())));
    }
}
