//! The polling source: reads ready events in commit order while holding the relay lease, and
//! records every outcome of a batch in one write transaction.
//!
//! See [`SqlitePollSource`] for how one relay per file is enforced.

use std::sync::Arc;

use outbox_core::aggregate_seq::{self, AssignedPositions};
use outbox_core::backend::SettledBatch;
use outbox_core::enqueue::decode_headers;
use outbox_core::source::{Fetched, Settlement};
use outbox_core::{DeadLetterPolicy, Event, Ordering, Source, SourceError};
use outbox_sql::poll::{JsonListOutcomes, claimed_event, invalid_column, record_outcomes};
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::{OnDelivered, SqliteConfig};
use crate::error::source_error;
use crate::lease::{Lease, LeaseState};
use crate::sql::{Cols, Queries, stmt};
use crate::timestamp::to_micros;
use crate::writer::WriteConnection;

/// Reads the outbox by polling, while holding the relay lease.
///
/// # One relay per file
///
/// SQLite has no row locks to share a table between relay replicas, so this source enforces
/// a single active relay with a lease: one row in `<table>_relay_lease` naming the holder
/// and an expiry, compared with the `now` the relay passes in.
///
/// - the first source to fetch takes the lease and renews it while it runs (on its fetches,
///   at most one write a second, and in every settle transaction); only the holder reads
///   events;
/// - a second relay on the same file (another process, or a second source in this one) is a
///   **standby**: its `fetch` returns no events until the holder releases the lease (on
///   shutdown: [`SqlitePollSource::release_lease`], or when the source is dropped) or stops renewing it for `lease_ttl` (it crashed or hung); then it takes over;
/// - so two sources on one file never both return events within one lease period, and a
///   relay restarted after `kill -9` resumes within `lease_ttl` (at once if it comes back
///   under the same holder id: [`SqlitePollSource::with_holder`]).
///
/// Run one source per file: with `relay.workers > 1` the extra sources only stand by.
///
/// # Why no claim transaction
///
/// The PostgreSQL source keeps its claim transaction open while the batch is published; the
/// row locks are the claim. Here the lease is the claim, so `fetch` is a single read
/// statement and `settle` a short `BEGIN IMMEDIATE` transaction; no transaction stays open
/// during a publish, which keeps SQLite's one write lock free for producers and lets WAL
/// checkpoints complete. The write transactions run on a connection of the source's own,
/// outside the pool, which polls for the write lock every millisecond (up to
/// `busy_timeout`) instead of using SQLite's busy handler, whose growing sleeps let a busy
/// producer starve the relay.
pub struct SqlitePollSource {
    pool: SqlitePool,
    queries: Arc<Queries>,
    table: String,
    ordering: Ordering,
    hold_dead: bool,
    on_delivered: OnDelivered,
    lease: Lease,
    /// The delivery positions of the read batch (ordering on), until it settles.
    positions: Option<AssignedPositions>,
    lease_ttl: std::time::Duration,
    writer: WriteConnection,
}

impl std::fmt::Debug for SqlitePollSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlitePollSource")
            .field("table", &self.table)
            .field("ordering", &self.ordering)
            .field("holder", &self.lease.holder())
            .field("holds_lease", &self.lease.is_held())
            .finish_non_exhaustive()
    }
}

impl SqlitePollSource {
    /// A source over `config`'s table using `pool` (see [`crate::connect`]). It takes the
    /// relay lease at its first fetch, under a new random holder id.
    pub fn new(
        pool: SqlitePool,
        config: &SqliteConfig,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> Self {
        let holder = format!("{} pid {}", Uuid::now_v7(), std::process::id());
        Self {
            queries: Arc::new(Queries::new(&config.table)),
            table: config.table.to_string(),
            ordering,
            hold_dead: dead_letter == DeadLetterPolicy::HoldAggregate,
            on_delivered: config.on_delivered,
            lease: Lease::new(holder, config.lease_ttl),
            positions: None,
            lease_ttl: config.lease_ttl,
            writer: WriteConnection::new(&pool, config.busy_timeout),
            pool,
        }
    }

    /// Uses `holder` as the lease holder id instead of a random one, so that a relay restarted
    /// under the same identity (or a test simulating a crash and a restart) takes its own
    /// lease back at once instead of waiting for it to expire. The id must be unique among
    /// relays that may run at the same time: two live sources with one id both claim.
    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        self.lease = Lease::new(holder.into(), self.lease_ttl);
        self
    }

    /// This source's lease holder id (as stored in `<table>_relay_lease.holder`).
    pub fn holder(&self) -> &str {
        self.lease.holder()
    }

    /// Whether this source held the lease at its last fetch or settle.
    pub fn holds_lease(&self) -> bool {
        self.lease.is_held()
    }

