//! `outbox backfill` on MySQL and MariaDB (polling mode): copying retained outbox events
//! into a subscription's table while relays run (the argument: `outbox_core::backfill`,
//! docs/subscriptions.md).
//!
//! The hold on an aggregate, per chunk transaction (`READ COMMITTED`, as every connection of
//! the pool):
//!
//! - **The fan-out**: the aggregate's head row in `<subscription table>_aggregate_heads`,
//!   locked `FOR UPDATE SKIP LOCKED` (`backfill_hold.sql`). Every copy the fan-out makes runs
//!   the table's insert trigger, which upserts that row; so while the backfill holds it, no
//!   new row of the aggregate appears in the table. An aggregate whose head a fan-out holds
//!   now is tried again later. A missing head row is created at 0 first
//!   (`backfill_heads_create.sql`).
//! - **The pipeline**: every pending row of the aggregate, locked `FOR UPDATE SKIP LOCKED`
//!   (`backfill_pending.sql`). The relay's claim skips locked rows, and a row its claim holds
//!   is skipped here: fewer rows locked than pending (`backfill_pending_count.sql`), or a row
//!   held by a live lease-token claim (`source.claim = "lease"`), leaves the aggregate for a
//!   later try, as on PostgreSQL.
//!
//! Under that hold the pending rows that must follow a backfilled event are deleted, the
//! aggregate's head is moved back to the number before them (`backfill_heads_rewind.sql`),
//! and the backfilled events and those rows are inserted in outbox commit order: the trigger
//! numbers them on, so `seq` (the `aggregate_seq` header) stays gap-free in the new order.
//! A deadlock (with a fan-out creating the same head rows) runs the chunk again.

use std::collections::{HashMap, HashSet};

use outbox_core::admin_rows::Columns;
use outbox_core::backfill::{
    AggregateKey, Backfiller, Candidate, ChunkOutcome, ChunkStore, HandedOut, Held, InsertRow,
    PendingRow, apply_chunk, by_aggregate, check_kept, headers_json, ids_json, keys_json,
};
use outbox_core::{Identifier, SourceError};
use outbox_sql::backfill::{PlainColumns, handed_out};
use outbox_sql::rows::fetch_decoded;
use sqlx::mysql::{MySqlDatabaseError, MySqlRow};
use sqlx::{MySql, MySqlPool, Transaction};
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

use crate::config::{Mode, MySqlConfig, OnDelivered};
use crate::error::source_error;
use crate::poll::{decode, utc};
use crate::sql::{Cols, render};

/// How often a chunk that lost a deadlock is run again.
const DEADLOCK_RETRIES: u32 = 20;

/// Backfilling one subscription table from its outbox.
#[derive(Debug)]
pub struct MySqlBackfill {
    pool: MySqlPool,
    outbox: String,
    subscription: String,
    keeps_delivered: bool,
    q: BackfillQueries,
}

#[derive(Debug)]
struct BackfillQueries {
    ids: String,
    events: String,
    outbox_seqs: String,
    heads_create: String,
    hold: String,
    pending: String,
    pending_count: String,
    handed_out: String,
    present: String,
    heads_rewind: String,
    delete_pending: String,
    insert: String,
}

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../queries/", $name, ".sql"))
    };
}

impl BackfillQueries {
    fn new(outbox: &Identifier, sub: &Identifier) -> Self {
        let on_sub = |t: &str| render(t, sub);
        let both = |t: &str| {
            outbox_core::migration::render_sql(t, None, sub, &[("outbox", outbox)])
                .replace('"', "`")
        };
        Self {
            ids: render(query_file!("backfill_ids"), outbox),
            events: render(query_file!("backfill_events"), outbox),
            outbox_seqs: render(query_file!("backfill_outbox_seqs"), outbox),
            heads_create: on_sub(query_file!("backfill_heads_create")),
            hold: on_sub(query_file!("backfill_hold")),
            pending: on_sub(query_file!("backfill_pending")),
            pending_count: on_sub(query_file!("backfill_pending_count")),
            handed_out: both(query_file!("backfill_handed_out")),
            present: on_sub(query_file!("backfill_present")),
            heads_rewind: on_sub(query_file!("backfill_heads_rewind")),
            delete_pending: on_sub(query_file!("backfill_delete_pending")),
            insert: on_sub(query_file!("backfill_insert")),
        }
    }
}

/// A rendered statement: its only dynamic parts are validated, quoted identifiers.
fn stmt(sql: &str) -> sqlx::AssertSqlSafe<&str> {
    sqlx::AssertSqlSafe(sql)
}

