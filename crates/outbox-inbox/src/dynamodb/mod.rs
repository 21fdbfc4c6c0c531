//! [`DynamoDbInbox`]: the inbox on DynamoDB (feature `dynamodb`). The dedup item is put
//! with `attribute_not_exists` in the handler's own `TransactWriteItems`, so the side effect
//! and the dedup record commit together or not at all (`docs/inbox.md`, "DynamoDB").
//!
//! Item layout (the table's partition and sort keys are both strings; their attribute names
//! are configurable, `pk` and `sk` by default):
//!
//! | item | partition key | sort key | attributes |
//! | --- | --- | --- | --- |
//! | dedup record | `inbox#<consumer>#<event id>` | `processed` | `consumer`, `event_id`, `processed_at` (N, Unix s), `expires_at` (N, Unix s: TTL) |
//! | applied position | `inbox#<consumer>#<aggregate type>#<aggregate id>` | `position` | `consumer`, `aggregate_type`, `aggregate_id`, `applied_seq` (N) |
//!
//! Every dedup record has its own partition key: one consumer's writes spread over the
//! table's partitions instead of meeting DynamoDB's per-partition-key limit (1,000 write
//! units per second). `%` and `#` inside a name are written `%25` and `%23`, so no two
//! names share a key.

mod error;
mod migrate;
mod transaction;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::AttributeValue;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use uuid::Uuid;

pub use error::DynamoDbInboxError;
pub use migrate::DynamoDbMigrateReport;
pub use transaction::InboxTransaction;

use crate::lane::{ConsumerOrder, OrderGate};
use crate::{InboxError, InboxMessage};

/// Most actions in one `TransactWriteItems` (DynamoDB's limit): the dedup record takes one,
/// the applied position one more for a message with `aggregate_seq`; the handler gets the
/// rest (99, or 98).
pub const MAX_TRANSACT_ITEMS: usize = 100;

/// How long a dedup record is kept by default (its `expires_at`): 7 days.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// DynamoDB's longest partition key value, in bytes.
const MAX_PARTITION_KEY_BYTES: usize = 2048;

/// Sort key of a dedup record.
pub const PROCESSED_SK: &str = "processed";
/// Sort key of an applied position.
pub const POSITION_SK: &str = "position";

/// The attribute names of the inbox items (besides the table's two keys).
pub mod attr {
    /// The consumer's name (S).
    pub const CONSUMER: &str = "consumer";
    /// The event id, hyphenated (S).
    pub const EVENT_ID: &str = "event_id";
    /// When the record was written, Unix seconds (N).
    pub const PROCESSED_AT: &str = "processed_at";
    /// Default TTL attribute: `processed_at` + the inbox's keep, Unix seconds (N).
    pub const EXPIRES_AT: &str = "expires_at";
    /// Aggregate type of an applied position (S).
    pub const AGGREGATE_TYPE: &str = "aggregate_type";
    /// Aggregate id of an applied position (S).
    pub const AGGREGATE_ID: &str = "aggregate_id";
    /// The highest applied (or passed) position of the aggregate (N).
    pub const APPLIED_SEQ: &str = "applied_seq";
}

/// The inbox on one DynamoDB table: a dedicated one that [`migrate`](Self::migrate)
/// creates, or the application's single table (string partition and sort keys). Cheap to
/// clone; create it once.
///
/// ```no_run
/// # async fn example(client: aws_sdk_dynamodb::Client, message: outbox_inbox::InboxMessage)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
/// use outbox_inbox::{DynamoDbInbox, Outcome};
///
/// let inbox = DynamoDbInbox::new(client, "processed_events");
/// inbox.migrate().await?;
///
/// let points = Update::builder()
///     .table_name("app")
///     .key("pk", AttributeValue::S("CUSTOMER#c1".into()))
///     .key("sk", AttributeValue::S("POINTS".into()))
///     .update_expression("ADD #n :ten")
///     .expression_attribute_names("#n", "n")
///     .expression_attribute_values(":ten", AttributeValue::N("10".into()))
///     .build()?;
/// let mut tx = inbox.transaction("loyalty", &message)?;
/// tx.push(TransactWriteItem::builder().update(points).build())?;
/// match tx.commit().await? {
///     Outcome::Processed(()) => {} // points added and the event recorded, together
///     Outcome::Duplicate => {}     // processed before: nothing written
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoDbInbox {
    client: Client,
    table: String,
    partition_key: String,
    sort_key: String,
    ttl_attribute: String,
    keep: Duration,
}