    /// Gives the relay lease up, so that a standby relay takes over at its next poll instead
    /// of waiting for the lease to expire. Call it after the relay stopped; a later fetch
    /// takes the lease again if it is free.
    pub async fn release_lease(&mut self) -> Result<(), SourceError> {
        self.lease
            .release(&self.pool, &self.queries)
            .await
            .map_err(|e| source_error("releasing the relay lease", &self.table, e))
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    async fn read_batch(&mut self, limit: usize, now: i64) -> Result<Fetched, SourceError> {
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match self.ordering {
            Ordering::None => {
                sqlx::query(stmt(&self.queries.claim_batch_unordered))
                    .bind(now)
                    .bind(limit_i64)
                    .fetch_all(&self.pool)
                    .await
            }
            // Total order needs nothing more here: seq order is commit order (see the
            // migration) and one relay reads it.
            Ordering::PerAggregate | Ordering::Total => {
                sqlx::query(stmt(&self.queries.claim_batch))
                    .bind(now)
                    .bind(limit_i64)
                    .bind(self.hold_dead)
                    .fetch_all(&self.pool)
                    .await
            }
        }
        .map_err(|e| self.err("reading a batch", e))?;
        let mut events = rows
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err("reading a claimed event", e))?;
        self.positions = None;
        if self.ordering != Ordering::None && !events.is_empty() {
            let heads = rows
                .iter()
                .map(|r| r.try_get::<i64, _>(9))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| self.err("reading a claimed event", e))?;
            self.positions = Some(aggregate_seq::assign(&mut events, &heads));
        }
        Ok(Fetched {
            more: events.len() >= limit,
            events,
            valid_until: self.lease.valid_until(),
        })
    }

    async fn record(&mut self, settlements: &[Settlement], now: i64) -> Result<(), sqlx::Error> {
        let started = tokio::time::Instant::now();
        let batch = SettledBatch::sort(settlements);
        let positions = self.positions.take();
        let conn = self.writer.begin().await?;
        let written = write_outcomes(
            conn,
            &self.queries,
            &self.lease,
            self.on_delivered,
            now,
            batch,
            positions.as_ref().map(|p| (p, settlements)),
        )
        .await;
        match written {
            Ok(still_held) => {
                self.writer.commit().await?;
                self.lease.renewed(still_held, now, started);
                Ok(())
            }
            Err(e) => {
                self.writer.rollback().await;
                Err(e)
            }
        }
    }
}

/// Runs the settle statements in the open write transaction: renew the lease, then one
/// statement per outcome kind, then the delivery positions (`positions`: the batch's, and its
/// settlements, ordering on). Returns whether the lease is still ours.
async fn write_outcomes(
    conn: &mut SqliteConnection,
    queries: &Queries,
    lease: &Lease,
    on_delivered: OnDelivered,
    now: i64,
    mut batch: SettledBatch<'_>,
    positions: Option<(&AssignedPositions, &[Settlement])>,
) -> Result<bool, sqlx::Error> {
    let still_held = lease.renew_in(&mut *conn, queries, now).await?;
    // Failures are decisions of the lease holder; a relay that lost the lease leaves them to
    // the new holder, which attempts these events itself.
    if !still_held {
        batch.retries.clear();
        batch.dead.clear();
    }
    let delivered = [&queries.mark_delivered, &queries.delete_delivered];
    let failed = [&queries.schedule_retry, &queries.dead_letter];
    let statements = JsonListOutcomes::new(delivered, failed, now, |at| to_micros(at).into());
    record_outcomes(&mut *conn, &statements, on_delivered, &batch)
        .await
        .map_err(|f| f.error)?;
    // With the outcomes, in the same transaction; a dead letter counts only when recorded.
    if let Some((positions, settlements)) = positions {
        let advanced = positions.advanced(settlements, still_held);
        if !advanced.is_empty() {
            sqlx::query(stmt(&queries.positions_advance))
                .bind(serde_json::to_string(&advanced).unwrap_or_default())
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(still_held)
}

/// One read row's event.
fn decode(row: &SqliteRow) -> Result<Event, sqlx::Error> {
    let headers: String = row.try_get(6)?;
    let headers = serde_json::from_str(&headers).map_err(|e| invalid_column("headers", e))?;
    claimed_event(&Cols(row), decode_headers(headers))
}

impl Source for SqlitePollSource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        let now = to_micros(now);
        let state = self
            .lease
            .ensure(&self.pool, &mut self.writer, &self.queries, now)
            .await
            .map_err(|e| self.err("taking the relay lease", e))?;
        match state {
            LeaseState::Held => self.read_batch(limit, now).await,
            LeaseState::Standby { .. } => Ok(Fetched::default()),
        }
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        if settlements.is_empty() {
            return Ok(());
        }
        self.record(settlements, to_micros(now))
            .await
            .map_err(|e| self.err("recording batch outcomes", e))
    }
}

impl Drop for SqlitePollSource {
    /// Releases the lease, so that a standby, or this relay started again, takes over at once
    /// rather than after `lease_ttl`. Runs on a short-lived thread of its own with its own
    /// connection, so that it works wherever the source is dropped: in a task, at the end of
    /// `main`, or while the Tokio runtime shuts down. Waits for it at most about a second;
    /// if it fails, the lease simply expires.
    fn drop(&mut self) {
        if !self.lease.is_held() {
            return;
        }
        crate::lease::release_on_drop(
            self.writer.options(),
            Arc::clone(&self.queries.lease_release),
            self.lease.holder().to_owned(),
        );
    }
}
