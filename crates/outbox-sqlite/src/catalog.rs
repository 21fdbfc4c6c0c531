//! The subscription catalog on SQLite: `<table>_subscriptions` in the outbox's file
//! (queries/subscriptions_*.sql), written in `BEGIN IMMEDIATE` transactions. The flow is
//! `outbox_core::sql_catalog`'s; this file runs its statements.

use outbox_core::catalog::{CatalogRecord, SubscriptionState};
use outbox_core::sql_catalog::{CatalogQueries, CatalogRow, CatalogSql};
use outbox_core::{Identifier, catalog_queries};
use sqlx::{Sqlite, SqlitePool, Transaction};
use time::OffsetDateTime;

use crate::sql::{render, stmt};
use crate::timestamp::{from_micros, to_micros};

/// The subscription catalog of one SQLite outbox table.
#[derive(Debug, Clone)]
pub(crate) struct SqliteCatalog {
    pool: SqlitePool,
    table: String,
    q: CatalogQueries,
}

impl SqliteCatalog {
    pub(crate) fn new(pool: SqlitePool, table: &Identifier) -> Self {
        Self {
            pool,
            table: format!("{table}_subscriptions"),
            q: catalog_queries!(|t: &str| render(t, table)),
        }
    }
}

impl CatalogSql for SqliteCatalog {
    type Error = sqlx::Error;
    /// The transaction, and the time (Unix microseconds) its new rows are created at.
    type Tx = (Transaction<'static, Sqlite>, i64);

    fn table(&self) -> &str {
        &self.table
    }

    fn is_missing(e: &sqlx::Error) -> bool {
        e.as_database_error()
            .is_some_and(|d| d.message().starts_with("no such table"))
    }

    async fn begin(&self) -> Result<Self::Tx, sqlx::Error> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(stmt(&self.q.create)).execute(&mut *tx).await?;
        Ok((tx, to_micros(OffsetDateTime::now_utc())))
    }

    async fn upsert(
        &self,
        (tx, now): &mut Self::Tx,
        r: &CatalogRecord,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        let before = sqlx::query_as(stmt(&self.q.read_one))
            .bind(&r.name)
            .fetch_optional(&mut **tx)
            .await?;
        sqlx::query(stmt(&self.q.upsert))
            .bind(&r.name)
            .bind(&r.filter)
            .bind(&r.sink)
            .bind(*now)
            .bind(r.state.as_str())
            .execute(&mut **tx)
            .await?;
        Ok(before)
    }

    async fn commit((tx, _): Self::Tx) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn rows(&self) -> Result<Vec<CatalogRow>, sqlx::Error> {
        let rows: Vec<(String, String, String, String, i64)> = sqlx::query_as(stmt(&self.q.list))
            .fetch_all(&self.pool)
            .await?;
        let at = |(name, filter, sink, state, micros): (_, _, _, _, i64)| {
            (name, filter, sink, state, from_micros(micros))
        };
        Ok(rows.into_iter().map(at).collect())
    }

    async fn set_state(&self, name: &str, state: SubscriptionState) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(stmt(&self.q.set_state))
            .bind(name)
            .bind(state.as_str())
            .bind(to_micros(OffsetDateTime::now_utc()))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    async fn remove(&self, name: &str) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(stmt(&self.q.remove))
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