impl DynamoDbInbox {
    /// The inbox on `table`, with keys `pk` and `sk`, records kept for [`DEFAULT_KEEP`]
    /// (attribute `expires_at`).
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            partition_key: "pk".to_owned(),
            sort_key: "sk".to_owned(),
            ttl_attribute: attr::EXPIRES_AT.to_owned(),
            keep: DEFAULT_KEEP,
        }
    }

    /// The names of the table's partition and sort key attributes (both type S): for the
    /// application's single table.
    #[must_use]
    pub fn keys(mut self, partition_key: impl Into<String>, sort_key: impl Into<String>) -> Self {
        self.partition_key = partition_key.into();
        self.sort_key = sort_key.into();
        self
    }

    /// The attribute the table's TTL reads (a table has one): `expires_at` by default; set
    /// the single table's own (e.g. the outbox items' `ttl`) when the inbox shares it.
    #[must_use]
    pub fn ttl_attribute(mut self, name: impl Into<String>) -> Self {
        self.ttl_attribute = name.into();
        self
    }

    /// How long a dedup record is kept: its TTL attribute is the write time plus `keep`.
    /// Keep it well above the broker's redelivery window (see `purge_older_than`).
    #[must_use]
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The client the inbox uses.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A transaction recording `message` as processed by `consumer`, and its delivery
    /// position when it has one (for the order gate; see
    /// [`order_gate`](Self::order_gate)). Add the side effect's items, then
    /// [`commit`](InboxTransaction::commit). Nothing is sent before `commit`.
    pub fn transaction(
        &self,
        consumer: &str,
        message: &InboxMessage,
    ) -> Result<InboxTransaction, DynamoDbInboxError> {
        let position = match message.aggregate_seq {
            Some(seq) => Some(Position {
                key: self.position_key(consumer, &message.aggregate_type, &message.aggregate_id)?,
                aggregate_type: message.aggregate_type.clone(),
                aggregate_id: message.aggregate_id.clone(),
                seq,
            }),
            None => None,
        };
        InboxTransaction::new(self.clone(), consumer, message.id, position)
    }

    /// A transaction recording `event_id` as processed by `consumer`, without a position.
    pub fn transaction_for_id(
        &self,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxTransaction, DynamoDbInboxError> {
        InboxTransaction::new(self.clone(), consumer, event_id, None)
    }

    /// Whether `consumer` has processed `event_id` (a strongly consistent read). For
    /// inspection, or to skip expensive preparation of a likely duplicate, **not** as a dedup
    /// gate: only the dedup record in the side effect's transaction deduplicates.
    pub async fn contains(
        &self,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, DynamoDbInboxError> {
        let item = self
            .get(self.processed_key(consumer, event_id)?, PROCESSED_SK)
            .await?;
        Ok(item.is_some())
    }

    /// The highest delivery position of an aggregate that `consumer` applied; 0 when none.
    pub async fn applied_position(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<u64, DynamoDbInboxError> {
        let key = self.position_key(consumer, aggregate_type, aggregate_id)?;
        let item = self.get(key, POSITION_SK).await?;
        Ok(item
            .as_ref()
            .and_then(|i| i.get(attr::APPLIED_SEQ))
            .and_then(|v| v.as_n().ok())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// Records that `consumer` applied (or deliberately passed) position `seq` of an
    /// aggregate, on its own (not in a transaction). Never moves back.
    pub async fn advance(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        seq: u64,
    ) -> Result<(), DynamoDbInboxError> {
        let position = Position {
            key: self.position_key(consumer, aggregate_type, aggregate_id)?,
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            seq,
        };
        let update = self.position_update(consumer, &position);
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(update.key))
            .set_update_expression(Some(update.update_expression))
            .set_condition_expression(update.condition_expression)
            .set_expression_attribute_names(update.expression_attribute_names)
            .set_expression_attribute_values(update.expression_attribute_values)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // Already at or past `seq`.
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(()),
            Err(e) => Err(DynamoDbInboxError::call(
                "update an applied position",
                &self.table,
                e,
            )),
        }
    }

    /// The order gate of a consumer loop whose handler records through this inbox with
    /// [`transaction`](Self::transaction) as `consumer`: pass it to the loop's `ordered`
    /// setting.
    pub fn order_gate(&self, consumer: impl Into<String>) -> ConsumerOrder {
        ConsumerOrder::new(self.gate(consumer))
    }

    /// The [`OrderGate`] behind [`order_gate`](Self::order_gate), for a loop of your own.
    pub fn gate(&self, consumer: impl Into<String>) -> DynamoDbOrderGate {
        DynamoDbOrderGate {
            inbox: self.clone(),
            consumer: consumer.into(),
        }
    }

    /// Deletes the dedup records of every consumer written more than `age` ago; returns how
    /// many. DynamoDB's TTL deletes expired records by itself, but lazily (typically within
    /// days of expiry); this is for a table without TTL, or to reclaim space at once. It
    /// scans the whole table (read capacity for every item of a shared table): prefer TTL.
    ///
    /// Keep `age` well above the broker's redelivery window: an id purged before its last
    /// redelivery is processed again.
    pub async fn purge_older_than(&self, age: Duration) -> Result<u64, DynamoDbInboxError> {
        self.purge_before(SystemTime::now() - age).await
    }

    /// Deletes the dedup records written before `cutoff` (the clock as a parameter); returns
    /// how many. Each delete is conditional on `processed_at`, so a record written again
    /// meanwhile stays.
    pub async fn purge_before(&self, cutoff: SystemTime) -> Result<u64, DynamoDbInboxError> {
        let cutoff = AttributeValue::N(unix_seconds(cutoff).to_string());
        let mut total = 0;
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .filter_expression("begins_with(#pk, :prefix) AND #sk = :sk AND #at < :cutoff")
                .projection_expression("#pk, #sk")
                .expression_attribute_names("#pk", &self.partition_key)
                .expression_attribute_names("#sk", &self.sort_key)
                .expression_attribute_names("#at", attr::PROCESSED_AT)
                .expression_attribute_values(":prefix", AttributeValue::S(KEY_PREFIX.to_owned()))
                .expression_attribute_values(":sk", AttributeValue::S(PROCESSED_SK.to_owned()))
                .expression_attribute_values(":cutoff", cutoff.clone())
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| DynamoDbInboxError::call("scan for old records", &self.table, e))?;
            let deletes = futures::stream::iter(page.items().iter().cloned())
                .map(|key| self.delete_if_before(key, &cutoff))
                .buffer_unordered(PURGE_CONCURRENCY)
                .collect::<Vec<_>>()
                .await;
            for deleted in deletes {
                total += u64::from(deleted?);
            }
            match page.last_evaluated_key() {
                Some(key) if !key.is_empty() => start = Some(key.clone()),
                _ => return Ok(total),
            }
        }
    }

    async fn delete_if_before(
        &self,
        key: HashMap<String, AttributeValue>,
        cutoff: &AttributeValue,
    ) -> Result<bool, DynamoDbInboxError> {
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key))
            .condition_expression("#at < :cutoff")
            .expression_attribute_names("#at", attr::PROCESSED_AT)
            .expression_attribute_values(":cutoff", cutoff.clone())
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
            Err(e) => Err(DynamoDbInboxError::call(
                "delete an old record",
                &self.table,
                e,
            )),
        }
    }

    async fn get(
        &self,
        partition: String,
        sort: &str,
    ) -> Result<Option<HashMap<String, AttributeValue>>, DynamoDbInboxError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(&self.partition_key, AttributeValue::S(partition))
            .key(&self.sort_key, AttributeValue::S(sort.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| DynamoDbInboxError::call("read an inbox item", &self.table, e))?;
        Ok(out.item)
    }

    /// `inbox#<consumer>#<event id>`.
    fn processed_key(&self, consumer: &str, event_id: Uuid) -> Result<String, DynamoDbInboxError> {
        checked_key(format!(
            "{KEY_PREFIX}{}#{}",
            escape(nonempty_consumer(consumer)?),
            event_id.hyphenated()
        ))
    }

    /// `inbox#<consumer>#<aggregate type>#<aggregate id>`.
    fn position_key(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<String, DynamoDbInboxError> {
        checked_key(format!(
            "{KEY_PREFIX}{}#{}#{}",
            escape(nonempty_consumer(consumer)?),
            escape(aggregate_type),
            escape(aggregate_id)
        ))
    }

    /// The conditional update that moves a position forward (never back): it fails its
    /// condition when the stored position is already at or past `seq`.
    fn position_update(
        &self,
        consumer: &str,
        position: &Position,
    ) -> aws_sdk_dynamodb::types::Update {
        let s = |v: &str| AttributeValue::S(v.to_owned());
        aws_sdk_dynamodb::types::Update::builder()
            .table_name(&self.table)
            .key(&self.partition_key, s(&position.key))
            .key(&self.sort_key, s(POSITION_SK))
            .update_expression("SET #seq = :seq, #c = :c, #at = :at, #ai = :ai")
            .condition_expression("attribute_not_exists(#seq) OR #seq < :seq")
            .expression_attribute_names("#seq", attr::APPLIED_SEQ)
            .expression_attribute_names("#c", attr::CONSUMER)
            .expression_attribute_names("#at", attr::AGGREGATE_TYPE)
            .expression_attribute_names("#ai", attr::AGGREGATE_ID)
            .expression_attribute_values(":seq", AttributeValue::N(position.seq.to_string()))
            .expression_attribute_values(":c", s(consumer))
            .expression_attribute_values(":at", s(&position.aggregate_type))
            .expression_attribute_values(":ai", s(&position.aggregate_id))
            .build()
            .expect("table name, key and update expression are set")
    }
}

