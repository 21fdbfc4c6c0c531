//! `outbox verify` on SQLite: the delivered rows of a window (polling marks them
//! `state = 'delivered'` with `delivered_at`), and rows looked up by id.

use std::sync::Arc;

use outbox_core::SourceError;
use outbox_core::admin_rows;
use outbox_core::backend::OnDelivered;
use outbox_core::sink::BoxFuture;
use outbox_core::table_ledger::table_ledger;
use outbox_core::verify::{Basis, DeliveryLedger, Ledger, StoredRow, Window};
use outbox_sql::rows::fetch_decoded;
use sqlx::SqlitePool;
use uuid::Uuid;

use crate::config::SqliteConfig;
use crate::error::source_error;
use crate::sql::{Cols, render, stmt};
use crate::timestamp::to_micros;

/// The delivery ledger of one SQLite outbox table.
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    pool: SqlitePool,
    table: String,
    basis: Basis,
    delivered: Arc<str>,
    undelivered: Arc<str>,
    lookup: Arc<str>,
}

impl SqliteLedger {
    /// The ledger of `config`'s table.
    pub fn new(pool: SqlitePool, config: &SqliteConfig) -> Self {
        let r = |sql: &str| -> Arc<str> { render(sql, &config.table).into() };
        Self {
            pool,
            table: config.table.to_string(),
            basis: match config.on_delivered {
                OnDelivered::Mark => Basis::Marked,
                OnDelivered::Delete => Basis::Deleted,
            },
            delivered: r(include_str!("../queries/verify_delivered.sql")),
            undelivered: r(include_str!("../queries/verify_undelivered.sql")),
            lookup: r(include_str!("../queries/verify_lookup.sql")),
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    async fn read(&self, window: Window) -> Result<Ledger, SourceError> {
        let (since, until) = (to_micros(window.since), to_micros(window.until));
        let query = sqlx::query(stmt(&self.delivered)).bind(since).bind(until);
        let delivered = fetch_decoded(query, &self.pool, |r| admin_rows::ledger_event(&Cols(r)))
            .await
            .map_err(|e| self.err("reading delivered events", e))?;
        let counts = sqlx::query_as(stmt(&self.undelivered))
            .bind(since)
            .bind(until)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("counting undelivered events", e))?;
        let basis = self.basis.clone();
        Ok(table_ledger(
            &self.table,
            basis,
            delivered,
            counts,
            Vec::new(),
        ))
    }

    async fn find(&self, ids: &[Uuid]) -> Result<Vec<StoredRow>, SourceError> {
        let json = outbox_core::verify::id_spellings_json(ids);
        let query = sqlx::query(stmt(&self.lookup)).bind(json);
        fetch_decoded(query, &self.pool, |r| admin_rows::stored_row(&Cols(r)))
            .await
            .map_err(|e| self.err("looking up events by id", e))
    }
}

impl DeliveryLedger for SqliteLedger {
    fn delivered(&self, window: Window) -> BoxFuture<'_, Result<Ledger, SourceError>> {
        Box::pin(self.read(window))
    }
    fn lookup<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<Vec<StoredRow>, SourceError>> {
        Box::pin(self.find(ids))
    }
}
