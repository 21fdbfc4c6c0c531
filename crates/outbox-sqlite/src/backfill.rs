//! `outbox backfill` on SQLite: copying retained outbox events into a subscription's table
//! while relays run (the argument: `outbox_core::backfill`, docs/subscriptions.md).
//!
//! The hold on an aggregate, per chunk transaction:
//!
//! - **The fan-out**: every chunk is one `BEGIN IMMEDIATE` transaction, which holds SQLite's
//!   one write lock from its start: no fan-out (nor any other writer) adds a row to the
//!   subscription table until it commits.
//! - **The pipeline**: on SQLite the relay lease is the claim (`poll.rs`): only its holder
//!   reads the subscription table, with plain reads, and no row records what it has in
//!   flight. So each chunk takes the subscription table's lease for the backfill
//!   (`backfill_lease_take.sql`, whoever holds it), and the rows the previous holder may have
//!   read count as in flight until that holder's claim is surely over: its lease expiry
//!   (after which it publishes nothing, `relay/publish.rs`) plus `busy_timeout` (its settle's
//!   wait for the write lock) and a second. Until then an aggregate with a pending row is
//!   left for a later try, as on PostgreSQL an aggregate with a row locked by a relay; an
//!   aggregate with none is held at once. While the backfill holds the lease (renewed by every
//!   chunk for `lease_ttl`), relays stand by; it is released when the backfill ends (or
//!   expires after a kill -9).
//!
//! Under that hold the pending rows that must follow a backfilled event are deleted and
//! inserted again after it, so they get higher seqs: the pipeline reads in seq order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use outbox_core::admin_rows::Columns;
use outbox_core::backfill::{
    AggregateKey, Backfiller, Candidate, ChunkOutcome, ChunkStore, HandedOut, Held, InsertRow,
    apply_chunk, by_aggregate, check_kept, headers_json, ids_json, keys_json,
};
use outbox_core::{Identifier, SourceError};
use outbox_sql::backfill::{candidate, handed_out, pending_row};
use outbox_sql::rows::fetch_decoded;
use sqlx::{Row, Sqlite, SqlitePool, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::{OnDelivered, SqliteConfig};
use crate::error::source_error;
use crate::sql::{Cols, stmt};
use crate::timestamp::{duration_micros, to_micros};

/// Backfilling one subscription table from its outbox.
#[derive(Debug)]
pub struct SqliteBackfill {
    pool: SqlitePool,
    outbox: String,
    subscription: String,
    keeps_delivered: bool,
    /// This backfill's relay-lease holder id.
    holder: String,
    lease_ttl: i64,
    /// After the previous holder's lease expiry: how long its settle may still run.
    settle_margin: i64,
    /// Until when (Unix microseconds) pending rows may be in flight at a previous holder.
    in_flight_until: AtomicI64,
    /// Whether a chunk took the lease (released on drop).
    took_lease: AtomicBool,
    q: BackfillQueries,
}

#[derive(Debug)]
struct BackfillQueries {
    ids: Arc<str>,
    events: Arc<str>,
    lease_read: Arc<str>,
    lease_take: Arc<str>,
    lease_release: Arc<str>,
    pending: Arc<str>,
    handed_out: Arc<str>,
    present: Arc<str>,
    delete_pending: Arc<str>,
    insert: Arc<str>,
}

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../queries/", $name, ".sql"))
    };
}

impl BackfillQueries {
    fn new(outbox: &Identifier, sub: &Identifier) -> Self {
        let on_outbox = |t: &str| -> Arc<str> { crate::sql::render(t, outbox).into() };
        let both = |t: &str| -> Arc<str> {
            outbox_core::migration::render_sql(t, None, sub, &[("outbox", outbox)]).into()
        };
        let lease = crate::sql::Queries::new(sub);
        Self {
            ids: on_outbox(query_file!("backfill_ids")),
            events: on_outbox(query_file!("backfill_events")),
            lease_read: lease.lease_read,
            lease_take: both(query_file!("backfill_lease_take")),
            lease_release: lease.lease_release,
            pending: both(query_file!("backfill_pending")),
            handed_out: both(query_file!("backfill_handed_out")),
            present: both(query_file!("backfill_present")),
            delete_pending: both(query_file!("backfill_delete_pending")),
            insert: both(query_file!("backfill_insert")),
        }
    }
}