impl MySqlBackfill {
    /// Backfilling subscription `subscription`'s table from `config`'s outbox (polling
    /// mode: the binlog source has no fan-out).
    pub fn new(pool: MySqlPool, config: &MySqlConfig, subscription: &str) -> Result<Self, String> {
        if config.mode == Mode::Cdc {
            return Err(
                "source.mode = \"cdc\" has no [[subscription]] fan-out, so there is no subscription table to backfill; run the relay with subscriptions in mode = \"poll\"".into(),
            );
        }
        let sub = outbox_core::backend::subscription_table(&config.table, subscription)?;
        Ok(Self {
            outbox: config.table.to_string(),
            subscription: sub.to_string(),
            keeps_delivered: config.on_delivered == OnDelivered::Mark,
            q: BackfillQueries::new(&config.table, &sub),
            pool,
        })
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.subscription, e)
    }

    /// Fills in the outbox seq of each pending row whose outbox row is still there.
    async fn outbox_seqs(
        &self,
        tx: &mut Transaction<'static, MySql>,
        pending: &mut Held,
    ) -> Result<(), SourceError> {
        let ids: Vec<Uuid> = pending.values().flatten().map(|r| r.event.id).collect();
        if ids.is_empty() {
            return Ok(());
        }
        let seqs: HashMap<String, i64> =
            sqlx::query_as::<_, (String, i64)>(stmt(&self.q.outbox_seqs))
                .bind(ids_json(&ids))
                .fetch_all(&mut **tx)
                .await
                .map_err(|e| source_error("reading outbox positions", &self.outbox, e))?
                .into_iter()
                .collect();
        for row in pending.values_mut().flatten() {
            row.outbox_seq = seqs.get(&row.event.id.hyphenated().to_string()).copied();
        }
        Ok(())
    }
}

impl Backfiller for MySqlBackfill {
    async fn ids(&self, since: Option<OffsetDateTime>) -> Result<Vec<Uuid>, SourceError> {
        check_kept(self.keeps_delivered, &self.outbox)?;
        let version = crate::server::server_version(&self.pool)
            .await
            .map_err(|e| source_error("reading the server version", &self.outbox, e))?;
        version.check_polling().map_err(|why| {
            SourceError::fatal(format!(
                "outbox backfill holds aggregates with FOR UPDATE SKIP LOCKED: {why}"
            ))
        })?;
        let since = since.map(utc);
        let query = sqlx::query(stmt(&self.q.ids)).bind(since).bind(since);
        fetch_decoded(query, &self.pool, |r| Cols(r).id(0))
            .await
            .map_err(|e| source_error("selecting events to backfill", &self.outbox, e))
    }

    async fn events(&self, ids: &[Uuid]) -> Result<Vec<Candidate>, SourceError> {
        let query = sqlx::query(stmt(&self.q.events)).bind(ids_json(ids));
        fetch_decoded(query, &self.pool, decode_candidate)
            .await
            .map_err(|e| source_error("reading events to backfill", &self.outbox, e))
    }

    /// [`apply_chunk`], run again when the server chose the chunk as a deadlock victim.
    async fn apply(&self, chunk: &[Candidate]) -> Result<ChunkOutcome, SourceError> {
        let mut tries = 0;
        loop {
            match apply_chunk(self, chunk).await {
                Err(e) if tries < DEADLOCK_RETRIES && is_deadlock(&e) => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10 * u64::from(tries)))
                        .await;
                    tracing::debug!(error = %outbox_core::relay::ErrorChain(&e), "backfill chunk lost a deadlock; running it again");
                }
                result => return result,
            }
        }
    }
}

impl ChunkStore for MySqlBackfill {
    type Tx = Transaction<'static, MySql>;

    async fn begin(&self) -> Result<Self::Tx, SourceError> {
        self.pool
            .begin()
            .await
            .map_err(|e| self.err("starting a backfill transaction", e))
    }