/// Prefix of every inbox item's partition key.
const KEY_PREFIX: &str = "inbox#";

/// Old records deleted at once by `purge_before`.
const PURGE_CONCURRENCY: usize = 16;

/// A message's delivery position, to record with its dedup record.
#[derive(Debug, Clone)]
pub(crate) struct Position {
    key: String,
    aggregate_type: String,
    aggregate_id: String,
    seq: u64,
}

/// `%` → `%25`, `#` → `%23`: names joined by `#` stay apart.
fn escape(name: &str) -> String {
    name.replace('%', "%25").replace('#', "%23")
}

fn nonempty_consumer(consumer: &str) -> Result<&str, DynamoDbInboxError> {
    if consumer.is_empty() {
        return Err(DynamoDbInboxError::Invalid(
            "the consumer name is empty".to_owned(),
        ));
    }
    Ok(consumer)
}

fn checked_key(key: String) -> Result<String, DynamoDbInboxError> {
    if key.len() > MAX_PARTITION_KEY_BYTES {
        return Err(DynamoDbInboxError::Invalid(format!(
            "the inbox key is {} bytes, DynamoDB's limit for a partition key is {MAX_PARTITION_KEY_BYTES} \
             (a shorter consumer name, aggregate type or aggregate id)",
            key.len()
        )));
    }
    Ok(key)
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The order gate over one DynamoDB inbox, for one consumer: reads the applied position
/// (strongly consistent), and records a passed one with a conditional update.
#[derive(Debug, Clone)]
pub struct DynamoDbOrderGate {
    inbox: DynamoDbInbox,
    consumer: String,
}

/// The gate's errors travel in [`InboxError`], whose database error is sqlx's: a DynamoDB
/// error is carried as its I/O error (the message and the source are kept).
fn gate_error(e: DynamoDbInboxError) -> InboxError {
    InboxError::Database(sqlx::Error::Io(std::io::Error::other(e)))
}

impl OrderGate for DynamoDbOrderGate {
    fn applied<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, InboxError>> {
        Box::pin(async move {
            self.inbox
                .applied_position(&self.consumer, aggregate_type, aggregate_id)
                .await
                .map_err(gate_error)
        })
    }

    fn pass<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<(), InboxError>> {
        Box::pin(async move {
            self.inbox
                .advance(&self.consumer, aggregate_type, aggregate_id, seq)
                .await
                .map_err(gate_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbox() -> DynamoDbInbox {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        DynamoDbInbox::new(Client::from_conf(config), "t")
    }

    #[test]
    fn keys_escape_the_separator_so_no_two_names_share_one() {
        let i = inbox();
        let id = Uuid::from_u128(1);
        assert_eq!(
            i.processed_key("loyalty", id).expect("valid"),
            "inbox#loyalty#00000000-0000-0000-0000-000000000001"
        );
        assert_ne!(
            i.position_key("a#b", "c", "d").expect("valid"),
            i.position_key("a", "b#c", "d").expect("valid")
        );
        assert_eq!(
            i.position_key("a#b", "50%", "o#1").expect("valid"),
            "inbox#a%23b#50%25#o%231"
        );
    }

    #[test]
    fn empty_consumers_and_overlong_keys_are_refused() {
        let i = inbox();
        assert!(matches!(
            i.processed_key("", Uuid::nil()),
            Err(DynamoDbInboxError::Invalid(_))
        ));
        let long = "x".repeat(MAX_PARTITION_KEY_BYTES);
        assert!(matches!(
            i.position_key("c", "Order", &long),
            Err(DynamoDbInboxError::Invalid(_))
        ));
    }
}