impl SqliteBackfill {
    /// Backfilling subscription `subscription`'s table from `config`'s outbox.
    pub fn new(
        pool: SqlitePool,
        config: &SqliteConfig,
        subscription: &str,
    ) -> Result<Self, String> {
        let sub = outbox_core::backend::subscription_table(&config.table, subscription)?;
        Ok(Self {
            outbox: config.table.to_string(),
            subscription: sub.to_string(),
            keeps_delivered: config.on_delivered == OnDelivered::Mark,
            holder: format!(
                "outbox backfill {} pid {}",
                Uuid::now_v7(),
                std::process::id()
            ),
            lease_ttl: duration_micros(config.lease_ttl),
            settle_margin: duration_micros(config.busy_timeout + std::time::Duration::from_secs(1)),
            in_flight_until: AtomicI64::new(i64::MIN),
            took_lease: AtomicBool::new(false),
            q: BackfillQueries::new(&config.table, &sub),
            pool,
        })
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.subscription, e)
    }

    /// Takes the lease for this backfill (see the module docs); returns whether pending rows
    /// may still be in flight at a previous holder.
    async fn take_lease(&self, tx: &mut Transaction<'static, Sqlite>) -> Result<bool, sqlx::Error> {
        let now = to_micros(OffsetDateTime::now_utc());
        let previous = sqlx::query(stmt(&self.q.lease_read))
            .fetch_optional(&mut **tx)
            .await?;
        if let Some(row) = previous {
            let holder: String = row.try_get(0)?;
            let expires_at: i64 = row.try_get(2)?;
            if holder != self.holder {
                self.in_flight_until.fetch_max(
                    expires_at.saturating_add(self.settle_margin),
                    Ordering::SeqCst,
                );
            }
        }
        sqlx::query(stmt(&self.q.lease_take))
            .bind(&self.holder)
            .bind(now)
            .bind(now.saturating_add(self.lease_ttl))
            .execute(&mut **tx)
            .await?;
        self.took_lease.store(true, Ordering::SeqCst);
        Ok(now < self.in_flight_until.load(Ordering::SeqCst))
    }
}

impl ChunkStore for SqliteBackfill {
    type Tx = Transaction<'static, Sqlite>;

    async fn begin(&self) -> Result<Self::Tx, SourceError> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err("starting a backfill transaction", e))
    }

    async fn hold(&self, tx: &mut Self::Tx, keys: &[AggregateKey]) -> Result<Held, SourceError> {
        let maybe_in_flight = self
            .take_lease(tx)
            .await
            .map_err(|e| self.err("taking the subscription's relay lease", e))?;
        let query = sqlx::query(stmt(&self.q.pending)).bind(keys_json(keys));
        let rows = fetch_decoded(query, &mut **tx, |r| pending_row(r, &Cols(r)))
            .await
            .map_err(|e| self.err("reading pending rows", e))?;
        // An aggregate without pending rows is held too.
        let mut out = by_aggregate(rows);
        for key in keys {
            out.entry(key.clone()).or_default();
        }
        if maybe_in_flight {
            // A pending row may be in a batch the previous holder is still publishing.
            out.retain(|_, pending| pending.is_empty());
        }
        Ok(out)
    }

    async fn handed_out(
        &self,
        tx: &mut Self::Tx,
        keys: &[AggregateKey],
    ) -> Result<HashMap<AggregateKey, HandedOut>, SourceError> {
        let query = sqlx::query(stmt(&self.q.handed_out)).bind(keys_json(keys));
        let rows = fetch_decoded(query, &mut **tx, handed_out)
            .await
            .map_err(|e| self.err("reading what the subscription delivered", e))?;
        Ok(rows.into_iter().collect())
    }

    async fn present(&self, tx: &mut Self::Tx, ids: &[Uuid]) -> Result<HashSet<Uuid>, SourceError> {
        let query = sqlx::query(stmt(&self.q.present)).bind(ids_json(ids));
        let found = fetch_decoded(query, &mut **tx, |r| Cols(r).id(0))
            .await
            .map_err(|e| self.err("reading the subscription's event ids", e))?;
        Ok(found.into_iter().collect())
    }

    async fn put_in_line(
        &self,
        tx: &mut Self::Tx,
        taken_out: &[Uuid],
        rows: &[InsertRow<'_>],
    ) -> Result<(), SourceError> {
        sqlx::query(stmt(&self.q.delete_pending))
            .bind(ids_json(taken_out))
            .execute(&mut **tx)
            .await
            .map_err(|e| self.err("taking pending rows out of line", e))?;
        for row in rows {
            let e = row.event;
            sqlx::query(stmt(&self.q.insert))
                .bind(e.id.hyphenated().to_string())
                .bind(&e.aggregate_type)
                .bind(&e.aggregate_id)
                .bind(&e.event_type)
                .bind(&e.payload[..])
                .bind(headers_json(e))
                .bind(to_micros(e.created_at))
                .bind(i64::from(e.attempts))
                .bind(row.next_attempt_at.map_or(0, to_micros))
                .bind(row.last_error)
                .execute(&mut **tx)
                .await
                .map_err(|e| self.err("copying events into the subscription", e))?;
        }
        Ok(())
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), SourceError> {
        tx.commit()
            .await
            .map_err(|e| self.err("committing a backfill chunk", e))
    }
}

