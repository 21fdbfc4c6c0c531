//! `outbox backfill`: copying retained outbox events into a subscription's table while relays
//! run, without ever letting an event be delivered after a newer event of its aggregate.
//!
//! The argument (docs/subscriptions.md, "Backfill"): an event missing from a subscription
//! table was fanned out by a relay that did not know the subscription. For each aggregate,
//! under a hold that keeps the subscription's fan-out and pipeline off it (each database's
//! [`Backfill::apply`] says which lock), the backfill
//!
//! - skips a missing event that is older than a copy the subscription already handed out
//!   (delivered or dead-lettered): delivering it now would put it after a newer event;
//! - otherwise puts the missing events and the aggregate's pending copies back in line
//!   together, in outbox commit order, so the subscription's pipeline delivers (and numbers,
//!   `aggregate_seq`) them in that order.
//!
//! The decision is [`plan`], the same for every database; the databases supply the hold, the
//! reads and the writes.

use std::collections::{BTreeMap, HashMap, HashSet};

use time::OffsetDateTime;
use uuid::Uuid;

use crate::Event;
use crate::sink::BoxFuture;
use crate::source::SourceError;

/// A retained outbox event offered to the subscription.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Its position in the outbox's commit order (per aggregate, commit order).
    pub outbox_seq: i64,
    /// The event as the outbox holds it.
    pub event: Event,
}

/// A pending copy in the subscription table (not yet handed out), with the outbox position of
/// its event when the outbox row is still there.
#[derive(Debug, Clone)]
pub struct PendingCopy {
    /// The event id (the same in the outbox and in every subscription).
    pub id: Uuid,
    /// The outbox row's commit-order position; `None` when retention removed it (then it is
    /// older than every retained event: retention removes an aggregate's rows in fan-out
    /// order, which is its commit order).
    pub outbox_seq: Option<i64>,
}

/// What the subscription already handed out (delivered or dead-lettered) of one aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandedOut {
    /// Nothing: any missing event may still go first.
    Nothing,
    /// Up to this outbox position: only missing events after it may be delivered.
    UpTo(i64),
    /// Something, but its rows are gone (removed after delivery): no missing event can be
    /// placed safely.
    Unknown,
}

impl HandedOut {
    /// From what a subscription table tells of one aggregate: the newest outbox position
    /// among its handed-out rows still there (`None` when their outbox rows are gone: older
    /// than anything retained), whether any handed-out row is there, and whether its
    /// delivery numbering moved (something was handed out, maybe since removed).
    pub fn from_facts(last: Option<i64>, rows: bool, positioned: bool) -> Self {
        match (rows, positioned) {
            (true, _) => Self::UpTo(last.unwrap_or(i64::MIN)),
            (false, true) => Self::Unknown,
            (false, false) => Self::Nothing,
        }
    }

    /// Whether a missing event at `outbox_seq` can still be delivered in order.
    pub fn allows(self, outbox_seq: i64) -> bool {
        match self {
            Self::Nothing => true,
            Self::UpTo(last) => outbox_seq > last,
            Self::Unknown => false,
        }
    }
}

/// What the backfill does to one aggregate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AggregatePlan {
    /// Candidates to copy in, by id.
    pub copy: Vec<Uuid>,
    /// When anything is copied: the rows to insert, in this order: the copies, and the
    /// pending rows that must come after one of them (taken out and inserted again); the
    /// pending rows older than every copy keep their place. Empty when nothing is copied.
    pub order: Vec<Uuid>,
    /// Candidates the table already holds.
    pub already_there: u64,
    /// Candidates older than a copy already handed out.
    pub skipped_newer_delivered: u64,
}

