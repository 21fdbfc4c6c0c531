//! The subscription catalog on PostgreSQL: `<table>_subscriptions` beside the outbox table
//! (queries/subscriptions_*.sql). The flow is `outbox_core::sql_catalog`'s; this file runs
//! its statements, every one through [`Db`] or in its transaction.

use std::sync::Arc;

use outbox_core::catalog::{CatalogRecord, SubscriptionState};
use outbox_core::sql_catalog::{CatalogQueries, CatalogRow, CatalogSql};
use outbox_core::{QualifiedTable, catalog_queries};
use sqlx::{Executor, PgPool, Postgres, Transaction};

use crate::db::Db;
use crate::sql::{query, query_as, render, stmt};

/// The subscription catalog of one PostgreSQL outbox table.
#[derive(Debug, Clone)]
pub(crate) struct PgCatalog {
    /// Every statement in a transaction of its own: the catalog is read once per fan-out
    /// batch, also through a transaction pooler (`crate::db`).
    db: Db,
    table: String,
    q: CatalogQueries,
    /// Serializes `record` against another `migrate` (queries/subscriptions_lock.sql).
    lock: Arc<str>,
}

impl PgCatalog {
    pub(crate) fn new(pool: PgPool, table: &QualifiedTable, pooled: bool) -> Self {
        Self {
            db: Db::new(pool, pooled),
            table: format!("{table}_subscriptions"),
            q: catalog_queries!(|t: &str| render(t, table)),
            lock: render(include_str!("../queries/subscriptions_lock.sql"), table).into(),
        }
    }
}

impl CatalogSql for PgCatalog {
    type Error = sqlx::Error;
    type Tx = Transaction<'static, Postgres>;

    fn table(&self) -> &str {
        &self.table
    }

    fn is_missing(e: &sqlx::Error) -> bool {
        outbox_sql::error::has_code(e, "42P01")
    }

    async fn begin(&self) -> Result<Self::Tx, sqlx::Error> {
        let mut tx = self.db.begin().await?;
        tx.execute(query(stmt(&self.lock))).await?;
        tx.execute(query(stmt(&self.q.create))).await?;
        Ok(tx)
    }

    async fn upsert(
        &self,
        tx: &mut Self::Tx,
        r: &CatalogRecord,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        let before = query_as(stmt(&self.q.read_one))
            .bind(&r.name)
            .fetch_optional(&mut **tx)
            .await?;
        query(stmt(&self.q.upsert))
            .bind(&r.name)
            .bind(&r.filter)
            .bind(&r.sink)
            .bind(r.state.as_str())
            .execute(&mut **tx)
            .await?;
        Ok(before)
    }

    async fn commit(tx: Self::Tx) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn rows(&self) -> Result<Vec<CatalogRow>, sqlx::Error> {
        query_as(stmt(&self.q.list)).fetch_all(&self.db).await
    }

    async fn set_state(&self, name: &str, state: SubscriptionState) -> Result<u64, sqlx::Error> {
        let done = query(stmt(&self.q.set_state))
            .bind(name)
            .bind(state.as_str())
            .execute(&self.db)
            .await?;
        Ok(done.rows_affected())
    }

    async fn remove(&self, name: &str) -> Result<u64, sqlx::Error> {
        let done = query(stmt(&self.q.remove))
            .bind(name)
            .execute(&self.db)
            .await?;
        Ok(done.rows_affected())
    }
}
