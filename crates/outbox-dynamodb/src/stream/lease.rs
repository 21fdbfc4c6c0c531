//! The relay's own table (`<table>-outbox-leases`): one item per stream shard (its lease and
//! checkpoint), per aggregate (the last position handed out for good), and per dead letter.
//! Every shard write is conditioned on this relay still holding the lease, so a paused relay
//! whose lease another took over cannot move a checkpoint.

use std::collections::{HashMap, HashSet};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, ReturnValue};
use futures::{StreamExt as _, TryStreamExt as _};
use outbox_core::{Event, SourceError};

use crate::migrate::LEASE_KEY;

/// What the lease table says about a shard this relay just took.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShardLease {
    /// The last sequence number settled for good, if any.
    pub(crate) checkpoint: Option<String>,
}

/// Access to one lease table as one relay (`owner`).
#[derive(Debug, Clone)]
pub(crate) struct Leases {
    pub(super) client: Client,
    pub(super) table: String,
    pub(super) owner: String,
}

pub(super) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}
pub(super) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn shard_key(shard: &str) -> AttributeValue {
    s(format!("shard#{shard}"))
}

/// The marker item of an aggregate that has dead letters.
pub(crate) fn held_key(aggregate: &(String, String)) -> String {
    format!("held#{}\u{1f}{}", aggregate.0, aggregate.1)
}

fn aggregate_key(aggregate: &(String, String)) -> String {
    // A unit separator cannot appear in a configured type and is unlikely in an id; the
    // key is only ever built here, never parsed.
    format!("aggregate#{}\u{1f}{}", aggregate.0, aggregate.1)
}

impl Leases {
    pub(crate) fn new(client: Client, table: String, owner: String) -> Self {
        Self {
            client,
            table,
            owner,
        }
    }

