//! `outbox verify` on PostgreSQL: what the table says was delivered in a window.
//!
//! - **Polling mode** marks a row `state = 'delivered'` (with `delivered_at`) once the broker
//!   acknowledged it: the delivered rows written in the window are the expected events. With
//!   `on_delivered = "delete"` there are none to read, and the report says delivery cannot be
//!   proven from the table.
//! - **CDC mode** leaves rows `pending`; delivery is the replication slot's confirmed
//!   position. As CDC retention does (`queries/retention_cdc_*.sql`), the ledger observes the
//!   oldest running transaction and the WAL insert position, waits (up to
//!   [`CDC_CONFIRM_WAIT`]) until the slot confirmed that position, and then counts as
//!   delivered exactly the rows whose inserting transaction is older than the observation.

use std::time::{Duration, Instant};

use outbox_core::SourceError;
use outbox_core::admin_rows;
use outbox_core::sink::BoxFuture;
use outbox_core::table_ledger::table_ledger;
use outbox_core::verify::{
    Basis, DeliveryLedger, Ledger, LedgerEvent, RowState, StoredRow, Window,
};
use outbox_sql::rows::fetch_decoded;
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::{Mode, OnDelivered, PostgresConfig};
use crate::error::source_error;
use crate::sql::{Cols, render};

/// How long the CDC ledger waits for the slot to confirm what was committed when it began.
pub const CDC_CONFIRM_WAIT: Duration = Duration::from_secs(30);

/// The delivery ledger of one PostgreSQL outbox table.
#[derive(Debug, Clone)]
pub struct PgLedger {
    pool: crate::db::Db,
    table: String,
    /// `Some(slot)` in CDC mode.
    slot: Option<String>,
    basis: Basis,
    delivered: String,
    undelivered: String,
    lookup: String,
}

/// The delivered-event rows of both modes.
type EventRow = (Uuid, String, String, String, i64, OffsetDateTime);

