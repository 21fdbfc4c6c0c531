//! Events put back in line by `outbox dead retry`: a stream cannot be rewound, so the
//! events come from the lease table, where each dead letter is kept in full.
//!
//! - `outbox dead retry` marks the selected dead letters (`requeue_at`) — with every other
//!   dead letter of their aggregates, so an aggregate goes again whole and in `seq` order —
//!   then bumps the counter item `requeue#requests`.
//! - Every relay reads that counter each second; when it moved (and once at start), the relay
//!   scans for marked items and claims each with a conditional write (`claimed_by`,
//!   `claim_until`, renewed like a shard lease). What it claimed goes in line, each aggregate
//!   in `seq` order; once the broker acknowledged one, its item is deleted. A claim that
//!   expires (the relay died) is taken by the next relay that scans.

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::AttributeValue;
use bytes::Bytes;
use outbox_core::{Event, Position, SourceError};
use time::OffsetDateTime;
use uuid::Uuid;

use super::lease::{Leases, n, s};
use crate::migrate::LEASE_KEY;

/// The counter item every `outbox dead retry` bumps.
const REQUESTS_KEY: &str = "requeue#requests";
/// Key prefix of dead letters (and of the events held behind them).
pub(crate) const DEAD_PREFIX: &str = "dead#";
/// Reason prefix of an event parked behind a dead letter of its aggregate.
pub(crate) const HELD_REASON: &str = "held:";

/// An item of the lease table.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// Every item of `table` whose key starts with `prefix` (a consistent scan).
pub(crate) async fn scan_prefix(
    client: &Client,
    table: &str,
    prefix: &str,
) -> Result<Vec<Item>, SourceError> {
    let mut out = Vec::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .filter_expression("begins_with(#k, :p)")
            .expression_attribute_names("#k", LEASE_KEY)
            .expression_attribute_values(":p", s(prefix))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| {
                SourceError::unavailable(format!(
                    "reading the lease table `{table}` failed: {}",
                    outbox_core::relay::ErrorChain(&e)
                ))
            })?;
        out.extend(page.items().iter().cloned());
        match page.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return Ok(out),
        }
    }
}

fn text(item: &Item, k: &str) -> Option<String> {
    item.get(k).and_then(|v| v.as_s().ok()).cloned()
}

fn number(item: &Item, k: &str) -> Option<i64> {
    item.get(k)
        .and_then(|v| v.as_n().ok())
        .and_then(|v| v.parse().ok())
}

/// The event a dead-letter item keeps, and its `seq`.
pub(crate) fn event_of(item: &Item) -> Option<(Event, u64)> {
    let headers = match item.get("headers") {
        Some(AttributeValue::M(m)) => {
            let mut h: Vec<(String, String)> = m
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_s().ok()?.clone())))
                .collect();
            h.sort();
            h
        }
        _ => Vec::new(),
    };
    let event = Event {
        id: Uuid::parse_str(&text(item, "id")?).ok()?,
        position: Position(0),
        aggregate_type: text(item, "aggregate_type")?,
        aggregate_id: text(item, "aggregate_id")?,
        event_type: text(item, "event_type")?,
        payload: item
            .get("payload")
            .and_then(|v| v.as_b().ok())
            .map(|b| Bytes::copy_from_slice(b.as_ref()))
            .unwrap_or_default(),
        headers,
        created_at: number(item, "created_at")
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
            .unwrap_or(OffsetDateTime::UNIX_EPOCH),
        attempts: 0,
    };
    Some((event, number(item, "seq")?.max(0) as u64))
}

/// The aggregate a dead-letter item belongs to.
pub(crate) fn aggregate_of(item: &Item) -> Option<(String, String)> {
    Some((text(item, "aggregate_type")?, text(item, "aggregate_id")?))
}

/// Whether a dead-letter item is an event parked behind another (not a failure of its own).
pub(crate) fn is_held(item: &Item) -> bool {
    text(item, "reason").is_some_and(|r| r.starts_with(HELD_REASON))
}

fn unavailable(
    table: &str,
    doing: &str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> SourceError {
    SourceError::unavailable(format!(
        "{doing} (lease table `{table}`) failed: {}",
        outbox_core::relay::ErrorChain(&e)
    ))
}

/// Marks the items `keys` to be put back in line, then tells the relays.
pub(crate) async fn request(
    client: &Client,
    table: &str,
    keys: &[String],
    now_ms: u64,
) -> Result<(), SourceError> {
    for key in keys {
        let out = client
            .update_item()
            .table_name(table)
            .key(LEASE_KEY, s(key))
            .update_expression("SET requeue_at = :now REMOVE claimed_by, claim_until")
            .condition_expression("attribute_exists(#k)")
            .expression_attribute_names("#k", LEASE_KEY)
            .expression_attribute_values(":now", n(now_ms))
            .send()
            .await;
        match out {
            Ok(_) => {}
            // Purged meanwhile: nothing to put back.
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => {}
            Err(e) => return Err(unavailable(table, "marking a dead letter for retry", e)),
        }
    }
    client
        .update_item()
        .table_name(table)
        .key(LEASE_KEY, s(REQUESTS_KEY))
        .update_expression("ADD requests :one")
        .expression_attribute_values(":one", n(1))
        .send()
        .await
        .map_err(|e| unavailable(table, "telling the relays to retry", e))
        .map(drop)
}

/// An event claimed to go again.
#[derive(Debug)]
pub(crate) struct Requeued {
    /// Its lease-table item.
    pub(crate) key: String,
    pub(crate) event: Event,
    pub(crate) seq: u64,
}

/// What a scan for marked items found.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    /// Claimed by this relay.
    pub(crate) mine: Vec<Requeued>,
    /// Marked items another relay's live claim holds.
    pub(crate) others: usize,
}