impl Backfiller for SqliteBackfill {
    async fn ids(&self, since: Option<OffsetDateTime>) -> Result<Vec<Uuid>, SourceError> {
        check_kept(self.keeps_delivered, &self.outbox)?;
        let query = sqlx::query(stmt(&self.q.ids)).bind(since.map(to_micros));
        fetch_decoded(query, &self.pool, |r| Cols(r).id(0))
            .await
            .map_err(|e| source_error("selecting events to backfill", &self.outbox, e))
    }

    async fn events(&self, ids: &[Uuid]) -> Result<Vec<Candidate>, SourceError> {
        let query = sqlx::query(stmt(&self.q.events)).bind(ids_json(ids));
        fetch_decoded(query, &self.pool, |r| candidate(r, &Cols(r)))
            .await
            .map_err(|e| source_error("reading events to backfill", &self.outbox, e))
    }

    /// [`apply_chunk`], paced for SQLite's one write lock: once this backfill holds the
    /// lease, it waits out a previous holder's claim before a chunk (instead of deferring the
    /// aggregates with pending rows round after round), and after each chunk it leaves the
    /// write lock free for as long as the chunk took (5 ms to 200 ms), so that producers and
    /// the fan-out, whose busy handler polls at up to 100 ms intervals, are not starved by
    /// chunks back to back.
    async fn apply(&self, chunk: &[Candidate]) -> Result<ChunkOutcome, SourceError> {
        if self.took_lease.load(Ordering::SeqCst) {
            let now = to_micros(OffsetDateTime::now_utc());
            let until = self.in_flight_until.load(Ordering::SeqCst);
            if let Ok(wait) = u64::try_from(until.saturating_sub(now))
                && wait > 0
            {
                tokio::time::sleep(std::time::Duration::from_micros(wait)).await;
            }
        }
        let started = std::time::Instant::now();
        let outcome = apply_chunk(self, chunk).await;
        let pause = started.elapsed().clamp(
            std::time::Duration::from_millis(5),
            std::time::Duration::from_millis(200),
        );
        tokio::time::sleep(pause).await;
        outcome
    }
}

impl Drop for SqliteBackfill {
    /// Gives the subscription's relay lease back, so its relays resume at their next poll.
    fn drop(&mut self) {
        if self.took_lease.load(Ordering::SeqCst) {
            crate::lease::release_on_drop(
                self.pool.connect_options().as_ref(),
                Arc::clone(&self.q.lease_release),
                self.holder.clone(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backfill_queries_render_without_leftover_placeholders() {
        let config = SqliteConfig::default();
        let pool = SqlitePool::connect_lazy("sqlite::memory:").expect("lazy pool");
        let b = SqliteBackfill::new(pool, &config, "analytics").expect("a valid subscription");
        for sql in [
            &b.q.ids,
            &b.q.events,
            &b.q.lease_take,
            &b.q.pending,
            &b.q.handed_out,
            &b.q.present,
            &b.q.delete_pending,
            &b.q.insert,
        ] {
            assert!(!sql.contains("{{"), "{sql}");
        }
        assert!(
            b.q.pending.contains("\"outbox_sub_analytics\""),
            "{}",
            b.q.pending
        );
        assert!(b.q.pending.contains("JOIN \"outbox\""), "{}", b.q.pending);
    }
}
