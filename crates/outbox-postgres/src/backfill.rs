//! `outbox backfill` on PostgreSQL: copying retained outbox events into a subscription's table
//! while relays run (the argument: `outbox_core::backfill`, docs/subscriptions.md).
//!
//! The hold on an aggregate, per chunk transaction: the subscription table's per-aggregate
//! advisory lock (the one its insert trigger takes, so the fan-out cannot add a row of the
//! aggregate meanwhile), taken without waiting, then a row lock on every pending row of the
//! aggregate (so its pipeline cannot claim them; a row a relay already claimed makes the
//! aggregate wait for a later try). Under that hold the pending rows are deleted and inserted
//! again together with the backfilled events, in outbox commit order.

use std::collections::{HashMap, HashSet};

use outbox_core::backfill::{
    Backfiller, Candidate, ChunkStore, HandedOut, Held, InsertRow, PendingRow, by_aggregate,
    check_kept,
};
use outbox_core::{QualifiedTable, SourceError};
use outbox_sql::backfill::{aggregate_key, candidate, handed_out, pending_row};
use outbox_sql::rows::fetch_decoded;
use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::{Mode, OnDelivered, PostgresConfig};
use crate::error::source_error;
use crate::event_arrays::EventArrays;
use crate::sql::{Cols, render, render_with};

/// An aggregate's key.
type Key = outbox_core::backfill::AggregateKey;

/// Backfilling one subscription table from its outbox.
#[derive(Debug)]
pub struct PgBackfill {
    db: crate::db::Db,
    outbox: String,
    subscription: String,
    /// The subscription table as its insert trigger names it in the lock key.
    lock_name: String,
    cdc: bool,
    keeps_delivered: bool,
    q: BackfillQueries,
}

#[derive(Debug)]
struct BackfillQueries {
    ids: String,
    events: String,
    hold: String,
    pending: String,
    pending_count: String,
    handed_out: String,
    present: String,
    delete_pending: String,
    insert: String,
}

impl BackfillQueries {
    fn new(outbox: &QualifiedTable, sub: &QualifiedTable) -> Self {
        let both = |t: &str| render_with(t, sub, &[("outbox", &outbox.table)]);
        Self {
            ids: render(include_str!("../queries/outbox_backfill_ids.sql"), outbox),
            events: render(
                include_str!("../queries/outbox_backfill_events.sql"),
                outbox,
            ),
            hold: render(include_str!("../queries/outbox_backfill_hold.sql"), sub),
            pending: both(include_str!("../queries/outbox_backfill_pending.sql")),
            pending_count: render(
                include_str!("../queries/outbox_backfill_pending_count.sql"),
                sub,
            ),
            handed_out: both(include_str!("../queries/outbox_backfill_handed_out.sql")),
            present: render(include_str!("../queries/outbox_backfill_present.sql"), sub),
            delete_pending: render(
                include_str!("../queries/outbox_backfill_delete_pending.sql"),
                sub,
            ),
            insert: render(include_str!("../queries/outbox_backfill_insert.sql"), sub),
        }
    }
}

impl PgBackfill {
    /// Backfilling subscription `subscription`'s table from `config`'s outbox.
    pub fn new(
        pool: sqlx::PgPool,
        config: &PostgresConfig,
        subscription: &str,
    ) -> Result<Self, String> {
        let outbox = config.qualified_table();
        let sub_table = outbox_core::backend::subscription_table(&config.table, subscription)?;
        let sub = QualifiedTable::new(outbox.schema.clone(), sub_table);
        let schema = sub.schema.as_ref().map_or("public", |s| s.as_str());
        Ok(Self {
            db: crate::db::Db::new(pool, config.transaction_pooling),
            outbox: outbox.to_string(),
            subscription: sub.to_string(),
            lock_name: format!("{schema}.{}", sub.table.as_str()),
            cdc: config.mode == Mode::Cdc,
            keeps_delivered: config.mode == Mode::Cdc || config.on_delivered == OnDelivered::Mark,
            q: BackfillQueries::new(&outbox, &sub),
        })
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.subscription, e)
    }
}

impl Backfiller for PgBackfill {
    async fn ids(&self, since: Option<OffsetDateTime>) -> Result<Vec<Uuid>, SourceError> {
        check_kept(self.keeps_delivered, &self.outbox)?;
        // Rendered by `sql::render` from validated identifiers only.
        crate::sql::query_scalar(sqlx::AssertSqlSafe(self.q.ids.as_str()))
            .bind(since)
            .bind(self.cdc)
            .fetch_all(&self.db)
            .await
            .map_err(|e| source_error("selecting events to backfill", &self.outbox, e))
    }

    async fn events(&self, ids: &[Uuid]) -> Result<Vec<Candidate>, SourceError> {
        let query = crate::sql::query(sqlx::AssertSqlSafe(self.q.events.as_str())).bind(ids);
        fetch_decoded(query, &self.db, |r| candidate(r, &Cols(r)))
            .await
            .map_err(|e| source_error("reading events to backfill", &self.outbox, e))
    }
}

impl ChunkStore for PgBackfill {
    type Tx = Transaction<'static, Postgres>;

    async fn begin(&self) -> Result<Self::Tx, SourceError> {
        self.db
            .begin()
            .await
            .map_err(|e| self.err("starting a backfill transaction", e))
    }

