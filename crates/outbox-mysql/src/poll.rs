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
//!   So the claim also reads, for each row, its aggregate's first pending and first dead
//!   `seq` in the statement's snapshot; an aggregate goes out only when the batch's first
//!   event of it is its first pending one (and, under `hold-aggregate`, no dead one is
//!   earlier); the others are released untouched. A row newer than the snapshot (the locking
//!   read sees the latest committed rows) waits for the next claim. Within the batch, an
//!   aggregate's events go out only as a run of consecutive `seq`s from its first: a hole (a
//!   row locked elsewhere) stops the run.
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

use outbox_core::backend::SettledBatch;
use outbox_core::enqueue::decode_headers;
use outbox_core::message::header;
use outbox_core::source::{Fetched, Settlement};
use outbox_core::{DeadLetterPolicy, Event, Ordering, SourceError};
use outbox_sql::poll::{JsonListOutcomes, claimed_event, invalid_column, record_outcomes};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlPool, Row, Transaction};
use time::{OffsetDateTime, PrimitiveDateTime, UtcOffset};

use crate::config::{MySqlConfig, OnDelivered};
use crate::error::source_error;
use crate::sql::{Cols, Queries, stmt};

/// Reads the outbox by polling. One instance per relay worker; each holds at most one claim
/// transaction (one pooled connection) at a time.
pub struct MySqlPollSource {
    claims: Claims,
    claim: Option<Transaction<'static, MySql>>,
    claim_timeout: std::time::Duration,
}

impl std::fmt::Debug for MySqlPollSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.claims
            .debug(f, "MySqlPollSource", self.claim.is_some())
    }
}

/// What both claims of a MySQL outbox (the row locks here, the lease tokens of
/// [`crate::lease`]) work with: the pool, the table's statements and the relay's order,
/// dead-letter and delivery settings.
pub(crate) struct Claims {
    pub(crate) pool: MySqlPool,
    pub(crate) queries: Arc<Queries>,
    pub(crate) table: String,
    pub(crate) ordering: Ordering,
    pub(crate) hold_dead: bool,
    pub(crate) on_delivered: OnDelivered,
}

impl Claims {
    /// The claims of `config`'s table on `pool`.
    pub(crate) fn new(
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
        }
    }

    /// A database error while `context`, naming the table.
    pub(crate) fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// A source's `Debug`: its name, table and ordering, and whether a claim is open.
    pub(crate) fn debug(
        &self,
        f: &mut std::fmt::Formatter<'_>,
        name: &str,
        claim_open: bool,
    ) -> std::fmt::Result {
        f.debug_struct(name)
            .field("table", &self.table)
            .field("ordering", &self.ordering)
            .field("claim_open", &claim_open)
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
            claims: Claims::new(pool, config, ordering, dead_letter),
            claim: None,
            claim_timeout: config.claim_timeout,
        }
    }

    /// Claims the next batch ([`Source::fetch`](outbox_core::Source::fetch)).
    async fn claim(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        if let Some(stale) = self.claim.take() {
            // A fetch without settle: release the previous claim untouched.
            let _ = stale.rollback().await;
        }
        // The server ends a claim transaction idle for `claim_timeout`, freeing its rows for
        // other replicas: from before the claim started, so the deadline errs early.
        let valid_until = tokio::time::Instant::now() + self.claim_timeout;
        let mut tx = (self.claims.pool)
            .begin()
            .await
            .map_err(|e| self.claims.err("starting a claim transaction", e))?;
        let limit_u64 = u64::try_from(limit).unwrap_or(u64::MAX);
        let now_db = utc(now);
        let ordered = self.claims.ordering != Ordering::None;
        let rows = if ordered {
            sqlx::query(stmt(&self.claims.queries.claim_batch))
                .bind(now_db)
                .bind(now_db)
                .bind(self.claims.hold_dead)
                .bind(limit_u64)
                .fetch_all(&mut *tx)
                .await
        } else {
            sqlx::query(stmt(&self.claims.queries.claim_batch_unordered))
                .bind(now_db)
                .bind(limit_u64)
                .fetch_all(&mut *tx)
                .await
        }
        .map_err(|e| self.claims.err("claiming a batch", e))?;
        let claimed = rows.len();
        let mut decoded = Vec::with_capacity(claimed);
        let mut firsts: Heads = HashMap::new();
        for row in &rows {
            let event = decode(row).map_err(|e| self.claims.err("reading a claimed event", e))?;
            if ordered {
                let heads = (|| Ok::<_, sqlx::Error>((row.try_get(10)?, row.try_get(11)?)))()
                    .map_err(|e| self.claims.err("reading a claimed event", e))?;
                firsts
                    .entry((event.0.aggregate_type.clone(), event.0.aggregate_id.clone()))
                    .or_insert(heads);
            }
            decoded.push(event);
        }
        let events = if ordered && !decoded.is_empty() {
            order_by_seq(&mut decoded);
            let blocked = blocked(&first_seqs(&decoded), &firsts, self.claims.hold_dead);
            keep_runs(decoded, &blocked).0
        } else {
            decoded.into_iter().map(|(event, _)| event).collect()
        };
        if events.is_empty() {
            // Nothing may go out: end the claim at once so the rows are free again.
            tx.rollback()
                .await
                .map_err(|e| self.claims.err("ending an empty claim", e))?;
            return Ok(Fetched::default());
        }
        self.claim = Some(tx);
        Ok(Fetched {
            more: claimed >= limit,
            events,
            valid_until: Some(valid_until),
        })
    }

    /// Records a claimed batch's outcomes and ends the claim ([`Source::settle`](outbox_core::Source::settle)).
    async fn record(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let Some(mut tx) = self.claim.take() else {
            return Ok(());
        };
        let q = &self.claims.queries;
        let delivered = [&q.mark_delivered, &q.delete_delivered];
        let failed = [&q.schedule_retry, &q.dead_letter];
        let statements =
            JsonListOutcomes::new(delivered, failed, utc(now), |at| utc_text(at).into());
        let batch = SettledBatch::sort(settlements);
        record_outcomes(&mut *tx, &statements, self.claims.on_delivered, &batch)
            .await
            .map_err(|f| self.claims.err(f.step, f.error))?;
        tx.commit()
            .await
            .map_err(|e| self.claims.err("committing batch outcomes", e))
    }
}