    async fn hold(&self, tx: &mut Self::Tx, keys: &[AggregateKey]) -> Result<Held, SourceError> {
        let wanted = keys_json(keys);
        sqlx::query(stmt(&self.q.heads_create))
            .bind(&wanted)
            .execute(&mut **tx)
            .await
            .map_err(|e| self.err("creating aggregate head rows", e))?;
        let held: Vec<AggregateKey> = sqlx::query_as(stmt(&self.q.hold))
            .bind(&wanted)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| self.err("holding aggregates", e))?;
        let held_json = keys_json(&held);
        let query = sqlx::query(stmt(&self.q.pending)).bind(&held_json);
        let rows = fetch_decoded(query, &mut **tx, decode_pending)
            .await
            .map_err(|e| self.err("locking pending rows", e))?;
        let mut leased: HashSet<AggregateKey> = HashSet::new();
        let mut pending = by_aggregate(rows.into_iter().map(|(row, lease)| {
            if lease {
                leased.insert(row.key());
            }
            row
        }));
        self.outbox_seqs(tx, &mut pending).await?;
        let counts: Vec<(String, String, i64)> = sqlx::query_as(stmt(&self.q.pending_count))
            .bind(&held_json)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| self.err("counting pending rows", e))?;
        // Held, every pending row locked by this transaction, none under a live lease-token
        // claim: nothing in flight.
        Ok(counts
            .into_iter()
            .filter_map(|(t, i, n)| {
                let key = (t, i);
                let rows = pending.remove(&key).unwrap_or_default();
                (n == rows.len() as i64 && !leased.contains(&key)).then_some((key, rows))
            })
            .collect())
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
        if !taken_out.is_empty() {
            let ids = ids_json(taken_out);
            for (sql, what) in [
                (&self.q.heads_rewind, "moving aggregate heads back"),
                (&self.q.delete_pending, "taking pending rows out of line"),
            ] {
                sqlx::query(stmt(sql))
                    .bind(&ids)
                    .execute(&mut **tx)
                    .await
                    .map_err(|e| self.err(what, e))?;
            }
        }
        for chunk in rows.chunks(crate::producer::BATCH_ROWS) {
            // Only the number of placeholders varies; every value is bound.
            let sql = format!(
                "{} {}",
                self.q.insert.trim_end(),
                vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ")
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for r in chunk {
                let e = r.event;
                query = query
                    .bind(e.id.hyphenated().to_string())
                    .bind(&e.aggregate_type)
                    .bind(&e.aggregate_id)
                    .bind(&e.event_type)
                    .bind(&e.payload[..])
                    .bind(headers_json(e))
                    .bind(utc(e.created_at))
                    .bind(i64::from(e.attempts))
                    .bind(r.next_attempt_at.map_or(READY, utc))
                    .bind(r.last_error);
            }
            query
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

/// Whether `e` comes from a deadlock, a lock wait timeout or a failed AUTO-INC lock (1467);
/// the chunk's transaction is dropped, so running it again is safe.
fn is_deadlock(e: &SourceError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(sqlx::Error::Database(db)) = c.downcast_ref::<sqlx::Error>()
            && let Some(my) = db.try_downcast_ref::<MySqlDatabaseError>()
        {
            return matches!(my.number(), 1213 | 1205 | 1467);
        }
        cause = c.source();
    }
    false
}

/// `next_attempt_at` of a row ready at once (the column's default).
const READY: PrimitiveDateTime = time::macros::datetime!(1970-01-01 00:00:01);

/// A row of `backfill_events.sql` (the claim's layout): the event, with no attempts, at its
/// outbox seq.
fn decode_candidate(r: &MySqlRow) -> Result<Candidate, sqlx::Error> {
    let (mut event, outbox_seq) = decode(r)?;
    event.attempts = 0;
    Ok(Candidate { outbox_seq, event })
}

/// A pending row (claim layout, then next_attempt_at, last_error, leased) and whether a
/// live lease-token claim holds it.
fn decode_pending(r: &MySqlRow) -> Result<(PendingRow, bool), sqlx::Error> {
    let (event, _) = decode(r)?;
    let c = Cols(r);
    let row = PendingRow {
        event,
        next_attempt_at: c.time_opt(10)?,
        last_error: c.text_opt(11)?,
        outbox_seq: None,
    };
    Ok((row, r.flag(12)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backfill_queries_render_without_leftover_placeholders() {
        let config = MySqlConfig::new("mysql://localhost/app");
        let pool = MySqlPool::connect_lazy("mysql://localhost/app").expect("lazy pool");
        let b = MySqlBackfill::new(pool, &config, "analytics").expect("a valid subscription");
        let q = &b.q;
        for sql in [
            &q.ids,
            &q.events,
            &q.outbox_seqs,
            &q.heads_create,
            &q.hold,
            &q.pending,
            &q.pending_count,
            &q.handed_out,
            &q.present,
            &q.heads_rewind,
            &q.delete_pending,
            &q.insert,
        ] {
            assert!(!sql.contains("{{") && !sql.contains('"'), "{sql}");
        }
        assert!(
            q.handed_out.contains("JOIN `outbox` AS o"),
            "{}",
            q.handed_out
        );
        assert!(
            q.hold.contains("`outbox_sub_analytics_aggregate_heads`"),
            "{}",
            q.hold
        );
    }

    #[tokio::test]
    async fn cdc_mode_is_refused_with_the_reason() {
        let mut config = MySqlConfig::new("mysql://localhost/app");
        config.mode = Mode::Cdc;
        let pool = MySqlPool::connect_lazy("mysql://localhost/app").expect("lazy pool");
        let e = MySqlBackfill::new(pool, &config, "analytics").expect_err("refused");
        assert!(e.contains("source.mode = \"cdc\""), "{e}");
    }
}