    /// The held aggregates of `keys` with their pending rows (see the module docs): the
    /// advisory lock taken, and every pending row locked by this transaction.
    async fn hold(&self, tx: &mut Self::Tx, keys: &[Key]) -> Result<Held, SourceError> {
        let held = self.try_lock_aggregates(tx, keys).await?;
        let mut pending = self.lock_pending(tx, &held).await?;
        let counts = self.pending_counts(tx, &held).await?;
        // Held, and every pending row locked by this transaction: nothing in flight.
        Ok(held
            .into_iter()
            .filter_map(|k| {
                let rows = pending.remove(&k).unwrap_or_default();
                (counts.get(&k).copied().unwrap_or(0) == rows.len() as i64).then_some((k, rows))
            })
            .collect())
    }

    async fn present(&self, tx: &mut Self::Tx, ids: &[Uuid]) -> Result<HashSet<Uuid>, SourceError> {
        Ok(
            crate::sql::query_scalar(sqlx::AssertSqlSafe(self.q.present.as_str()))
                .bind(ids)
                .fetch_all(&mut **tx)
                .await
                .map_err(|e| self.err("reading the subscription's event ids", e))?
                .into_iter()
                .collect(),
        )
    }

    async fn put_in_line(
        &self,
        tx: &mut Self::Tx,
        taken_out: &[Uuid],
        rows: &[InsertRow<'_>],
    ) -> Result<(), SourceError> {
        crate::sql::query(sqlx::AssertSqlSafe(self.q.delete_pending.as_str()))
            .bind(taken_out)
            .execute(&mut **tx)
            .await
            .map_err(|e| self.err("taking pending rows out of line", e))?;
        self.insert(tx, rows).await
    }

    async fn handed_out(
        &self,
        tx: &mut Self::Tx,
        keys: &[Key],
    ) -> Result<HashMap<Key, HandedOut>, SourceError> {
        let what = "reading what the subscription delivered";
        self.read_keys(tx, &self.q.handed_out, keys, None, what, handed_out)
            .await
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), SourceError> {
        tx.commit()
            .await
            .map_err(|e| self.err("committing a backfill chunk", e))
    }
}

impl PgBackfill {
    /// Runs `sql` for the aggregates `keys` (bound as an array of types and one of ids, then
    /// `lock_name` when given) and decodes each row; `context` words the errors.
    async fn read_keys<T, C: FromIterator<T>>(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        sql: &str,
        keys: &[Key],
        lock_name: Option<&str>,
        context: &str,
        decode: impl Fn(&PgRow) -> Result<T, sqlx::Error>,
    ) -> Result<C, SourceError> {
        let (types, ids) = split(keys);
        let mut query = crate::sql::query(sqlx::AssertSqlSafe(sql))
            .bind(&types)
            .bind(&ids);
        if let Some(lock_name) = lock_name {
            query = query.bind(lock_name);
        }
        let rows = fetch_decoded(query, &mut **tx, decode)
            .await
            .map_err(|e| self.err(context, e))?;
        Ok(rows.into_iter().collect())
    }

    async fn try_lock_aggregates(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        keys: &[Key],
    ) -> Result<Vec<Key>, SourceError> {
        let lock_name = Some(self.lock_name.as_str());
        let what = "holding aggregates";
        self.read_keys(tx, &self.q.hold, keys, lock_name, what, aggregate_key)
            .await
    }

    async fn lock_pending(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        keys: &[Key],
    ) -> Result<Held, SourceError> {
        let what = "locking pending rows";
        let rows: Vec<PendingRow> = self
            .read_keys(tx, &self.q.pending, keys, None, what, |r| {
                pending_row(r, &Cols(r))
            })
            .await?;
        Ok(by_aggregate(rows))
    }

    async fn pending_counts(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        keys: &[Key],
    ) -> Result<HashMap<Key, i64>, SourceError> {
        let decode = |r: &PgRow| Ok((aggregate_key(r)?, r.try_get(2)?));
        let what = "counting pending rows";
        self.read_keys(tx, &self.q.pending_count, keys, None, what, decode)
            .await
    }

    async fn insert(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        rows: &[InsertRow<'_>],
    ) -> Result<(), SourceError> {
        // Every header is copied.
        let events = EventArrays::new(rows.iter().map(|r| r.event), |_| true);
        let attempts: Vec<i32> = rows
            .iter()
            .map(|r| i32::try_from(r.event.attempts).unwrap_or(i32::MAX))
            .collect();
        let next: Vec<Option<OffsetDateTime>> = rows.iter().map(|r| r.next_attempt_at).collect();
        let errors: Vec<Option<&str>> = rows.iter().map(|r| r.last_error).collect();
        events
            .bind(crate::sql::query(sqlx::AssertSqlSafe(
                self.q.insert.as_str(),
            )))
            .bind(&attempts)
            .bind(&next)
            .bind(&errors)
            .execute(&mut **tx)
            .await
            .map_err(|e| self.err("copying events into the subscription", e))?;
        Ok(())
    }
}

fn split(keys: &[Key]) -> (Vec<&str>, Vec<&str>) {
    keys.iter().map(|(t, i)| (t.as_str(), i.as_str())).unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backfill_queries_render_without_leftover_placeholders() {
        let config = PostgresConfig::new("postgres://localhost/app");
        let b = PgBackfill::new(
            sqlx::PgPool::connect_lazy("postgres://localhost/app").expect("lazy pool"),
            &config,
            "analytics",
        )
        .expect("a valid subscription");
        for sql in [
            &b.q.ids,
            &b.q.events,
            &b.q.hold,
            &b.q.pending,
            &b.q.pending_count,
            &b.q.handed_out,
            &b.q.present,
            &b.q.delete_pending,
            &b.q.insert,
        ] {
            assert!(!sql.contains("{{"), "{sql}");
        }
        assert!(
            b.q.pending.contains("\"public\".\"outbox\""),
            "{}",
            b.q.pending
        );
        assert_eq!(b.lock_name, "public.outbox_sub_analytics");
    }
}
