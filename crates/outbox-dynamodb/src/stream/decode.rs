//! A stream record as an outbox event: only inserts of items whose sort key starts with
//! `OUTBOX#` are events; everything else (business items, updates, deletes, TTL removals) is
//! ignored. An outbox insert that cannot be read is dead-lettered with the reason.

use std::collections::HashMap;

use aws_sdk_dynamodbstreams::types::{AttributeValue, OperationType, Record};
use bytes::Bytes;
use outbox_core::{Event, Position};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::OUTBOX_PREFIX;
use crate::producer::attr;

/// What one stream record means.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// Not an outbox insert.
    Ignored,
    /// An outbox event at position `seq` of its aggregate.
    Event { event: Event, seq: u64 },
    /// An outbox insert that cannot be published: what is known of it, and why.
    Invalid { event: Event, reason: String },
}

/// Decodes `record` of a table keyed by `partition_key`/`sort_key`.
pub(crate) fn decode(record: &Record, sort_key: &str) -> Decoded {
    if record.event_name() != Some(&OperationType::Insert) {
        return Decoded::Ignored;
    }
    let Some(image) = record.dynamodb().and_then(|d| d.new_image()) else {
        return Decoded::Ignored;
    };
    let Some(AttributeValue::S(sk)) = image.get(sort_key) else {
        return Decoded::Ignored;
    };
    let Some(id_text) = sk.strip_prefix(OUTBOX_PREFIX) else {
        return Decoded::Ignored;
    };
    let created_at = written_at(record).unwrap_or_else(OffsetDateTime::now_utc);
    let text = |name: &str| match image.get(name) {
        Some(AttributeValue::S(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(format!("attribute `{name}` is not a non-empty string (S)")),
        None => Err(format!("attribute `{name}` is missing")),
    };
    // The id from the attribute, else from the sort key, else a stand-in so the dead letter
    // can be listed.
    let id = text(attr::ID)
        .ok()
        .and_then(|s| Uuid::parse_str(&s).ok())
        .or_else(|| Uuid::parse_str(id_text).ok());
    let mut event = Event {
        id: id.unwrap_or_else(|| Uuid::new_v5(&Uuid::NAMESPACE_OID, sk.as_bytes())),
        position: Position(0),
        aggregate_type: text(attr::AGGREGATE_TYPE).unwrap_or_default(),
        aggregate_id: text(attr::AGGREGATE_ID).unwrap_or_default(),
        event_type: text(attr::EVENT_TYPE).unwrap_or_default(),
        payload: Bytes::new(),
        headers: Vec::new(),
        created_at,
        attempts: 0,
    };
    match read(image, &mut event) {
        Ok(_) if id.is_none() => Decoded::Invalid {
            event,
            reason: format!("the event id (attribute `id` or sort key `{sk}`) is not a UUID"),
        },
        Ok(seq) => Decoded::Event { event, seq },
        Err(reason) => Decoded::Invalid {
            event,
            reason: format!("outbox item `{sk}`: {reason}"),
        },
    }
}

/// Fills the event from the image; returns its `seq`.
fn read(image: &HashMap<String, AttributeValue>, event: &mut Event) -> Result<u64, String> {
    for (name, value) in [
        (attr::AGGREGATE_TYPE, &event.aggregate_type),
        (attr::AGGREGATE_ID, &event.aggregate_id),
        (attr::EVENT_TYPE, &event.event_type),
    ] {
        if value.is_empty() {
            return Err(match image.get(name) {
                None => format!("attribute `{name}` is missing"),
                Some(_) => format!("attribute `{name}` is not a non-empty string (S)"),
            });
        }
    }
    event.payload = match image.get(attr::PAYLOAD) {
        Some(AttributeValue::B(b)) => Bytes::copy_from_slice(b.as_ref()),
        Some(AttributeValue::S(s)) => Bytes::from(s.clone().into_bytes()),
        Some(_) => return Err("attribute `payload` is neither binary (B) nor a string (S)".into()),
        None => return Err("attribute `payload` is missing".into()),
    };
    if let Some(headers) = image.get(attr::HEADERS) {
        let AttributeValue::M(map) = headers else {
            return Err("attribute `headers` is not a map (M) of strings".into());
        };
        let mut out = Vec::with_capacity(map.len());
        for (k, v) in map {
            match v {
                AttributeValue::S(s) => out.push((k.clone(), s.clone())),
                _ => return Err(format!("header `{k}` is not a string (S)")),
            }
        }
        out.sort();
        event.headers = out;
    }
    match image.get(attr::SEQ) {
        Some(AttributeValue::N(n)) => match n.parse::<u64>() {
            Ok(seq) if seq > 0 => Ok(seq),
            _ => Err(format!(
                "attribute `seq` is `{n}`, not a position 1, 2, 3, …"
            )),
        },
        Some(_) => Err("attribute `seq` is not a number (N)".into()),
        None => Err("attribute `seq` is missing".into()),
    }
}

/// When the record's change was made (`ApproximateCreationDateTime`, to the precision the
/// stream gives).
pub(super) fn written_at(record: &Record) -> Option<OffsetDateTime> {
    let t = record.dynamodb()?.approximate_creation_date_time()?;
    let at = OffsetDateTime::from_unix_timestamp(t.secs()).ok()?;
    Some(at + time::Duration::nanoseconds(i64::from(t.subsec_nanos())))
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodbstreams::primitives::Blob;
    use aws_sdk_dynamodbstreams::types::StreamRecord;

    use super::*;

    fn record(op: OperationType, image: Vec<(&str, AttributeValue)>) -> Record {
        let image: HashMap<String, AttributeValue> =
            image.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        Record::builder()
            .event_name(op)
            .dynamodb(StreamRecord::builder().set_new_image(Some(image)).build())
            .build()
    }

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn outbox_image(id: Uuid) -> Vec<(&'static str, AttributeValue)> {
        vec![
            ("pk", s("ORDER#1")),
            ("sk", s(&format!("OUTBOX#{id}"))),
            ("id", s(&id.to_string())),
            ("aggregate_type", s("Order")),
            ("aggregate_id", s("o_1")),
            ("event_type", s("order.paid")),
            ("payload", AttributeValue::B(Blob::new(vec![0u8, 255, 1]))),
            (
                "headers",
                AttributeValue::M([("h".to_owned(), s("v"))].into_iter().collect()),
            ),
            ("seq", AttributeValue::N("3".into())),
        ]
    }

    #[test]
    fn an_outbox_insert_is_an_event_with_its_exact_payload_and_seq() {
        let id = Uuid::now_v7();
        match decode(&record(OperationType::Insert, outbox_image(id)), "sk") {
            Decoded::Event { event, seq } => {
                assert_eq!(event.id, id);
                assert_eq!(seq, 3);
                assert_eq!(&event.payload[..], &[0u8, 255, 1]);
                assert_eq!(event.headers, vec![("h".to_owned(), "v".to_owned())]);
                assert_eq!(event.aggregate_id, "o_1");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn business_items_updates_and_removals_are_ignored() {
        let id = Uuid::now_v7();
        for op in [OperationType::Modify, OperationType::Remove] {
            assert!(matches!(
                decode(&record(op, outbox_image(id)), "sk"),
                Decoded::Ignored
            ));
        }
        let business = vec![
            ("pk", s("ORDER#1")),
            ("sk", s("ORDER")),
            ("version", AttributeValue::N("2".into())),
        ];
        assert!(matches!(
            decode(&record(OperationType::Insert, business), "sk"),
            Decoded::Ignored
        ));
    }

    #[test]
    fn a_broken_outbox_item_is_invalid_with_the_reason() {
        let id = Uuid::now_v7();
        let mut image = outbox_image(id);
        image.retain(|(k, _)| *k != "seq");
        match decode(&record(OperationType::Insert, image), "sk") {
            Decoded::Invalid { event, reason } => {
                assert_eq!(event.id, id);
                assert!(reason.contains("`seq` is missing"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let mut image = outbox_image(id);
        image.retain(|(k, _)| *k != "aggregate_id");
        match decode(&record(OperationType::Insert, image), "sk") {
            Decoded::Invalid { reason, .. } => assert!(reason.contains("aggregate_id"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}
