//! The polling source: claims batches with `FOR UPDATE SKIP LOCKED` in a `READ COMMITTED`
//! transaction that stays open while the batch is published, then records every outcome in
//! one statement per outcome kind and commits.
//!
//! # Why it keeps per-aggregate order with any number of replicas
//!
//! - The table's trigger numbers each aggregate's events `seq` = 1, 2, 3, … in **commit**
//!   order with no gaps (see the crate docs): when event `n` of an aggregate is visible, every
//!   earlier one is committed and visible too.
//! - The claim skips events whose aggregate has an earlier event waiting for its next attempt
//!   (or dead, under `hold-aggregate`), and locks what it takes; other replicas skip locked
//!   rows.
//! - A replica that skipped a locked row may have claimed later events of the same aggregate.
//!   So, before anything goes out, a plain read in the same transaction
//!   (`outbox_claim_gaps.sql`) lists the aggregates that still have an earlier pending (or
//!   held dead) event that this batch does not hold; their events are released untouched.
//!   Within the batch, an aggregate's events go out only as a run of consecutive `seq`s from
//!   its first: a hole (a row locked elsewhere) stops the run.
//!
//! What goes out for an aggregate therefore always starts right after what was delivered and
//! has no hole: commit order, across replicas, crashes and retries.
//!
//! # Delivery positions
//!
//! `seq` is itself the `aggregate_seq` header the consumer's order gate needs: contiguous per
//! aggregate, in commit order, the same number on every redelivery of an event. No position
//! table is needed (the PostgreSQL and SQLite sources keep one because their own numbering
//! has gaps).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use outbox_core::message::header;
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, Event, Ordering, Position, Source, SourceError};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlPool, Row, Transaction};
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset};
use uuid::Uuid;

use crate::config::{MySqlConfig, OnDelivered};
use crate::error::source_error;
use crate::sql::{Queries, stmt};

/// Reads the outbox by polling. One instance per relay worker; each holds at most one claim
/// transaction (one pooled connection) at a time.
pub struct MySqlPollSource {
    pool: MySqlPool,
    queries: Arc<Queries>,
    table: String,
    ordering: Ordering,
    hold_dead: bool,
    on_delivered: OnDelivered,
    claim: Option<Transaction<'static, MySql>>,
    claim_timeout: std::time::Duration,
}

impl std::fmt::Debug for MySqlPollSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlPollSource")
            .field("table", &self.table)
            .field("ordering", &self.ordering)
            .field("claim_open", &self.claim.is_some())
            .finish_non_exhaustive()
    }
}

/// A time as MySQL's `DATETIME(6)` holds it: UTC, without offset.
pub(crate) fn utc(t: OffsetDateTime) -> PrimitiveDateTime {
    let t = t.to_offset(UtcOffset::UTC);
    PrimitiveDateTime::new(t.date(), t.time())
}

