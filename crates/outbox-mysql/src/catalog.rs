//! The subscription catalog on MySQL/MariaDB: `<table>_subscriptions` beside the outbox
//! table (queries/subscriptions_*.sql). The flow is `outbox_core::sql_catalog`'s; this file
//! runs its statements.

use outbox_core::catalog::{CatalogRecord, SubscriptionState};
use outbox_core::sql_catalog::{CatalogQueries, CatalogRow, CatalogSql};
use outbox_core::{Identifier, catalog_queries};
use sqlx::{Executor, MySql, MySqlPool, Transaction};
use time::PrimitiveDateTime;

use crate::sql::{render, stmt};

/// The subscription catalog of one MySQL/MariaDB outbox table.
#[derive(Debug, Clone)]
pub(crate) struct MySqlCatalog {
    pool: MySqlPool,
    table: String,
    q: CatalogQueries,
}

impl MySqlCatalog {
    pub(crate) fn new(pool: MySqlPool, table: &Identifier) -> Self {
        Self {
            pool,
            table: format!("{table}_subscriptions"),
            q: catalog_queries!(|t: &str| render(t, table)),
        }
    }
}

impl CatalogSql for MySqlCatalog {
    type Error = sqlx::Error;
    type Tx = Transaction<'static, MySql>;

    fn table(&self) -> &str {
        &self.table
    }

    fn is_missing(e: &sqlx::Error) -> bool {
        outbox_sql::error::has_code(e, "42S02")
    }

    async fn begin(&self) -> Result<Self::Tx, sqlx::Error> {
        // DDL commits on its own in MySQL: the table first, then one transaction.
        (&self.pool)
            .execute(sqlx::query(stmt(&self.q.create)))
            .await?;
        self.pool.begin().await
    }

    async fn upsert(
        &self,
        tx: &mut Self::Tx,
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
            .bind(r.state.as_str())
            .execute(&mut **tx)
            .await?;
        Ok(before)
    }

    async fn commit(tx: Self::Tx) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    async fn rows(&self) -> Result<Vec<CatalogRow>, sqlx::Error> {
        let rows: Vec<(String, String, String, String, PrimitiveDateTime)> =
            sqlx::query_as(stmt(&self.q.list))
                .fetch_all(&self.pool)
                .await?;
        let utc = |(name, filter, sink, state, at): (_, _, _, _, PrimitiveDateTime)| {
            (name, filter, sink, state, at.assume_utc())
        };
        Ok(rows.into_iter().map(utc).collect())
    }

    async fn set_state(&self, name: &str, state: SubscriptionState) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(stmt(&self.q.set_state))
            .bind(state.as_str())
            .bind(name)
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
