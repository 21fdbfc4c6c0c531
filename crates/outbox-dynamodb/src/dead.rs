//! `outbox dead` for DynamoDB: dead letters are `dead#<id>` items of the lease table (written
//! by the relay), and an aggregate that has any is marked `held#<type><US><id>`. List, show
//! and purge work (purging an aggregate's last dead letter removes its mark, and the relay
//! lets its events flow again); retry does not yet (see `docs/dynamodb.md`).

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use outbox_core::SourceError;
use outbox_core::admin::{DeadLetter, RetrySelection, StoredEventDetail};
use outbox_core::backend::DeadLetterStore;
use outbox_core::sink::BoxFuture;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::migrate::LEASE_KEY;

/// The dead letters of one outbox.
#[derive(Debug, Clone)]
pub struct DynamoDeadLetters {
    client: Client,
    table: String,
}

type Item = HashMap<String, AttributeValue>;

fn text(item: &Item, k: &str) -> String {
    item.get(k)
        .and_then(|v| v.as_s().ok())
        .cloned()
        .unwrap_or_default()
}

fn number(item: &Item, k: &str) -> Option<i64> {
    item.get(k)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

fn at(item: &Item, k: &str) -> Option<OffsetDateTime> {
    number(item, k).and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
}

fn summary(item: &Item) -> Option<DeadLetter> {
    Some(DeadLetter {
        id: Uuid::parse_str(&text(item, "id")).ok()?,
        aggregate_type: text(item, "aggregate_type"),
        aggregate_id: text(item, "aggregate_id"),
        event_type: text(item, "event_type"),
        attempts: number(item, "attempts").unwrap_or(0) as i32,
        reason: Some(text(item, "reason")),
        created_at: at(item, "created_at").unwrap_or(OffsetDateTime::UNIX_EPOCH),
        dead_lettered_at: at(item, "dead_lettered_at"),
    })
}

impl DynamoDeadLetters {
    /// The dead letters kept in `lease_table`.
    pub fn new(client: Client, lease_table: String) -> Self {
        Self {
            client,
            table: lease_table,
        }
    }

    fn err<E>(&self, doing: &str, e: E) -> SourceError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        SourceError::unavailable(format!(
            "{doing} (lease table `{}`) failed: {}",
            self.table,
            outbox_core::relay::ErrorChain(&e)
        ))
    }

    /// Every dead-letter item.
    async fn all(&self) -> Result<Vec<Item>, SourceError> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&self.table)
                .filter_expression("begins_with(#k, :dead)")
                .expression_attribute_names("#k", LEASE_KEY)
                .expression_attribute_values(":dead", AttributeValue::S("dead#".into()))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.err("reading dead letters", e))?;
            out.extend(page.items().iter().cloned());
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }
}

impl DeadLetterStore for DynamoDeadLetters {
    fn list<'a>(
        &'a self,
        event_type: Option<&'a str>,
        aggregate_id: Option<&'a str>,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, SourceError>> {
        Box::pin(async move {
            let mut found: Vec<(i64, DeadLetter)> = self
                .all()
                .await?
                .iter()
                .filter_map(|item| Some((number(item, "seq").unwrap_or(0), summary(item)?)))
                .filter(|(_, d)| event_type.is_none_or(|t| d.event_type == t))
                .filter(|(_, d)| aggregate_id.is_none_or(|a| d.aggregate_id == a))
                .collect();
            // Oldest first, each aggregate in its own order.
            found.sort_by(|a, b| {
                (
                    a.1.dead_lettered_at,
                    &a.1.aggregate_type,
                    &a.1.aggregate_id,
                    a.0,
                )
                    .cmp(&(
                        b.1.dead_lettered_at,
                        &b.1.aggregate_type,
                        &b.1.aggregate_id,
                        b.0,
                    ))
            });
            Ok(found
                .into_iter()
                .map(|(_, d)| d)
                .take(limit.max(0) as usize)
                .collect())
        })
    }

    fn show(&self, id: Uuid) -> BoxFuture<'_, Result<Option<StoredEventDetail>, SourceError>> {
        Box::pin(async move {
            let out = self
                .client
                .get_item()
                .table_name(&self.table)
                .key(LEASE_KEY, AttributeValue::S(format!("dead#{id}")))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| self.err("reading a dead letter", e))?;
            let Some(item) = out.item else {
                return Ok(None);
            };
            let Some(summary) = summary(&item) else {
                return Ok(None);
            };
            let headers: serde_json::Map<String, serde_json::Value> = match item.get("headers") {
                Some(AttributeValue::M(m)) => m
                    .iter()
                    .filter_map(|(k, v)| {
                        Some((k.clone(), serde_json::Value::String(v.as_s().ok()?.clone())))
                    })
                    .collect(),
                _ => serde_json::Map::new(),
            };
            Ok(Some(StoredEventDetail {
                summary,
                state: "dead".into(),
                payload: item
                    .get("payload")
                    .and_then(|v| v.as_b().ok())
                    .map(|b| b.as_ref().to_vec())
                    .unwrap_or_default(),
                headers: serde_json::Value::Object(headers),
                delivered_at: None,
                seq: number(&item, "seq").unwrap_or(0),
                attempt_errors: Vec::new(),
                backoff_until: None,
            }))
        })
    }

    fn retry<'a>(
        &'a self,
        _selection: &'a RetrySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(async move {
            Err(SourceError::fatal(
                "`outbox dead retry` is not available for kind = \"dynamodb\" yet: a dead letter \
                 cannot be put back in a stream. Purge the aggregate's dead letters \
                 (`outbox dead purge`), then write the events again with the producer (new ids, \
                 the aggregate's next seq); see docs/dynamodb.md",
            ))
        })
    }

    fn purge<'a>(
        &'a self,
        before: OffsetDateTime,
        event_type: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(async move {
            let mut purged = Vec::new();
            let all = self.all().await?;
            let mut kept: std::collections::HashSet<(String, String)> = Default::default();
            let mut touched: std::collections::HashSet<(String, String)> = Default::default();
            for item in all {
                let Some(d) = summary(&item) else { continue };
                let aggregate = (d.aggregate_type.clone(), d.aggregate_id.clone());
                if d.dead_lettered_at.is_none_or(|t| t >= before)
                    || event_type.is_some_and(|t| d.event_type != t)
                {
                    kept.insert(aggregate);
                    continue;
                }
                touched.insert(aggregate);
                self.client
                    .delete_item()
                    .table_name(&self.table)
                    .key(LEASE_KEY, AttributeValue::S(format!("dead#{}", d.id)))
                    .send()
                    .await
                    .map_err(|e| self.err("purging a dead letter", e))?;
                purged.push(d.id);
            }
            // An aggregate without dead letters left flows again (the relay reads the marker).
            for aggregate in touched.difference(&kept) {
                self.client
                    .delete_item()
                    .table_name(&self.table)
                    .key(
                        LEASE_KEY,
                        AttributeValue::S(crate::stream::held_key(aggregate)),
                    )
                    .send()
                    .await
                    .map_err(|e| self.err("unmarking a held aggregate", e))?;
            }
            Ok(purged)
        })
    }
}