/// Decides what to do with one aggregate: `candidates` in outbox commit order, the ids the
/// subscription table holds among them (`present`), its pending copies in the table's order,
/// and what it handed out.
pub fn plan(
    candidates: &[Candidate],
    present: &HashSet<Uuid>,
    pending: &[PendingCopy],
    handed_out: HandedOut,
) -> AggregatePlan {
    let mut out = AggregatePlan::default();
    let mut copy: Vec<(i64, Uuid)> = Vec::new();
    for c in candidates {
        if present.contains(&c.event.id) {
            out.already_there += 1;
        } else if handed_out.allows(c.outbox_seq) {
            copy.push((c.outbox_seq, c.event.id));
        } else {
            out.skipped_newer_delivered += 1;
        }
    }
    if copy.is_empty() {
        return out;
    }
    // Pending copies older than every copied event keep their place (their seq is already
    // below anything inserted now); the rest are inserted again, merged with the copies by
    // commit order. A pending copy whose outbox row is gone is older than anything retained.
    // The sort is stable, so ties keep the table's order.
    let first = copy.iter().map(|(seq, _)| *seq).min().unwrap_or(i64::MAX);
    let key = |p: &PendingCopy| p.outbox_seq.unwrap_or(i64::MIN);
    let keep = pending.iter().take_while(|p| key(p) < first).count();
    let mut merged: Vec<(i64, Uuid)> = pending[keep..]
        .iter()
        .map(|p| (key(p), p.id))
        .chain(copy.iter().copied())
        .collect();
    merged.sort_by_key(|(seq, _)| *seq);
    out.copy = copy.into_iter().map(|(_, id)| id).collect();
    out.order = merged.into_iter().map(|(_, id)| id).collect();
    out
}

/// The counts of one chunk (or a whole run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackfillCounts {
    /// Events copied into the subscription table.
    pub copied: u64,
    /// Events the table already held (copied by the fan-out, or by an earlier backfill).
    pub already_there: u64,
    /// Events older than an event of their aggregate the subscription already handed out.
    pub skipped_newer_delivered: u64,
}

impl std::ops::AddAssign for BackfillCounts {
    fn add_assign(&mut self, other: Self) {
        self.copied += other.copied;
        self.already_there += other.already_there;
        self.skipped_newer_delivered += other.skipped_newer_delivered;
    }
}

/// What [`Backfill::apply`] did with a chunk.
#[derive(Debug, Clone, Default)]
pub struct ChunkOutcome {
    /// The counts of the aggregates it handled.
    pub counts: BackfillCounts,
    /// The candidates of aggregates it could not hold (a relay had one of their rows in
    /// flight, or a fan-out was writing them): try them again later, in this order.
    pub deferred: Vec<Candidate>,
}

/// Backfilling one subscription's table from its outbox.
pub trait Backfill: Send + Sync {
    /// The ids of the retained outbox events written at or after `since` (all when `None`),
    /// grouped by aggregate, each aggregate's in commit order.
    fn ids(&self, since: Option<OffsetDateTime>) -> BoxFuture<'_, Result<Vec<Uuid>, SourceError>>;
    /// The events with these ids that are still there, in commit order.
    fn events<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<Vec<Candidate>, SourceError>>;
    /// Applies [`plan`] to each aggregate of `chunk` (candidates in commit order) in one
    /// transaction, holding each aggregate against the subscription's fan-out and pipeline;
    /// aggregates it cannot hold now are returned as deferred.
    fn apply<'a>(
        &'a self,
        chunk: &'a [Candidate],
    ) -> BoxFuture<'a, Result<ChunkOutcome, SourceError>>;
}

/// An aggregate: (aggregate type, aggregate id).
pub type AggregateKey = (String, String);

/// A pending row of the subscription table, read under the hold, for re-insertion.
#[derive(Debug, Clone)]
pub struct PendingRow {
    /// The row's event, with its attempts so far.
    pub event: Event,
    /// Its backoff (`None`: ready at once).
    pub next_attempt_at: Option<OffsetDateTime>,
    /// Its last error.
    pub last_error: Option<String>,
    /// The outbox row's commit-order position (`None`: retention removed it).
    pub outbox_seq: Option<i64>,
}

