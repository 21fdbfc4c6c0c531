//! PostgreSQL behind the core's backend seam: [`PostgresConfig`] opens a [`PgBackend`], which
//! builds the relay's pipelines (polling or CDC) and answers every operator command.
//!
//! Everything PostgreSQL-specific that an operator sees (the replication slot, producers
//! waiting on an aggregate's ordering lock, the transaction holding the vacuum horizon) is
//! rendered here, so the command line prints it without knowing PostgreSQL.
//!
//! This module holds the backend itself (migrate, the relay's pipelines); `open` the config
//! side, `status` `outbox status` and the watchdog, `abilities` the operator abilities
//! (why, dead letters, replay, retention, the producer).

mod abilities;
mod open;
mod status;

use std::sync::Arc;

use outbox_core::admin::{DoctorCheck, DoctorThresholds, StatusReport};
use outbox_core::backend::{Backend, BackendConfig, BoxedSource, Pipelines};
use outbox_core::source::Inspect;
use outbox_core::{RelayConfig, SourceError};
use sqlx::PgPool;
use std::time::Duration;
use time::OffsetDateTime;

use crate::backfill::PgBackfill;
use crate::cdc::{PgCdcSource, setup_cdc};
use crate::config::{Mode, PostgresConfig};
use crate::dead::PgDeadLetters;
use crate::inspect::PgInspector;
use crate::migrate::{MigrateOptions, SCHEMA_VERSION, migrate_with, schema_version};
use crate::poll::PgPollSource;
use crate::producer::PgOutbox;
use crate::replay::PgReplay;
use crate::retention::PgRetention;
use abilities::PgProducer;

/// An opened PostgreSQL outbox.
#[derive(Debug)]
pub struct PgBackend {
    pool: PgPool,
    config: PostgresConfig,
    dead: PgDeadLetters,
    inspector: PgInspector,
    replay: PgReplay,
    retention: PgRetention,
    producer: PgProducer,
    capture: crate::capture::PgCapture,
    ledger: crate::verify::PgLedger,
    catalog: crate::catalog::PgCatalog,
}

