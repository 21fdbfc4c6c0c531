//! `outbox dead` for DynamoDB: dead letters are `dead#<id>` items of the lease table (written
//! by the relay), and an aggregate that has any is marked `held#<type><US><id>`. Purging an
//! aggregate's last dead letter removes its mark, and the relay lets its events flow again.
//! Retry marks the dead letters of the selected aggregates; a running relay puts them back
//! in line (see `crate::stream` and `docs/dynamodb.md`).

use std::collections::{HashMap, HashSet};

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
        crate::stream::scan_prefix(&self.client, &self.table, crate::stream::DEAD_PREFIX).await
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
        selection: &'a RetrySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(async move {
            let all = self.all().await?;
            // An outbox item that could not be read as an event (no `seq`) cannot go again.
            let (all, broken): (Vec<Item>, Vec<Item>) = all
                .into_iter()
                .partition(|item| number(item, "seq").is_some());
            for item in &broken {
                let Some(d) = summary(item) else { continue };
                if let RetrySelection::Ids(ids) = selection
                    && ids.contains(&d.id)
                {
                    return Err(SourceError::fatal(format!(
                        "dead letter {} cannot be retried: its outbox item could not be read as an event ({}). Fix or rewrite the item in the table, then `outbox dead purge` this dead letter",
                        d.id,
                        d.reason.unwrap_or_default()
                    )));
                }
            }
            let chosen: HashSet<(String, String)> = all
                .iter()
                .filter_map(|item| Some((summary(item)?, crate::stream::aggregate_of(item)?)))
                .filter(|(d, _)| match selection {
                    RetrySelection::Ids(ids) => ids.contains(&d.id),
                    RetrySelection::EventType(t) => d.event_type == *t,
                    RetrySelection::All => true,
                })
                .map(|(_, agg)| agg)
                .collect();
            // Whole aggregates, in seq order: an event cannot go before the dead letter it
            // was held behind, nor a held one stay behind a retried head.
            let mut picked: Vec<(i64, DeadLetter)> = all
                .iter()
                .filter(|item| {
                    crate::stream::aggregate_of(item).is_some_and(|a| chosen.contains(&a))
                })
                .filter_map(|item| Some((number(item, "seq").unwrap_or(0), summary(item)?)))
                .collect();
            picked.sort_by(|a, b| {
                (&a.1.aggregate_type, &a.1.aggregate_id, a.0).cmp(&(
                    &b.1.aggregate_type,
                    &b.1.aggregate_id,
                    b.0,
                ))
            });
            let keys: Vec<String> = picked
                .iter()
                .map(|(_, d)| format!("{}{}", crate::stream::DEAD_PREFIX, d.id))
                .collect();
            let now_ms = (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as u64;
            crate::stream::request(&self.client, &self.table, &keys, now_ms).await?;
            Ok(picked.into_iter().map(|(_, d)| d.id).collect())
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