/// One row to insert: a backfilled event (first attempt) or a re-inserted pending row.
#[derive(Debug, Clone, Copy)]
pub struct InsertRow<'a> {
    /// The event (attempts included).
    pub event: &'a Event,
    /// Backoff of a re-inserted row (`None`: ready at once).
    pub next_attempt_at: Option<OffsetDateTime>,
    /// Last error of a re-inserted row.
    pub last_error: Option<&'a str>,
}

/// The pending rows [`ChunkStore::hold`] held, by aggregate.
pub type Held = HashMap<AggregateKey, Vec<PendingRow>>;

impl PendingRow {
    /// Its aggregate.
    pub fn key(&self) -> AggregateKey {
        aggregate_key(&self.event)
    }
}

/// `event`'s aggregate.
pub fn aggregate_key(event: &Event) -> AggregateKey {
    (event.aggregate_type.clone(), event.aggregate_id.clone())
}

/// `rows` grouped by aggregate, each aggregate's in the order given.
pub fn by_aggregate(rows: impl IntoIterator<Item = PendingRow>) -> Held {
    let mut out = Held::new();
    for row in rows {
        out.entry(row.key()).or_default().push(row);
    }
    out
}

/// One database's side of [`apply_chunk`]: the statements of one chunk transaction on a
/// subscription table. The hold is the database's; the decision and the order are
/// [`plan`]'s, the same everywhere.
pub trait ChunkStore: Send + Sync {
    /// The open chunk transaction.
    type Tx: Send;
    /// Starts a chunk transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, SourceError>> + Send;
    /// Holds what it can of `keys` (sorted) against the subscription's fan-out and pipeline
    /// until the transaction ends, without waiting for a relay: returns the held aggregates,
    /// each with all its pending rows in the table's (delivery) order, none in flight. An
    /// aggregate it cannot hold now is left out (tried again later).
    fn hold(
        &self,
        tx: &mut Self::Tx,
        keys: &[AggregateKey],
    ) -> impl Future<Output = Result<Held, SourceError>> + Send;
    /// What the subscription handed out of each held aggregate.
    fn handed_out(
        &self,
        tx: &mut Self::Tx,
        keys: &[AggregateKey],
    ) -> impl Future<Output = Result<HashMap<AggregateKey, HandedOut>, SourceError>> + Send;
    /// Which of these event ids the subscription table holds, in any state.
    fn present(
        &self,
        tx: &mut Self::Tx,
        ids: &[Uuid],
    ) -> impl Future<Output = Result<HashSet<Uuid>, SourceError>> + Send;
    /// Takes the pending rows `taken_out` out of line and inserts `rows`, in this order
    /// (each aggregate's in outbox commit order), so the pipeline delivers them so.
    fn put_in_line(
        &self,
        tx: &mut Self::Tx,
        taken_out: &[Uuid],
        rows: &[InsertRow<'_>],
    ) -> impl Future<Output = Result<(), SourceError>> + Send;
    /// Commits the chunk.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// A database's backfill (each database's backfill module): the reads of the candidates
/// and a [`ChunkStore`]. Every `Backfiller` is a [`Backfill`], the object the command runs.
pub trait Backfiller: ChunkStore {
    /// [`Backfill::ids`].
    fn ids(
        &self,
        since: Option<OffsetDateTime>,
    ) -> impl Future<Output = Result<Vec<Uuid>, SourceError>> + Send;
    /// [`Backfill::events`].
    fn events(
        &self,
        ids: &[Uuid],
    ) -> impl Future<Output = Result<Vec<Candidate>, SourceError>> + Send;
    /// [`Backfill::apply`]: [`apply_chunk`], unless the database paces or retries it.
    fn apply(
        &self,
        chunk: &[Candidate],
    ) -> impl Future<Output = Result<ChunkOutcome, SourceError>> + Send
    where
        Self: Sized,
    {
        apply_chunk(self, chunk)
    }
}

impl<T: Backfiller> Backfill for T {
    fn ids(&self, since: Option<OffsetDateTime>) -> BoxFuture<'_, Result<Vec<Uuid>, SourceError>> {
        Box::pin(Backfiller::ids(self, since))
    }

    fn events<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<Vec<Candidate>, SourceError>> {
        Box::pin(Backfiller::events(self, ids))
    }

    fn apply<'a>(
        &'a self,
        chunk: &'a [Candidate],
    ) -> BoxFuture<'a, Result<ChunkOutcome, SourceError>> {
        Box::pin(Backfiller::apply(self, chunk))
    }
}