impl PgLedger {
    /// The ledger of `config`'s table.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        let table = config.qualified_table();
        let cdc = config.mode == Mode::Cdc;
        let (delivered, undelivered) = if cdc {
            (
                include_str!("../queries/verify_cdc_delivered.sql"),
                include_str!("../queries/verify_cdc_undelivered.sql"),
            )
        } else {
            (
                include_str!("../queries/verify_delivered.sql"),
                include_str!("../queries/verify_undelivered.sql"),
            )
        };
        Self {
            pool: crate::db::Db::new(pool, config.transaction_pooling),
            table: table.to_string(),
            slot: cdc.then(|| config.slot.to_string()),
            basis: match (cdc, config.on_delivered) {
                (true, _) => Basis::Stream {
                    detail: String::new(),
                },
                (false, OnDelivered::Mark) => Basis::Marked,
                (false, OnDelivered::Delete) => Basis::Deleted,
            },
            delivered: render(delivered, &table),
            undelivered: render(undelivered, &table),
            lookup: render(include_str!("../queries/verify_lookup.sql"), &table),
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    async fn read(&self, window: Window) -> Result<Ledger, SourceError> {
        match &self.slot {
            None => self.read_polled(window).await,
            Some(slot) => self.read_streamed(window, slot).await,
        }
    }

    async fn read_polled(&self, window: Window) -> Result<Ledger, SourceError> {
        // Rendered by `sql::render` from validated identifiers only.
        let query = crate::sql::query(sqlx::AssertSqlSafe(self.delivered.as_str()))
            .bind(window.since)
            .bind(window.until);
        let delivered = fetch_decoded(query, &self.pool, |r| admin_rows::ledger_event(&Cols(r)))
            .await
            .map_err(|e| self.err("reading delivered events", e))?;
        let counts = crate::sql::query_as(sqlx::AssertSqlSafe(self.undelivered.as_str()))
            .bind(window.since)
            .bind(window.until)
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

    /// Observes the horizon, waits until the slot confirmed it, then reads the rows older
    /// than it (see the module docs).
    async fn read_streamed(&self, window: Window, slot: &str) -> Result<Ledger, SourceError> {
        let (xmin, lsn): (i64, String) =
            crate::sql::query_as(include_str!("../queries/retention_cdc_horizon.sql"))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.err("observing the transaction horizon", e))?;
        let deadline = Instant::now() + CDC_CONFIRM_WAIT;
        let confirmed = loop {
            let row: Option<(Option<bool>, Option<String>)> =
                crate::sql::query_as(include_str!("../queries/retention_cdc_slot_passed.sql"))
                    .bind(slot)
                    .bind(&lsn)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| self.err("reading the replication slot", e))?;
            match row {
                None => {
                    return Err(SourceError::fatal(format!(
                        "CDC mode: replication slot `{slot}` does not exist, so nothing is known to be delivered from {} (run `outbox migrate`, then the relay)",
                        self.table
                    )));
                }
                Some((Some(true), confirmed)) => break confirmed.unwrap_or_default(),
                Some((_, confirmed)) if Instant::now() >= deadline => {
                    return Err(SourceError::fatal(format!(
                        "CDC mode: replication slot `{slot}` has not confirmed the stream up to {lsn} within {}s (confirmed: {}): a relay that is down, or a retrying event, holds it back, so what was committed before now is not known to be delivered; run verify again once the relay caught up",
                        CDC_CONFIRM_WAIT.as_secs(),
                        confirmed.as_deref().unwrap_or("nothing yet")
                    )));
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let horizon = xmin.to_string();
        let rows: Vec<EventRow> =
            crate::sql::query_as(sqlx::AssertSqlSafe(self.delivered.as_str()))
                .bind(window.since)
                .bind(window.until)
                .bind(&horizon)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.err("reading streamed events", e))?;
        let delivered = rows
            .into_iter()
            .map(
                |(id, aggregate_type, aggregate_id, event_type, position, created_at)| {
                    LedgerEvent {
                        id,
                        aggregate_type,
                        aggregate_id,
                        event_type,
                        position,
                        created_at,
                        delivered_at: None,
                    }
                },
            )
            .collect();
        let counts = crate::sql::query_as(sqlx::AssertSqlSafe(self.undelivered.as_str()))
            .bind(window.since)
            .bind(window.until)
            .bind(&horizon)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("counting unconfirmed events", e))?;
        let basis = Basis::Stream {
            detail: format!(
                "CDC: rows whose transaction replication slot `{slot}` confirmed, up to {confirmed}"
            ),
        };
        let notes = vec![
            "CDC: table-less events (pg_logical_emit_message) have no row, so verify counts them as phantoms; it proves delivery of table rows only".to_owned(),
        ];
        Ok(table_ledger(&self.table, basis, delivered, counts, notes))
    }

    async fn find(&self, ids: &[Uuid]) -> Result<Vec<StoredRow>, SourceError> {
        let rows: Vec<(Uuid, String, i64, OffsetDateTime)> =
            crate::sql::query_as(sqlx::AssertSqlSafe(self.lookup.as_str()))
                .bind(ids)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.err("looking up events by id", e))?;
        Ok(rows
            .into_iter()
            .map(|(id, state, position, created_at)| StoredRow {
                id,
                state: RowState::from_column(&state),
                position,
                created_at,
            })
            .collect())
    }
}

impl DeliveryLedger for PgLedger {
    fn delivered(&self, window: Window) -> BoxFuture<'_, Result<Ledger, SourceError>> {
        Box::pin(self.read(window))
    }
    fn lookup<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<Vec<StoredRow>, SourceError>> {
        Box::pin(self.find(ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn verify_queries_render_without_leftover_placeholders() {
        let mut config = PostgresConfig::new("postgres://localhost/app");
        for mode in [Mode::Poll, Mode::Cdc] {
            config.mode = mode;
            let ledger = PgLedger::new(
                sqlx::PgPool::connect_lazy("postgres://localhost/app").expect("lazy pool"),
                &config,
            );
            for sql in [&ledger.delivered, &ledger.undelivered, &ledger.lookup] {
                assert!(!sql.contains("{{"), "{sql}");
            }
        }
    }
}