/// A time as text for a `DATETIME(6)` column of `JSON_TABLE`.
fn utc_text(t: OffsetDateTime) -> String {
    let t = t.to_offset(UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

impl MySqlPollSource {
    /// A source over `config`'s table using `pool` (see [`crate::connect`]: its connections
    /// run `READ COMMITTED`, which the claim needs).
    pub fn new(
        pool: MySqlPool,
        config: &MySqlConfig,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> Self {
        Self {
            pool,
            queries: Arc::new(Queries::new(&config.table)),
            table: config.table.to_string(),
            ordering,
            hold_dead: dead_letter == DeadLetterPolicy::HoldAggregate,
            on_delivered: config.on_delivered,
            claim: None,
            claim_timeout: config.claim_timeout,
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    async fn claim(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        // The server ends a claim transaction idle for `claim_timeout`, freeing its rows for
        // other replicas: from before the claim started, so the deadline errs early.
        let valid_until = tokio::time::Instant::now() + self.claim_timeout;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| self.err("starting a claim transaction", e))?;
        let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
        let now_db = utc(now);
        let ordered = self.ordering != Ordering::None;
        let rows = if ordered {
            sqlx::query(stmt(&self.queries.claim_batch))
                .bind(now_db)
                .bind(now_db)
                .bind(self.hold_dead)
                .bind(limit_u64)
                .fetch_all(&mut *tx)
                .await
        } else {
            sqlx::query(stmt(&self.queries.claim_batch_unordered))
                .bind(now_db)
                .bind(limit_u64)
                .fetch_all(&mut *tx)
                .await
        }
        .map_err(|e| self.err("claiming a batch", e))?;
        let claimed = rows.len();
        let mut decoded = Vec::with_capacity(claimed);
        for row in &rows {
            decoded.push(decode(row).map_err(|e| self.err("reading a claimed event", e))?);
        }
        let events = if ordered && !decoded.is_empty() {
            self.deliverable(&mut tx, decoded).await?
        } else {
            decoded.into_iter().map(|(event, _)| event).collect()
        };
        if events.is_empty() {
            // Nothing may go out: end the claim at once so the rows are free again.
            tx.rollback()
                .await
                .map_err(|e| self.err("ending an empty claim", e))?;
            return Ok(Fetched::default());
        }
        self.claim = Some(tx);
        Ok(Fetched {
            more: claimed >= limit,
            events,
            valid_until: Some(valid_until),
        })
    }

    /// Keeps, per aggregate, the run of consecutive `seq`s that starts right after what is
    /// settled (see the module docs) and numbers them (`aggregate_seq` = `seq`). The rest
    /// stays locked, untouched, until the claim ends.
    async fn deliverable(
        &self,
        tx: &mut Transaction<'static, MySql>,
        events: Vec<(Event, i64)>,
    ) -> Result<Vec<Event>, SourceError> {
        let probe = serde_json::to_string(&first_seqs(&events)).unwrap_or_default();
        let blocked: Vec<(String, String)> = sqlx::query_as(stmt(&self.queries.claim_gaps))
            .bind(probe)
            .bind(self.hold_dead)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| self.err("checking the claimed aggregates' earlier events", e))?;
        Ok(keep_runs(events, &blocked.into_iter().collect()).0)
    }

    async fn record(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let Some(mut tx) = self.claim.take() else {
            return Ok(());
        };
        let mut delivered = Vec::new();
        let mut retries = Vec::new();
        let mut dead = Vec::new();
        for s in settlements {
            match &s.outcome {
                Outcome::Delivered => delivered.push(s.position.0),
                Outcome::Retry { not_before, error } => retries.push(serde_json::json!([
                    s.position.0,
                    utc_text(*not_before),
                    error
                ])),
                Outcome::DeadLetter { reason } => {
                    dead.push(serde_json::json!([s.position.0, reason]));
                }
                Outcome::Released => {}
            }
        }
        let now_db = utc(now);
        if !delivered.is_empty() {
            let positions = serde_json::Value::from(delivered).to_string();
            let q = match self.on_delivered {
                OnDelivered::Mark => sqlx::query(stmt(&self.queries.mark_delivered))
                    .bind(positions)
                    .bind(now_db),
                OnDelivered::Delete => {
                    sqlx::query(stmt(&self.queries.delete_delivered)).bind(positions)
                }
            };
            q.execute(&mut *tx)
                .await
                .map_err(|e| self.err("recording delivered events", e))?;
        }
        if !retries.is_empty() {
            sqlx::query(stmt(&self.queries.schedule_retry))
                .bind(serde_json::Value::from(retries).to_string())
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err("scheduling retries", e))?;
        }
        if !dead.is_empty() {
            sqlx::query(stmt(&self.queries.dead_letter))
                .bind(serde_json::Value::from(dead).to_string())
                .bind(now_db)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err("dead-lettering events", e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.err("committing batch outcomes", e))
    }
}

/// Each aggregate's first claimed `seq`, in batch order: (type, id, seq).
pub(crate) fn first_seqs(events: &[(Event, i64)]) -> Vec<(&str, &str, i64)> {
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    events
        .iter()
        .filter_map(|(e, seq)| {
            let key = (e.aggregate_type.as_str(), e.aggregate_id.as_str());
            seen.insert(key).then_some((key.0, key.1, *seq))
        })
        .collect()
}

/// Keeps, per aggregate not in `blocked`, the run of consecutive `seq`s from its first
/// claimed one, each with its `aggregate_seq` header. Returns the kept events and the
/// positions of the others.
pub(crate) fn keep_runs(
    events: Vec<(Event, i64)>,
    blocked: &HashSet<(String, String)>,
) -> (Vec<Event>, Vec<i64>) {
    // The next seq each aggregate may deliver; `None` once its run has a hole.
    let mut next: HashMap<(String, String), Option<i64>> = HashMap::new();
    let mut kept = Vec::with_capacity(events.len());
    let mut dropped = Vec::new();
    for (mut event, seq) in events {
        let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
        let in_run = !blocked.contains(&key);
        let slot = next.entry(key).or_insert(Some(seq));
        let keep = match slot {
            Some(expected) if *expected == seq => {
                *slot = Some(seq + 1);
                in_run
            }
            _ => {
                *slot = None;
                false
            }
        };
        if keep {
            event
                .headers
                .push((header::AGGREGATE_SEQ.to_owned(), seq.to_string()));
            kept.push(event);
        } else {
            dropped.push(event.position.0);
        }
    }
    (kept, dropped)
}

/// One claimed row: the event and its `seq`.
pub(crate) fn decode(row: &MySqlRow) -> Result<(Event, i64), sqlx::Error> {
    let decode_err = |what: &str, e: &dyn std::fmt::Display| {
        sqlx::Error::Decode(format!("outbox row: invalid {what}: {e}").into())
    };
    let id: String = row.try_get(1)?;
    let headers: String = row.try_get(6)?;
    let headers: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&headers).map_err(|e| decode_err("headers", &e))?;
    let payload: Vec<u8> = row.try_get(5)?;
    let attempts: i32 = row.try_get(8)?;
    let created_at: PrimitiveDateTime = row.try_get(7)?;
    let event = Event {
        position: Position(row.try_get(0)?),
        id: Uuid::parse_str(&id).map_err(|e| decode_err("id", &e))?,
        aggregate_type: row.try_get(2)?,
        aggregate_id: row.try_get(3)?,
        event_type: row.try_get(4)?,
        payload: Bytes::from(payload),
        headers: outbox_core::enqueue::decode_headers(headers),
        created_at: created_at.assume_utc(),
        attempts: u32::try_from(attempts).unwrap_or(0),
    };
    Ok((event, row.try_get(9)?))
}

impl Source for MySqlPollSource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        if let Some(stale) = self.claim.take() {
            // A fetch without settle: release the previous claim untouched.
            let _ = stale.rollback().await;
        }
        self.claim(limit, now).await
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        self.record(settlements, now).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(agg: &str, position: i64) -> Event {
        Event {
            id: Uuid::from_u128(position as u128),
            position: Position(position),
            aggregate_type: "A".into(),
            aggregate_id: agg.into(),
            event_type: "e".into(),
            payload: Bytes::new(),
            headers: vec![],
            created_at: OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    #[test]
    fn only_consecutive_runs_of_unblocked_aggregates_go_out() {
        // x: 3, 4, (5 held elsewhere), 6; y: blocked; z: 1.
        let events = vec![
            (ev("x", 10), 3),
            (ev("y", 11), 2),
            (ev("x", 12), 4),
            (ev("z", 13), 1),
            (ev("x", 14), 6),
            (ev("y", 15), 3),
        ];
        assert_eq!(
            first_seqs(&events),
            vec![("A", "x", 3), ("A", "y", 2), ("A", "z", 1)]
        );
        let blocked = HashSet::from([("A".to_owned(), "y".to_owned())]);
        let (kept, dropped) = keep_runs(events, &blocked);
        let kept: Vec<(i64, String)> = kept
            .iter()
            .map(|e| (e.position.0, e.headers[0].1.clone()))
            .collect();
        assert_eq!(
            kept,
            vec![(10, "3".into()), (12, "4".into()), (13, "1".into())]
        );
        assert_eq!(dropped, vec![11, 14, 15]);
    }
}