/// [`Backfill::apply`] over a [`ChunkStore`]: one transaction for the chunk; each aggregate
/// the store holds gets [`plan`]; the others come back deferred, in commit order.
pub async fn apply_chunk<S: ChunkStore>(
    store: &S,
    chunk: &[Candidate],
) -> Result<ChunkOutcome, SourceError> {
    let mut by_key: BTreeMap<AggregateKey, Vec<Candidate>> = BTreeMap::new();
    for c in chunk {
        by_key
            .entry(aggregate_key(&c.event))
            .or_default()
            .push(c.clone());
    }
    let keys: Vec<AggregateKey> = by_key.keys().cloned().collect();
    let mut tx = store.begin().await?;
    let pending = store.hold(&mut tx, &keys).await?;
    let ready: Vec<AggregateKey> = keys
        .iter()
        .filter(|k| pending.contains_key(*k))
        .cloned()
        .collect();
    let handed = store.handed_out(&mut tx, &ready).await?;
    let wanted: Vec<Uuid> = ready
        .iter()
        .flat_map(|k| by_key[k].iter().map(|c| c.event.id))
        .collect();
    let present = store.present(&mut tx, &wanted).await?;
    let mut outcome = ChunkOutcome::default();
    let mut rows: Vec<InsertRow<'_>> = Vec::new();
    let mut taken_out: Vec<Uuid> = Vec::new();
    for key in &ready {
        let candidates = &by_key[key];
        let rows_of = &pending[key];
        let copies: Vec<PendingCopy> = rows_of
            .iter()
            .map(|r| PendingCopy {
                id: r.event.id,
                outbox_seq: r.outbox_seq,
            })
            .collect();
        let decided = plan(
            candidates,
            &present,
            &copies,
            handed.get(key).copied().unwrap_or(HandedOut::Nothing),
        );
        outcome.counts += BackfillCounts {
            copied: decided.copy.len() as u64,
            already_there: decided.already_there,
            skipped_newer_delivered: decided.skipped_newer_delivered,
        };
        if decided.order.is_empty() {
            continue;
        }
        let moved: HashSet<Uuid> = decided.order.iter().copied().collect();
        taken_out.extend(
            rows_of
                .iter()
                .map(|r| r.event.id)
                .filter(|id| moved.contains(id)),
        );
        let mut source: HashMap<Uuid, InsertRow<'_>> = candidates
            .iter()
            .map(|c| {
                let row = InsertRow {
                    event: &c.event,
                    next_attempt_at: None,
                    last_error: None,
                };
                (c.event.id, row)
            })
            .chain(rows_of.iter().map(|r| {
                let row = InsertRow {
                    event: &r.event,
                    next_attempt_at: r.next_attempt_at,
                    last_error: r.last_error.as_deref(),
                };
                (r.event.id, row)
            }))
            .collect();
        rows.extend(decided.order.iter().filter_map(|id| source.remove(id)));
    }
    if !rows.is_empty() {
        store.put_in_line(&mut tx, &taken_out, &rows).await?;
    }
    store.commit(tx).await?;
    outcome.deferred = by_key
        .into_iter()
        .filter(|(k, _)| !pending.contains_key(k))
        .flat_map(|(_, cs)| cs)
        .collect();
    outcome.deferred.sort_by_key(|c| c.outbox_seq);
    Ok(outcome)
}

/// Event ids as a JSON array of hyphenated UUID text (for `json_each` / `JSON_TABLE`).
pub fn ids_json(ids: &[Uuid]) -> String {
    serde_json::Value::from(
        ids.iter()
            .map(|id| id.hyphenated().to_string())
            .collect::<Vec<_>>(),
    )
    .to_string()
}