impl Leases {
    /// The counter of retry requests.
    pub(crate) async fn requeue_requests(&self) -> Result<u64, SourceError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(LEASE_KEY, s(REQUESTS_KEY))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.err("reading retry requests", e))?;
        Ok(out
            .item()
            .and_then(|i| number(i, "requests"))
            .unwrap_or(0)
            .max(0) as u64)
    }

    /// Claims every marked item no live claim holds, until `until_ms`.
    pub(crate) async fn claim_requeued(
        &self,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Claimed, SourceError> {
        let mut claimed = Claimed::default();
        for item in scan_prefix(&self.client, &self.table, DEAD_PREFIX).await? {
            if !item.contains_key("requeue_at") {
                continue;
            }
            let Some(key) = text(&item, LEASE_KEY) else {
                continue;
            };
            let out = self
                .client
                .update_item()
                .table_name(&self.table)
                .key(LEASE_KEY, s(&key))
                .update_expression("SET claimed_by = :me, claim_until = :until")
                .condition_expression(
                    "attribute_exists(requeue_at) AND (attribute_not_exists(claim_until) OR claim_until < :now OR claimed_by = :me)",
                )
                .expression_attribute_values(":me", s(&self.owner))
                .expression_attribute_values(":until", n(until_ms))
                .expression_attribute_values(":now", n(now_ms))
                .send()
                .await;
            match out {
                Ok(_) => match event_of(&item) {
                    Some((event, seq)) => claimed.mine.push(Requeued { key, event, seq }),
                    None => {
                        tracing::error!(item = %key, "a dead letter to retry lacks its event's fields; left as it is");
                    }
                },
                Err(e) if e.code() == Some("ConditionalCheckFailedException") => {
                    claimed.others += 1;
                }
                Err(e) => return Err(self.err("claiming a dead letter to retry", e)),
            }
        }
        Ok(claimed)
    }

    /// Extends this relay's claims on `keys` until `until_ms`; returns the keys it lost.
    pub(crate) async fn renew_claims(
        &self,
        keys: &[String],
        until_ms: u64,
    ) -> Result<Vec<String>, SourceError> {
        let mut lost = Vec::new();
        for key in keys {
            let out = self
                .client
                .update_item()
                .table_name(&self.table)
                .key(LEASE_KEY, s(key))
                .update_expression("SET claim_until = :until")
                .condition_expression("claimed_by = :me AND attribute_exists(requeue_at)")
                .expression_attribute_values(":me", s(&self.owner))
                .expression_attribute_values(":until", n(until_ms))
                .send()
                .await;
            match out {
                Ok(_) => {}
                Err(e) if e.code() == Some("ConditionalCheckFailedException") => {
                    lost.push(key.clone());
                }
                Err(e) => return Err(self.err("renewing a retry claim", e)),
            }
        }
        Ok(lost)
    }

    /// The broker acknowledged a retried event: its dead letter goes (if this relay still
    /// holds the claim).
    pub(crate) async fn requeued_done(&self, key: &str) -> Result<(), SourceError> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(LEASE_KEY, s(key))
            .condition_expression("claimed_by = :me")
            .expression_attribute_values(":me", s(&self.owner))
            .send()
            .await;
        match out {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => Ok(()),
            Err(e) => Err(self.err("removing a retried dead letter", e)),
        }
    }

    /// Gives claims up at once (a relay that stops), so another relay retries them.
    pub(crate) async fn release_claims(&self, keys: &[String]) {
        for key in keys {
            let _ = self
                .client
                .update_item()
                .table_name(&self.table)
                .key(LEASE_KEY, s(key))
                .update_expression("REMOVE claim_until, claimed_by")
                .condition_expression("claimed_by = :me")
                .expression_attribute_values(":me", s(&self.owner))
                .send()
                .await;
        }
    }

    /// After an aggregate's retried events went: its dead letters left, and whether each is
    /// only held (parked meanwhile behind the retried ones).
    pub(crate) async fn dead_of(
        &self,
        aggregate: &(String, String),
    ) -> Result<Vec<(String, bool)>, SourceError> {
        Ok(scan_prefix(&self.client, &self.table, DEAD_PREFIX)
            .await?
            .iter()
            .filter(|i| aggregate_of(i).as_ref() == Some(aggregate))
            .filter_map(|i| Some((text(i, LEASE_KEY)?, is_held(i))))
            .collect())
    }

    /// Removes the marker of an aggregate that has no dead letters left.
    pub(crate) async fn unhold(&self, aggregate: &(String, String)) -> Result<(), SourceError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .key(LEASE_KEY, s(super::held_key(aggregate)))
            .send()
            .await
            .map_err(|e| self.err("unmarking a held aggregate", e))
            .map(drop)
    }
}