impl PgBackend {
    pub(crate) fn config(&self) -> &PostgresConfig {
        &self.config
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The backend over `pool` (see [`crate::connect`]).
    pub fn new(pool: PgPool, config: PostgresConfig) -> Self {
        Self {
            dead: PgDeadLetters::new(pool.clone(), &config),
            inspector: PgInspector::new(pool.clone(), &config),
            replay: PgReplay::new(pool.clone(), &config),
            retention: PgRetention::new(pool.clone(), &config),
            capture: crate::capture::PgCapture::new(pool.clone(), &config),
            ledger: crate::verify::PgLedger::new(pool.clone(), &config),
            catalog: crate::catalog::PgCatalog::new(
                pool.clone(),
                &config.qualified_table(),
                config.transaction_pooling,
            ),
            producer: PgProducer {
                pool: crate::db::Db::new(pool.clone(), config.transaction_pooling),
                outbox: PgOutbox::new(config.qualified_table())
                    .transaction_pooling(config.transaction_pooling),
            },
            pool,
            config,
        }
    }

    pub(super) fn cdc(&self) -> bool {
        self.config.mode == Mode::Cdc
    }

    async fn migrate_lines(&self) -> Result<Vec<String>, SourceError> {
        let table = self.config.qualified_table();
        let report = migrate_with(
            &self.pool,
            &table,
            MigrateOptions::from_config(&self.config),
        )
        .await
        .map_err(|e| fatal(&e))?;
        let mut lines: Vec<String> = report
            .partitions_created
            .iter()
            .map(|p| format!("created partition {p} of {table}"))
            .collect();
        if report.applied.is_empty() {
            lines.push(format!(
                "outbox table {table} is up to date (schema version {})",
                report.version
            ));
        }
        for (v, name) in &report.applied {
            lines.push(format!("applied migration {v} ({name}) to {table}"));
        }
        lines.push(format!(
            "LISTEN/NOTIFY wake-up trigger: {}",
            if report.wakeup_trigger {
                "installed (source.listen_notify = true)"
            } else {
                "not installed"
            }
        ));
        if self.cdc() {
            let cdc = setup_cdc(&self.pool, &self.config)
                .await
                .map_err(|e| fatal(&e))?;
            lines.push(format!(
                "CDC publication `{}`: {} (inserts of {table})",
                self.config.publication,
                match (cdc.publication_created, cdc.publication_table_added) {
                    (true, _) => "created",
                    (_, true) => "table added",
                    _ => "exists",
                }
            ));
            lines.push(format!(
                "CDC replication slot `{}` (pgoutput): {}, streams from {}",
                self.config.slot,
                if cdc.slot_recovery {
                    "created again after it was lost; the relay publishes what the lost slot had not acknowledged from the table first (docs/cdc.md#failover)"
                } else if cdc.slot_created {
                    "created"
                } else {
                    "exists"
                },
                cdc.slot_lsn.as_deref().unwrap_or("?")
            ));
        }
        Ok(lines)
    }

    async fn check_schema(&self) -> Result<(), SourceError> {
        let table = self.config.qualified_table();
        let version = schema_version(&self.pool, &table).await.map_err(|e| {
            SourceError::new(
                crate::error::classify(&e),
                format!("reading the outbox schema version from {}", self.config.url),
            )
            .with_source(e)
        })?;
        match version {
            None => Err(SourceError::fatal(format!(
                "outbox table {table} is not set up in {}; run `outbox migrate` first",
                self.config.url
            ))),
            Some(v) if v < SCHEMA_VERSION => Err(SourceError::fatal(format!(
                "outbox table {table} has schema version {v}, this relay needs {SCHEMA_VERSION}; run `outbox migrate`"
            ))),
            Some(_) => Ok(()),
        }
    }

    async fn pipelines(&self, relay: &RelayConfig) -> Result<Pipelines, SourceError> {
        self.check_schema().await?;
        if self.cdc() {
            // One slot, one stream: a single pipeline (docs/cdc.md).
            let source = PgCdcSource::new(
                self.pool.clone(),
                &self.config,
                relay.ordering,
                relay.dead_letter,
            )
            .map_err(|e| fatal(&e))?;
            let inspector = source.inspector();
            let closed = source.closed();
            return Ok(Pipelines {
                sources: vec![BoxedSource::new(source)],
                inspector: Arc::new(inspector),
                watchdog: None,
                closed: Some(Box::pin(closed.wait())),
            });
        }
        if let Err(e) = PgPollSource::analyze_if_never_analyzed(&self.pool, &self.config).await {
            tracing::warn!(error = %outbox_core::relay::ErrorChain(&e), "could not collect planner statistics; the first claims may be slow");
        }
        let workers = u32::try_from(relay.workers.get()).unwrap_or(u32::MAX);
        let claims = crate::connect_claims(&self.config, &self.pool, workers)
            .await
            .map_err(|e| unavailable(&e))?;
        let sources = (0..relay.workers.get())
            .map(|_| {
                BoxedSource::new(PgPollSource::new(
                    claims.clone(),
                    &self.config,
                    relay.ordering,
                    relay.dead_letter,
                ))
            })
            .collect();
        Ok(Pipelines {
            sources,
            inspector: Arc::new(self.inspector.clone()),
            watchdog: Some(Arc::new(self.inspector.clone())),
            closed: None,
        })
    }
}

impl PgBackend {
    /// Pending events by row state; `None` where the backlog is not row state.
    async fn pending_events(&self) -> Result<Option<u64>, SourceError> {
        if self.cdc() {
            return Ok(None);
        }
        Ok(Some(self.inspector.backlog().await?.pending))
    }

    /// `outbox status` at `now`.
    async fn status_report(
        &self,
        now: OffsetDateTime,
        stuck_after: Duration,
    ) -> Result<StatusReport, SourceError> {
        if self.cdc() {
            self.cdc_status(now).await
        } else {
            self.poll_status(now, stuck_after).await
        }
    }

    /// `outbox doctor`: every database check.
    async fn checks(&self, thresholds: DoctorThresholds) -> Vec<DoctorCheck> {
        crate::doctor::doctor(&self.pool, &self.config, thresholds).await
    }
}

impl Backend for PgBackend {
    fn kind(&self) -> &'static str {
        PostgresConfig::KIND
    }
    fn database(&self) -> String {
        self.config.url.redacted()
    }
    fn table(&self) -> String {
        self.config.qualified_table().to_string()
    }
    fn label(&self) -> String {
        if self.cdc() {
            "postgres-cdc".into()
        } else {
            "postgres-poll".into()
        }
    }
    fn single_pipeline(&self) -> bool {
        self.cdc()
    }
    outbox_core::backend_commands!();
    outbox_core::backend_abilities!(
        dead_letters: dead, explain: self, replay: replay, retention: retention,
        producer: producer, forward: producer, catalog: catalog, delivery_ledger: ledger,
        capture: capture, backfill: PgBackfill, scratch: self,
    );
}

/// A setup error (migration, CDC setup) as a fatal source error with its causes.
fn fatal(e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::fatal(outbox_core::relay::ErrorChain(e).to_string())
}

/// A producer error as a retryable source error with its causes.
fn unavailable(e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::unavailable(outbox_core::relay::ErrorChain(e).to_string())
}
