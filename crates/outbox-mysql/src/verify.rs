//! `outbox verify` on MySQL / MariaDB: what the table says was delivered in a window.
//!
//! - **Polling mode** marks rows `state = 'delivered'` with `delivered_at`; with
//!   `on_delivered = "delete"` there are none, and the report says delivery cannot be proven
//!   from the table. Each aggregate's events are ordered by `seq`.
//! - **CDC mode** leaves rows `pending`; the relay keeps the binlog position up to which
//!   everything was delivered, and when it last moved. A row counts as delivered when it was
//!   written more than [`CDC_SETTLE`] before that moment: the binlog has no per-row position to
//!   compare, so a transaction left open longer than that, or a relay lagging further behind,
//!   shows its events as lost rather than hiding a loss.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::SourceError;
use outbox_core::admin_rows;
use outbox_core::sink::BoxFuture;
use outbox_core::table_ledger::table_ledger;
use outbox_core::verify::{Basis, DeliveryLedger, Ledger, RowState, StoredRow, Window};
use outbox_sql::rows::fetch_decoded;
use sqlx::MySqlPool;
use uuid::Uuid;

use crate::config::{Mode, MySqlConfig, OnDelivered};
use crate::error::source_error;
use crate::poll::utc;
use crate::sql::{Cols, render, stmt};

/// CDC mode: how long before the kept position last moved a row must have been written to
/// count as delivered.
pub const CDC_SETTLE: Duration = Duration::from_secs(60);

/// The delivery ledger of one MySQL outbox table.
#[derive(Debug, Clone)]
pub struct MySqlLedger {
    pool: MySqlPool,
    table: String,
    basis: Basis,
    cdc: Option<Arc<crate::cdc::CdcQueries>>,
    delivered: Arc<str>,
    undelivered: Arc<str>,
    lookup: Arc<str>,
}

impl MySqlLedger {
    /// The ledger of `config`'s table.
    pub fn new(pool: MySqlPool, config: &MySqlConfig) -> Self {
        let r = |sql: &str| -> Arc<str> { render(sql, &config.table).into() };
        let cdc = config.mode == Mode::Cdc;
        Self {
            pool,
            table: config.table.to_string(),
            basis: match (cdc, config.on_delivered) {
                (true, _) => Basis::Stream {
                    detail: String::new(),
                },
                (false, OnDelivered::Mark) => Basis::Marked,
                (false, OnDelivered::Delete) => Basis::Deleted,
            },
            cdc: cdc.then(|| Arc::new(crate::cdc::CdcQueries::new(&config.table))),
            delivered: r(if cdc {
                include_str!("../queries/verify_cdc_delivered.sql")
            } else {
                include_str!("../queries/verify_delivered.sql")
            }),
            undelivered: r(include_str!("../queries/verify_undelivered.sql")),
            lookup: r(include_str!("../queries/verify_lookup.sql")),
        }
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    async fn read(&self, window: Window) -> Result<Ledger, SourceError> {
        let mut notes = Vec::new();
        let (until, basis) = match &self.cdc {
            None => (window.until, self.basis.clone()),
            Some(cdc) => {
                let kept = crate::cdc::load_position(&self.pool, cdc)
                    .await
                    .map_err(|e| self.err("reading the CDC position", e))?
                    .ok_or_else(|| {
                        SourceError::fatal(format!(
                            "CDC mode: no binlog position is kept for {} yet, so nothing is known to be delivered (run `outbox migrate`, then the relay)",
                            self.table
                        ))
                    })?;
                let cutoff = kept.moved - CDC_SETTLE;
                notes.push(format!(
                    "CDC: rows written more than {}s before the kept binlog position last moved ({}) count as delivered; later ones as not delivered yet",
                    CDC_SETTLE.as_secs(),
                    outbox_core::admin::when(kept.moved)
                ));
                (
                    window.until.min(cutoff),
                    Basis::Stream {
                        detail: format!(
                            "CDC: rows written before {}, {}s before the kept binlog position {}:{} last moved",
                            outbox_core::admin::when(cutoff),
                            CDC_SETTLE.as_secs(),
                            kept.at.file,
                            kept.at.offset
                        ),
                    },
                )
            }
        };
        let (since_db, until_db) = (utc(window.since), utc(until.max(window.since)));
        let mut query = sqlx::query(stmt(&self.delivered));
        if self.cdc.is_none() {
            query = query.bind(since_db);
        }
        let query = query.bind(since_db).bind(until_db);
        let delivered = fetch_decoded(query, &self.pool, |r| admin_rows::ledger_event(&Cols(r)))
            .await
            .map_err(|e| self.err("reading delivered events", e))?;
        let (mut undelivered, dead): (i64, i64) = sqlx::query_as(stmt(&self.undelivered))
            .bind(since_db)
            .bind(utc(window.until))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err("counting undelivered events", e))?;
        if self.cdc.is_some() {
            // Pending rows are the streamed ones too: those not counted as delivered.
            undelivered = (undelivered - i64::try_from(delivered.len()).unwrap_or(0)).max(0);
        }
        Ok(table_ledger(
            &self.table,
            basis,
            delivered,
            (undelivered, dead),
            notes,
        ))
    }

    async fn find(&self, ids: &[Uuid]) -> Result<Vec<StoredRow>, SourceError> {
        let json = outbox_core::verify::id_spellings_json(ids);
        let query = sqlx::query(stmt(&self.lookup)).bind(json);
        let cdc = self.cdc.is_some();
        fetch_decoded(query, &self.pool, |r| {
            let row = admin_rows::stored_row(&Cols(r))?;
            Ok(StoredRow {
                state: match row.state {
                    // CDC: rows stay pending once streamed.
                    RowState::Undelivered if cdc => RowState::Delivered,
                    other => other,
                },
                ..row
            })
        })
        .await
        .map_err(|e| self.err("looking up events by id", e))
    }
}

impl DeliveryLedger for MySqlLedger {
    fn delivered(&self, window: Window) -> BoxFuture<'_, Result<Ledger, SourceError>> {
        Box::pin(self.read(window))
    }
    fn lookup<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<Vec<StoredRow>, SourceError>> {
        Box::pin(self.find(ids))
    }
}