/// Puts each aggregate's events of a claimed batch in `seq` order, in the slots its events
/// held (so aggregates stay interleaved as claimed). Insert order (`position`) usually agrees
/// with `seq` per aggregate, but not always: a multi-row `INSERT` reserves its positions at
/// its first row, before a later row's trigger waits for another transaction of the same
/// aggregate to commit.
pub(crate) fn order_by_seq(events: &mut [(Event, i64)]) {
    let mut slots: HashMap<(String, String), Vec<usize>> = HashMap::new();
    for (i, (e, _)) in events.iter().enumerate() {
        slots
            .entry((e.aggregate_type.clone(), e.aggregate_id.clone()))
            .or_default()
            .push(i);
    }
    for indices in slots.values().filter(|v| v.len() > 1) {
        let mut group: Vec<(Event, i64)> = indices
            .iter()
            .map(|&i| {
                let placeholder = (events[i].0.clone(), events[i].1);
                std::mem::replace(&mut events[i], placeholder)
            })
            .collect();
        group.sort_by_key(|(_, seq)| *seq);
        for (&i, item) in indices.iter().zip(group) {
            events[i] = item;
        }
    }
}

/// Per aggregate: its first pending and first dead `seq`, as a claim's snapshot saw them.
pub(crate) type Heads = HashMap<(String, String), (Option<i64>, Option<i64>)>;

/// The aggregates of a batch that must wait, from each one's first claimed `seq` and its
/// first pending and first dead `seq` as the claim's snapshot saw them: an earlier event is
/// still pending (claimed by another replica, or waiting), or dead under hold-aggregate, or
/// the claimed rows are newer than the snapshot (no first pending: decide at the next claim).
pub(crate) fn blocked(
    firsts: &[(&str, &str, i64)],
    heads: &Heads,
    hold_dead: bool,
) -> HashSet<(String, String)> {
    firsts
        .iter()
        .filter_map(|(t, i, seq)| {
            let key = ((*t).to_owned(), (*i).to_owned());
            let (pending, dead) = heads.get(&key).copied().unwrap_or((None, None));
            let waits =
                pending.is_none_or(|p| p < *seq) || (hold_dead && dead.is_some_and(|d| d < *seq));
            waits.then_some(key)
        })
        .collect()
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
    let headers: String = row.try_get(6)?;
    let headers = serde_json::from_str(&headers).map_err(|e| invalid_column("headers", e))?;
    let event = claimed_event(&Cols(row), decode_headers(headers))?;
    Ok((event, row.try_get(9)?))
}

outbox_core::forward_source!(MySqlPollSource, fetch = claim, settle = record);

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use outbox_core::Position;
    use uuid::Uuid;

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
    fn aggregates_wait_unless_the_batch_starts_at_their_first_pending_event() {
        let firsts = [
            ("A", "go", 3),
            ("A", "behind", 5),
            ("A", "new", 1),
            ("A", "dead", 4),
        ];
        let heads = HashMap::from([
            (("A".to_owned(), "go".to_owned()), (Some(3), Some(1))),
            (("A".to_owned(), "behind".to_owned()), (Some(4), None)),
            (("A".to_owned(), "new".to_owned()), (None, None)),
            (("A".to_owned(), "dead".to_owned()), (Some(4), Some(2))),
        ]);
        let names = |set: HashSet<(String, String)>| {
            let mut v: Vec<String> = set.into_iter().map(|(_, i)| i).collect();
            v.sort();
            v
        };
        // "go" has an earlier dead event: it waits only under hold-aggregate.
        assert_eq!(
            names(blocked(&firsts, &heads, true)),
            ["behind", "dead", "go", "new"]
        );
        assert_eq!(names(blocked(&firsts, &heads, false)), ["behind", "new"]);
    }

    #[test]
    fn each_aggregate_goes_in_seq_order_in_its_own_slots() {
        let mut events = vec![
            (ev("x", 10), 2),
            (ev("y", 11), 1),
            (ev("x", 12), 1),
            (ev("x", 13), 3),
        ];
        order_by_seq(&mut events);
        let got: Vec<(i64, i64)> = events.iter().map(|(e, s)| (e.position.0, *s)).collect();
        assert_eq!(got, vec![(12, 1), (11, 1), (10, 2), (13, 3)]);
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
