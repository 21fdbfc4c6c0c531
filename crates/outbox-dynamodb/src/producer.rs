//! The producer side: an event as the outbox item of a single-table design, for the caller's
//! own `TransactWriteItems` (`docs/contract.md`, "DynamoDB (the outbox item)").
//!
//! The item shares the aggregate's partition key, so one aggregate's events normally follow
//! one stream-shard lineage; its sort key is `OUTBOX#<event id>` (a UUIDv7: time-sortable).
//! `seq` is the aggregate's position 1, 2, 3, … with no gaps: draw it from the aggregate's
//! own optimistic-lock version, which the same transaction checks and bumps. Then two writers
//! of one aggregate can never both commit the same `seq`, and a transaction whose condition
//! fails writes neither the business item nor the event.
//!
//! ```no_run
//! use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
//! use outbox_core::NewEvent;
//! use outbox_dynamodb::{DynamoDbConfig, DynamoOutbox};
//!
//! # async fn place(client: aws_sdk_dynamodb::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let outbox = DynamoOutbox::new(&DynamoDbConfig::new("app"))?;
//! let pk = AttributeValue::S("ORDER#o_91f2".into());
//! let version = 3; // read with the order
//! let order = Update::builder()
//!     .table_name("app")
//!     .key("pk", pk.clone())
//!     .key("sk", AttributeValue::S("ORDER".into()))
//!     .update_expression("SET #st = :st, #v = :next")
//!     .condition_expression("#v = :v")
//!     .expression_attribute_names("#st", "status")
//!     .expression_attribute_names("#v", "version")
//!     .expression_attribute_values(":st", AttributeValue::S("paid".into()))
//!     .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
//!     .expression_attribute_values(":next", AttributeValue::N((version + 1).to_string()))
//!     .build()?;
//! let event = NewEvent::new("Order", "o_91f2", "order.paid", r#"{"order_id":"o_91f2"}"#);
//! let write = outbox.put(pk, &event, version + 1)?;
//! client
//!     .transact_write_items()
//!     .transact_items(TransactWriteItem::builder().update(order).build())
//!     .transact_items(write.into_transact_item()?)
//!     .send()
//!     .await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use outbox_core::NewEvent;
use uuid::Uuid;

use crate::config::{DynamoDbConfig, OUTBOX_PREFIX};
use crate::error::{ConfigError, DynamoError};

/// DynamoDB's largest item (400 KB, names and values together).
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// The attribute names of an outbox item (besides the table's two keys).
pub mod attr {
    /// The event id (S).
    pub const ID: &str = "id";
    /// `aggregate_type` (S).
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// `aggregate_id` (S): the relay reads it here, never from the key.
    pub const AGGREGATE_ID: &str = "aggregate_id";
    /// `event_type` (S).
    pub const EVENT_TYPE: &str = "event_type";
    /// The payload: B (exact bytes), or S for text written by other producers.
    pub const PAYLOAD: &str = "payload";
    /// Extra message headers (M of S), optional.
    pub const HEADERS: &str = "headers";
    /// The aggregate's position 1, 2, 3, … (N).
    pub const SEQ: &str = "seq";
    /// Expiry for DynamoDB's TTL, in Unix seconds (N), optional.
    pub const TTL: &str = "ttl";
    /// When the producer wrote it, RFC 3339 (S), optional.
    pub const CREATED_AT: &str = "created_at";
}

/// Writes events as outbox items of one table.
#[derive(Debug, Clone)]
pub struct DynamoOutbox {
    table: String,
    partition_key: String,
    sort_key: String,
}

/// One event as an outbox item, ready to join a `TransactWriteItems`.
#[derive(Debug, Clone)]
pub struct OutboxWrite {
    /// The event id (the given one, or a new UUIDv7).
    pub id: Uuid,
    table: String,
    sort_key: String,
    item: HashMap<String, AttributeValue>,
}

impl DynamoOutbox {
    /// A producer for `config`'s table and key names.
    pub fn new(config: &DynamoDbConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            table: config.table.clone(),
            partition_key: config.partition_key.clone(),
            sort_key: config.sort_key.clone(),
        })
    }

    /// The outbox item of `event` at position `seq` (1, 2, 3, … per aggregate) under the
    /// aggregate's partition key value `partition`. Refused: an empty aggregate or event
    /// type, `seq` 0, or an item over DynamoDB's 400 KB.
    pub fn put(
        &self,
        partition: AttributeValue,
        event: &NewEvent,
        seq: u64,
    ) -> Result<OutboxWrite, DynamoError> {
        let id = event.id.unwrap_or_else(Uuid::now_v7);
        let problem = |problem: String| DynamoError::Event { id, problem };
        for (name, value) in [
            ("aggregate_type", &event.aggregate_type),
            ("aggregate_id", &event.aggregate_id),
            ("event_type", &event.event_type),
        ] {
            if value.is_empty() {
                return Err(problem(format!("`{name}` is empty")));
            }
        }
        if seq == 0 {
            return Err(problem(
                "`seq` starts at 1 (the aggregate's first event)".to_owned(),
            ));
        }
        if let Some((name, _)) = event.headers.iter().find(|(name, _)| name.is_empty()) {
            return Err(problem(format!("a header has an empty name (`{name}`)")));
        }
        let s = |v: &str| AttributeValue::S(v.to_owned());
        let mut item = HashMap::with_capacity(10);
        item.insert(self.partition_key.clone(), partition);
        item.insert(self.sort_key.clone(), s(&format!("{OUTBOX_PREFIX}{id}")));
        item.insert(attr::ID.to_owned(), s(&id.to_string()));
        item.insert(attr::AGGREGATE_TYPE.to_owned(), s(&event.aggregate_type));
        item.insert(attr::AGGREGATE_ID.to_owned(), s(&event.aggregate_id));
        item.insert(attr::EVENT_TYPE.to_owned(), s(&event.event_type));
        item.insert(
            attr::PAYLOAD.to_owned(),
            AttributeValue::B(Blob::new(event.payload.to_vec())),
        );
        item.insert(attr::SEQ.to_owned(), AttributeValue::N(seq.to_string()));
        let now = time_now_rfc3339();
        item.insert(attr::CREATED_AT.to_owned(), s(&now));
        if !event.headers.is_empty() {
            let headers = event
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), s(v)))
                .collect();
            item.insert(attr::HEADERS.to_owned(), AttributeValue::M(headers));
        }
        let size = item_size(&item);
        if size > MAX_ITEM_BYTES {
            return Err(problem(format!(
                "the outbox item is {size} bytes; DynamoDB's limit is 400 KB ({MAX_ITEM_BYTES} bytes; store a large payload elsewhere and send a reference)"
            )));
        }
        Ok(OutboxWrite {
            id,
            table: self.table.clone(),
            sort_key: self.sort_key.clone(),
            item,
        })
    }
}

