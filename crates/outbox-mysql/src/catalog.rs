//! The subscription catalog on MySQL/MariaDB: `<table>_subscriptions` beside the outbox
//! table (queries/subscriptions_*.sql). See `outbox_core::catalog`.

use std::sync::Arc;

use outbox_core::catalog::{
    CatalogEntry, CatalogRecord, Recorded, SubscriptionCatalog, SubscriptionState, recorded,
};
use outbox_core::sink::BoxFuture;
use outbox_core::{Identifier, SourceError};
use sqlx::{Executor, MySqlPool};
use time::PrimitiveDateTime;

use crate::sql::{render, stmt};

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../queries/", $name, ".sql"))
    };
}

/// The catalog's queries, rendered for one outbox table.
#[derive(Debug, Clone)]
struct Queries {
    create: Arc<str>,
    read_one: Arc<str>,
    upsert: Arc<str>,
    list: Arc<str>,
    set_state: Arc<str>,
    remove: Arc<str>,
}

/// The subscription catalog of one MySQL/MariaDB outbox table.
#[derive(Debug, Clone)]
pub(crate) struct MySqlCatalog {
    pool: MySqlPool,
    table: String,
    q: Queries,
}

impl MySqlCatalog {
    pub(crate) fn new(pool: MySqlPool, table: &Identifier) -> Self {
        let r = |t: &str| -> Arc<str> { render(t, table).into() };
        Self {
            pool,
            table: format!("{table}_subscriptions"),
            q: Queries {
                create: r(query_file!("subscriptions_create")),
                read_one: r(query_file!("subscriptions_read_one")),
                upsert: r(query_file!("subscriptions_upsert")),
                list: r(query_file!("subscriptions_list")),
                set_state: r(query_file!("subscriptions_set_state")),
                remove: r(query_file!("subscriptions_remove")),
            },
        }
    }

    fn error(&self, e: &sqlx::Error) -> SourceError {
        let missing = e
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|c| c == "42S02");
        if missing {
            SourceError::fatal(format!(
                "the subscription catalog {} does not exist; run `outbox migrate`",
                self.table
            ))
        } else {
            SourceError::unavailable(format!(
                "subscription catalog {}: {}",
                self.table,
                outbox_core::relay::ErrorChain(e)
            ))
        }
    }

    async fn record_all(
        &self,
        records: &[CatalogRecord],
    ) -> Result<Vec<(String, Recorded)>, sqlx::Error> {
        // DDL commits on its own in MySQL: the table first, then one transaction.
        (&self.pool)
            .execute(sqlx::query(stmt(&self.q.create)))
            .await?;
        let mut tx = self.pool.begin().await?;
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let before: Option<(String, String)> = sqlx::query_as(stmt(&self.q.read_one))
                .bind(&r.name)
                .fetch_optional(&mut *tx)
                .await?;
            sqlx::query(stmt(&self.q.upsert))
                .bind(&r.name)
                .bind(&r.filter)
                .bind(&r.sink)
                .bind(r.state.as_str())
                .execute(&mut *tx)
                .await?;
            let outcome = recorded(before.as_ref().map(|(f, s)| (f.as_str(), s.as_str())), r);
            out.push((r.name.clone(), outcome));
        }
        tx.commit().await?;
        Ok(out)
    }
}

impl SubscriptionCatalog for MySqlCatalog {
    fn record<'a>(
        &'a self,
        records: &'a [CatalogRecord],
    ) -> BoxFuture<'a, Result<Vec<(String, Recorded)>, SourceError>> {
        Box::pin(async move { self.record_all(records).await.map_err(|e| self.error(&e)) })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<CatalogEntry>, SourceError>> {
        Box::pin(async move {
            let rows: Vec<(String, String, String, String, PrimitiveDateTime)> =
                sqlx::query_as(stmt(&self.q.list))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.error(&e))?;
            rows.into_iter()
                .map(|(name, filter, sink, state, created_at)| {
                    Ok(CatalogEntry {
                        name,
                        filter,
                        sink,
                        state: SubscriptionState::parse(&state)?,
                        created_at: created_at.assume_utc(),
                    })
                })
                .collect()
        })
    }

    fn set_state<'a>(
        &'a self,
        name: &'a str,
        state: SubscriptionState,
    ) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            let done = sqlx::query(stmt(&self.q.set_state))
                .bind(state.as_str())
                .bind(name)
                .execute(&self.pool)
                .await
                .map_err(|e| self.error(&e))?;
            Ok(done.rows_affected() > 0)
        })
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, SourceError>> {
        Box::pin(async move {
            let done = sqlx::query(stmt(&self.q.remove))
                .bind(name)
                .execute(&self.pool)
                .await
                .map_err(|e| self.error(&e))?;
            Ok(done.rows_affected() > 0)
        })
    }
}