/// Aggregates as a JSON array of `[aggregate_type, aggregate_id]` pairs.
pub fn keys_json(keys: &[AggregateKey]) -> String {
    serde_json::to_string(keys).unwrap_or_else(|_| "[]".into())
}

/// Refuses to backfill from an outbox that deletes its events once fanned out
/// (`source.on_delivered = "delete"`): there is nothing to copy.
pub fn check_kept(keeps_delivered: bool, outbox: &str) -> Result<(), SourceError> {
    if keeps_delivered {
        return Ok(());
    }
    Err(SourceError::fatal(format!(
        "nothing to backfill from outbox table {outbox}: it runs with source.on_delivered = \"delete\", so fanned-out events are not kept"
    )))
}

/// An event's headers as JSON object text (the `headers` column of MySQL and SQLite).
pub fn headers_json(event: &Event) -> String {
    let headers = event
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()));
    serde_json::Value::Object(headers.collect()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(seq: i64) -> Candidate {
        Candidate {
            outbox_seq: seq,
            event: Event {
                id: Uuid::from_u128(seq as u128),
                position: crate::Position(seq),
                aggregate_type: "Order".into(),
                aggregate_id: "o1".into(),
                event_type: "order.placed".into(),
                payload: bytes::Bytes::new(),
                headers: Vec::new(),
                created_at: OffsetDateTime::UNIX_EPOCH,
                attempts: 0,
            },
        }
    }

    fn id(seq: i64) -> Uuid {
        Uuid::from_u128(seq as u128)
    }

    #[test]
    fn missing_events_go_before_newer_pending_copies() {
        let candidates = [candidate(1), candidate(2), candidate(5)];
        let present: HashSet<Uuid> = [id(5)].into();
        let pending = [
            PendingCopy {
                id: id(0),
                outbox_seq: Some(0),
            },
            PendingCopy {
                id: id(5),
                outbox_seq: Some(5),
            },
            PendingCopy {
                id: id(7),
                outbox_seq: Some(7),
            },
        ];
        let p = plan(&candidates, &present, &pending, HandedOut::Nothing);
        assert_eq!(p.copy, vec![id(1), id(2)]);
        assert_eq!(p.order, vec![id(1), id(2), id(5), id(7)]);
        assert_eq!(p.already_there, 1);
        assert_eq!(p.skipped_newer_delivered, 0);
    }

    #[test]
    fn events_older_than_a_handed_out_copy_are_skipped() {
        let candidates = [candidate(1), candidate(4), candidate(6)];
        let pending = [PendingCopy {
            id: id(8),
            outbox_seq: Some(8),
        }];
        let p = plan(&candidates, &HashSet::new(), &pending, HandedOut::UpTo(5));
        assert_eq!(p.copy, vec![id(6)]);
        assert_eq!(p.order, vec![id(6), id(8)]);
        assert_eq!(p.skipped_newer_delivered, 2);
        let p = plan(&candidates, &HashSet::new(), &pending, HandedOut::Unknown);
        assert!(p.copy.is_empty() && p.order.is_empty());
        assert_eq!(p.skipped_newer_delivered, 3);
    }

    #[test]
    fn a_pending_copy_without_its_outbox_row_stays_first_in_place() {
        let pending = [PendingCopy {
            id: id(100),
            outbox_seq: None,
        }];
        let p = plan(
            &[candidate(3)],
            &HashSet::new(),
            &pending,
            HandedOut::Nothing,
        );
        assert_eq!(p.copy, vec![id(3)]);
        assert_eq!(
            p.order,
            vec![id(3)],
            "the older pending row keeps its place"
        );
    }

    #[test]
    fn nothing_to_copy_leaves_the_pending_rows_alone() {
        let pending = [PendingCopy {
            id: id(2),
            outbox_seq: Some(2),
        }];
        let present: HashSet<Uuid> = [id(2)].into();
        let p = plan(&[candidate(2)], &present, &pending, HandedOut::Nothing);
        assert!(p.order.is_empty());
        assert_eq!(p.already_there, 1);
    }
}