impl OutboxWrite {
    /// Lets DynamoDB's TTL remove the item after `expires` (enable TTL on the attribute
    /// `ttl`). The relay ignores TTL removals; an item must outlive its delivery.
    pub fn with_ttl(mut self, expires: SystemTime) -> Self {
        let secs = expires
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.item
            .insert(attr::TTL.to_owned(), AttributeValue::N(secs.to_string()));
        self
    }

    /// The item's attributes.
    pub fn item(&self) -> &HashMap<String, AttributeValue> {
        &self.item
    }

    /// The `Put`, conditioned on no item with this key existing (an id is never written
    /// twice; a repeated transaction fails instead of rewriting the event).
    pub fn into_put(self) -> Result<Put, DynamoError> {
        let id = self.id;
        Put::builder()
            .table_name(self.table)
            .set_item(Some(self.item))
            .condition_expression("attribute_not_exists(#outbox_sk)")
            .expression_attribute_names("#outbox_sk", self.sort_key)
            .build()
            .map_err(|e| DynamoError::Event {
                id,
                problem: format!("building the Put: {e}"),
            })
    }

    /// [`OutboxWrite::into_put`] as an item of `TransactWriteItems`.
    pub fn into_transact_item(self) -> Result<TransactWriteItem, DynamoError> {
        Ok(TransactWriteItem::builder().put(self.into_put()?).build())
    }
}

fn time_now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// An item's size as DynamoDB counts it (close enough to refuse what it would refuse):
/// attribute names plus values.
fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::M(m) => {
                3 + m.iter().map(|(k, v)| k.len() + value(v) + 1).sum::<usize>()
            }
            AttributeValue::L(l) => 3 + l.iter().map(|v| value(v) + 1).sum::<usize>(),
            _ => 1,
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox() -> DynamoOutbox {
        DynamoOutbox::new(&DynamoDbConfig::new("app")).expect("valid")
    }

    #[test]
    fn the_item_has_the_documented_layout_and_the_exact_payload_bytes() {
        let payload: &[u8] = &[0, 159, 146, 150, b'{'];
        let event = NewEvent::new("Order", "o_1", "order.paid", payload.to_vec())
            .with_header("traceparent", "00-abc-def-01");
        let w = outbox()
            .put(AttributeValue::S("ORDER#o_1".into()), &event, 7)
            .expect("valid");
        let item = w.item();
        assert_eq!(item["pk"], AttributeValue::S("ORDER#o_1".into()));
        assert_eq!(item["sk"], AttributeValue::S(format!("OUTBOX#{}", w.id)));
        assert_eq!(item["id"], AttributeValue::S(w.id.to_string()));
        assert_eq!(w.id.get_version_num(), 7, "a UUIDv7 id");
        assert_eq!(item["seq"], AttributeValue::N("7".into()));
        assert_eq!(
            item["payload"],
            AttributeValue::B(Blob::new(payload.to_vec()))
        );
        let AttributeValue::M(headers) = &item["headers"] else {
            panic!("headers are a map: {:?}", item["headers"]);
        };
        assert_eq!(
            headers["traceparent"],
            AttributeValue::S("00-abc-def-01".into())
        );
        assert!(!item.contains_key("ttl"));
        let created = match &item["created_at"] {
            AttributeValue::S(s) => s.clone(),
            other => panic!("{other:?}"),
        };
        assert!(
            time::OffsetDateTime::parse(&created, &time::format_description::well_known::Rfc3339)
                .is_ok(),
            "{created}"
        );
        let expires = UNIX_EPOCH + std::time::Duration::from_secs(1_900_000_000);
        let w = w.with_ttl(expires);
        assert_eq!(w.item()["ttl"], AttributeValue::N("1900000000".into()));
    }

    #[test]
    fn bad_events_are_refused_with_the_reason() {
        let pk = || AttributeValue::S("p".into());
        let ok = NewEvent::new("Order", "o_1", "order.paid", "{}");
        let e = outbox().put(pk(), &ok, 0).expect_err("seq 0");
        assert!(e.to_string().contains("seq"), "{e}");
        let empty = NewEvent::new("Order", "", "order.paid", "{}");
        let e = outbox()
            .put(pk(), &empty, 1)
            .expect_err("empty aggregate id");
        assert!(e.to_string().contains("aggregate_id"), "{e}");
        let big = NewEvent::new("Order", "o", "t", vec![b'x'; MAX_ITEM_BYTES]);
        let e = outbox().put(pk(), &big, 1).expect_err("too big");
        assert!(e.to_string().contains("400"), "{e}");
    }
}