    pub(super) fn err<E: std::error::Error + Send + Sync + 'static>(
        &self,
        doing: &str,
        e: E,
    ) -> SourceError {
        let message = format!(
            "{doing} (lease table `{}`) failed: {}",
            self.table,
            outbox_core::relay::ErrorChain(&e)
        );
        SourceError::unavailable(message)
    }

    /// Takes the lease of `shard` until `until_ms` (Unix ms) when it is free, expired or
    /// already ours and the shard is not finished; `None` when another relay holds it or
    /// it is finished.
    pub(crate) async fn acquire(
        &self,
        shard: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<ShardLease>, SourceError> {
        let out = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(LEASE_KEY, shard_key(shard))
            .update_expression("SET #owner = :me, lease_until = :until")
            .condition_expression(
                "(attribute_not_exists(finished) OR finished = :no) AND \
                 (attribute_not_exists(lease_until) OR lease_until < :now OR #owner = :me)",
            )
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":me", s(&self.owner))
            .expression_attribute_values(":until", n(until_ms))
            .expression_attribute_values(":now", n(now_ms))
            .expression_attribute_values(":no", AttributeValue::Bool(false))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match out {
            Ok(out) => {
                let checkpoint = out
                    .attributes()
                    .and_then(|a| a.get("checkpoint"))
                    .and_then(|v| v.as_s().ok())
                    .cloned();
                Ok(Some(ShardLease { checkpoint }))
            }
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(None),
            Err(e) => Err(self.err("taking a shard lease", e)),
        }
    }

    /// Whether `shard` was read to its end and settled (its children may start).
    pub(crate) async fn finished(&self, shard: &str) -> Result<bool, SourceError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(LEASE_KEY, shard_key(shard))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.err("reading a shard lease", e))?;
        Ok(out
            .item()
            .and_then(|i| i.get("finished"))
            .is_some_and(|v| v.as_bool().is_ok_and(|b| *b)))
    }

    /// Saves `checkpoint` (and the end of the shard when `finished`; the lease is then
    /// given up) and extends the lease to `until_ms`. `Ok(false)`: the lease was lost.
    pub(crate) async fn save(
        &self,
        shard: &str,
        checkpoint: Option<&str>,
        finished: bool,
        until_ms: u64,
    ) -> Result<bool, SourceError> {
        let mut update = String::from("SET lease_until = :until");
        let mut req = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(LEASE_KEY, shard_key(shard))
            .condition_expression("#owner = :me")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":me", s(&self.owner));
        if let Some(c) = checkpoint {
            update.push_str(", checkpoint = :c");
            req = req.expression_attribute_values(":c", s(c));
        }
        if finished {
            update.push_str(", finished = :yes");
            req = req.expression_attribute_values(":yes", AttributeValue::Bool(true));
            req = req.expression_attribute_values(":until", n(0));
        } else {
            req = req.expression_attribute_values(":until", n(until_ms));
        }
        match req.update_expression(update).send().await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(false),
            Err(e) => Err(self.err("saving a shard checkpoint", e)),
        }
    }

    /// Gives the lease of `shard` up (a clean stop), keeping its checkpoint.
    pub(crate) async fn release(&self, shard: &str) {
        let _ = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(LEASE_KEY, shard_key(shard))
            .update_expression("SET lease_until = :zero")
            .condition_expression("#owner = :me")
            .expression_attribute_names("#owner", "owner")
            .expression_attribute_values(":me", s(&self.owner))
            .expression_attribute_values(":zero", n(0))
            .send()
            .await;
    }

    /// The last positions handed out for good of `aggregates` (absent: none yet).
    pub(crate) async fn positions(
        &self,
        aggregates: &[(String, String)],
    ) -> Result<HashMap<(String, String), u64>, SourceError> {
        let mut found = HashMap::new();
        for chunk in aggregates.chunks(100) {
            let by_key: HashMap<String, &(String, String)> =
                chunk.iter().map(|a| (aggregate_key(a), a)).collect();
            let mut keys = KeysAndAttributes::builder().consistent_read(true);
            for k in by_key.keys() {
                keys = keys.keys([(LEASE_KEY.to_owned(), s(k.clone()))].into_iter().collect());
            }
            let mut request = HashMap::from([(
                self.table.clone(),
                keys.build().map_err(|e| self.err("reading positions", e))?,
            )]);
            while !request.is_empty() {
                let out = self
                    .client
                    .batch_get_item()
                    .set_request_items(Some(request))
                    .send()
                    .await
                    .map_err(|e| self.err("reading aggregate positions", e))?;
                for item in out
                    .responses()
                    .and_then(|r| r.get(&self.table))
                    .into_iter()
                    .flatten()
                {
                    let key = item.get(LEASE_KEY).and_then(|v| v.as_s().ok());
                    let seq = item
                        .get("seq")
                        .and_then(|v| v.as_n().ok())
                        .and_then(|v| v.parse::<u64>().ok());
                    if let (Some(key), Some(seq)) = (key, seq)
                        && let Some(agg) = by_key.get(key)
                    {
                        found.insert((*agg).clone(), seq);
                    }
                }
                request = out.unprocessed_keys.unwrap_or_default();
            }
        }
        Ok(found)
    }

    /// Records that each aggregate's events up to its position were handed out for good
    /// (never moves a position back).
    pub(crate) async fn advance(
        &self,
        positions: Vec<((String, String), u64)>,
    ) -> Result<(), SourceError> {
        futures::stream::iter(positions)
            .map(|(agg, seq)| async move {
                let out = self
                    .client
                    .update_item()
                    .table_name(&self.table)
                    .key(LEASE_KEY, s(aggregate_key(&agg)))
                    .update_expression("SET seq = :s")
                    .condition_expression("attribute_not_exists(seq) OR seq < :s")
                    .expression_attribute_values(":s", n(seq))
                    .send()
                    .await;
                match out {
                    Ok(_) => Ok(()),
                    Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(()),
                    Err(e) => Err(self.err("recording aggregate positions", e)),
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await
            .map(drop)
    }

    /// Keeps `event` as a dead letter with `reason`.
    pub(crate) async fn dead(
        &self,
        event: &Event,
        seq: Option<u64>,
        attempts: u32,
        reason: &str,
        now: time::OffsetDateTime,
    ) -> Result<(), SourceError> {
        let mut put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(LEASE_KEY, s(format!("dead#{}", event.id)))
            .item("id", s(event.id.to_string()))
            .item("aggregate_type", s(&event.aggregate_type))
            .item("aggregate_id", s(&event.aggregate_id))
            .item("event_type", s(&event.event_type))
            .item(
                "payload",
                AttributeValue::B(Blob::new(event.payload.to_vec())),
            )
            .item("attempts", n(attempts))
            .item("reason", s(reason))
            .item("dead_lettered_at", n(now.unix_timestamp()))
            .item("created_at", n(event.created_at.unix_timestamp()));
        if let Some(seq) = seq {
            put = put.item("seq", n(seq));
        }
        if !event.headers.is_empty() {
            put = put.item(
                "headers",
                AttributeValue::M(
                    event
                        .headers
                        .iter()
                        .map(|(k, v)| (k.clone(), s(v)))
                        .collect(),
                ),
            );
        }
        put.send()
            .await
            .map_err(|e| self.err("keeping a dead letter", e))?;
        // The aggregate's marker: it has dead letters (until `outbox dead purge` removes the
        // last one). A relay reads it before parking an event of the aggregate.
        self.client
            .put_item()
            .table_name(&self.table)
            .item(
                LEASE_KEY,
                s(held_key(&(
                    event.aggregate_type.clone(),
                    event.aggregate_id.clone(),
                ))),
            )
            .item("aggregate_type", s(&event.aggregate_type))
            .item("aggregate_id", s(&event.aggregate_id))
            .send()
            .await
            .map_err(|e| self.err("marking an aggregate as held", e))
            .map(drop)
    }

    /// Whether `aggregate` still has dead letters (its marker is there).
    pub(crate) async fn held(&self, aggregate: &(String, String)) -> Result<bool, SourceError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(LEASE_KEY, s(held_key(aggregate)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.err("reading an aggregate's dead letters", e))?;
        Ok(out.item().is_some())
    }

    /// The aggregates that have dead letters (their markers).
    pub(crate) async fn dead_aggregates(&self) -> Result<HashSet<(String, String)>, SourceError> {
        Ok(super::scan_prefix(&self.client, &self.table, "held#")
            .await?
            .iter()
            .filter_map(super::aggregate_of)
            .collect())
    }

    /// Whether `id` is a dead letter.
    pub(crate) async fn is_dead(&self, id: uuid::Uuid) -> Result<bool, SourceError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(LEASE_KEY, s(format!("dead#{id}")))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.err("reading a dead letter", e))?;
        Ok(out.item().is_some())
    }
}
