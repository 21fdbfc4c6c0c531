//! MySQL and MariaDB behind the core's backend seam: [`MySqlConfig`] opens a
//! [`MySqlBackend`], which builds the relay's pipelines (one polling source per worker; any
//! number of relay replicas) and answers the operator commands.
//!
//! This module holds the backend itself (migrate, the relay's pipelines, status); `open`
//! the config side, `doctor` the checks of `outbox doctor`, `abilities` the operator
//! abilities (why, dead letters, replay, retention, the producer).

mod abilities;
mod doctor;
mod open;

use std::sync::Arc;
use std::time::Duration;

use outbox_core::admin::StatusReport;
use outbox_core::backend::{Backend, BackendConfig, BoxedSource, Pipelines};
use outbox_core::{RelayConfig, SourceError, Unsupported};
use sqlx::MySqlPool;
use time::OffsetDateTime;

use crate::admin::MySqlAdmin;
use crate::backfill::MySqlBackfill;
use crate::cdc::{MySqlCdcInspector, MySqlCdcSource, binlog_problems, setup_cdc};
use crate::config::{ClaimMode, Mode, MySqlConfig};
use crate::lease::MySqlLeaseSource;
use crate::migrate::{SCHEMA_VERSION, migrate, schema_version};
use crate::poll::MySqlPollSource;
use crate::producer::MySqlOutbox;
use crate::server::server_version;
use abilities::MySqlProducer;

/// An opened MySQL outbox.
#[derive(Debug)]
pub struct MySqlBackend {
    pool: MySqlPool,
    config: MySqlConfig,
    admin: MySqlAdmin,
    producer: MySqlProducer,
    ledger: crate::verify::MySqlLedger,
    capture: crate::capture::MySqlCapture,
    catalog: crate::catalog::MySqlCatalog,
}

fn fatal(context: &str, e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::fatal(format!("{context}: {}", outbox_core::relay::ErrorChain(e)))
}

impl MySqlBackend {
    pub(crate) fn config(&self) -> &MySqlConfig {
        &self.config
    }

    pub(crate) fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    pub(super) fn cdc(&self) -> bool {
        self.config.mode == Mode::Cdc
    }

    /// The backend over `pool` (see [`crate::connect`]).
    pub fn new(pool: MySqlPool, config: MySqlConfig) -> Self {
        Self {
            admin: MySqlAdmin::new(pool.clone(), &config),
            ledger: crate::verify::MySqlLedger::new(pool.clone(), &config),
            capture: crate::capture::MySqlCapture::new(pool.clone(), &config),
            catalog: crate::catalog::MySqlCatalog::new(pool.clone(), &config.table),
            producer: MySqlProducer {
                pool: pool.clone(),
                outbox: MySqlOutbox::new(config.table.clone()),
            },
            pool,
            config,
        }
    }
}

impl MySqlBackend {
    /// `outbox migrate`: creates or upgrades the schema; what it did, one line each.
    async fn migrate_lines(&self) -> Result<Vec<String>, SourceError> {
        if self.cdc() {
            // Checked before anything is created: a refused CDC migrate leaves nothing.
            let problems = binlog_problems(&self.pool)
                .await
                .map_err(|e| fatal("reading the binlog settings", &e))?;
            if !problems.is_empty() {
                return Err(SourceError::fatal(format!(
                    "source.mode = \"cdc\" needs a row-based binlog: {}",
                    problems.join("; ")
                )));
            }
        }
        let report = migrate(&self.pool, &self.config.table)
            .await
            .map_err(|e| fatal("migrating the outbox", &e))?;
        let mut lines: Vec<String> = report
            .applied
            .iter()
            .map(|(v, name)| format!("applied migration {v} ({name})"))
            .collect();
        lines.push(format!(
            "outbox table {} is at schema version {}",
            self.config.table, report.version
        ));
        if self.cdc() {
            let cdc = setup_cdc(&self.pool, &self.config)
                .await
                .map_err(SourceError::fatal)?;
            lines.push(if cdc.position_recorded {
                format!(
                    "CDC: the binlog stream starts at {} (events committed from now on)",
                    cdc.resume_at
                )
            } else {
                format!("CDC: the binlog stream resumes at {} (kept)", cdc.resume_at)
            });
        }
        Ok(lines)
    }

    /// Checks the server and the schema, then builds the relay's pipelines.
    async fn pipelines(&self, relay: &RelayConfig) -> Result<Pipelines, SourceError> {
        let version = server_version(&self.pool)
            .await
            .map_err(|e| fatal("reading the server version", &e))?;
        let lease = match self.config.claim {
            ClaimMode::SkipLocked => {
                version.check_polling().map_err(SourceError::fatal)?;
                false
            }
            ClaimMode::Lease => {
                version.check_lease().map_err(SourceError::fatal)?;
                true
            }
            ClaimMode::Auto => match version.check_polling() {
                Ok(()) => false,
                Err(why) => {
                    version.check_lease().map_err(SourceError::fatal)?;
                    tracing::warn!(server = %version.text, reason = %why, "using the lease-token claim (source.claim = \"auto\")");
                    true
                }
            },
        };
        match schema_version(&self.pool, &self.config.table).await {
            Ok(Some(v)) if v >= SCHEMA_VERSION => {}
            Ok(found) => {
                return Err(SourceError::fatal(format!(
                    "outbox table {} has schema version {}, this build expects {SCHEMA_VERSION}; run `outbox migrate`",
                    self.config.table,
                    found.map_or("none".to_owned(), |v| v.to_string())
                )));
            }
            Err(e) => return Err(fatal("reading the schema version", &e)),
        }
        if self.cdc() {
            // One binlog stream per outbox, held under a lock: a single pipeline.
            let source = MySqlCdcSource::new(
                self.pool.clone(),
                &self.config,
                relay.ordering,
                relay.dead_letter,
            )?;
            return Ok(Pipelines {
                inspector: Arc::new(source.inspector()),
                sources: vec![BoxedSource::new(source)],
                watchdog: None,
                closed: None,
            });
        }
        let sources = (0..relay.workers.get())
            .map(|_| {
                let (pool, config) = (self.pool.clone(), &self.config);
                if lease {
                    BoxedSource::new(MySqlLeaseSource::new(
                        pool,
                        config,
                        relay.ordering,
                        relay.dead_letter,
                    ))
                } else {
                    BoxedSource::new(MySqlPollSource::new(
                        pool,
                        config,
                        relay.ordering,
                        relay.dead_letter,
                    ))
                }
            })
            .collect();
        Ok(Pipelines {
            sources,
            inspector: Arc::new(self.admin.clone()),
            watchdog: None,
            closed: None,
        })
    }

    /// Pending events by row state; `None` in CDC mode (the backlog is the binlog).
    async fn pending_events(&self) -> Result<Option<u64>, SourceError> {
        if self.cdc() {
            return Ok(None);
        }
        Ok(Some(
            self.admin
                .backlog_at(OffsetDateTime::now_utc())
                .await?
                .pending,
        ))
    }

    /// `outbox status` at `now`.
    async fn status_report(
        &self,
        now: OffsetDateTime,
        _stuck_after: Duration,
    ) -> Result<StatusReport, SourceError> {
        if self.cdc() {
            let cdc = MySqlCdcInspector::new(self.pool.clone(), &self.config);
            let mut status = StatusReport::new(
                self.database(),
                self.config.table.to_string(),
                cdc.backlog_at(now).await?,
            );
            status.head_lines.extend(cdc.position_lines().await?);
            return Ok(status);
        }
        let backlog = self.admin.backlog_at(now).await?;
        let mut status = StatusReport::new(self.database(), self.config.table.to_string(), backlog);
        status.held_aggregates = self.admin.held_aggregates(20).await?;
        Ok(status)
    }
}

impl Backend for MySqlBackend {
    fn kind(&self) -> &'static str {
        MySqlConfig::KIND
    }
    fn database(&self) -> String {
        self.config.url.redacted()
    }
    fn table(&self) -> String {
        self.config.table.to_string()
    }
    fn label(&self) -> String {
        if self.cdc() {
            "mysql-cdc".into()
        } else {
            "mysql-poll".into()
        }
    }
    fn single_pipeline(&self) -> bool {
        self.cdc()
    }
    outbox_core::backend_commands!();
    outbox_core::backend_abilities!(
        dead_letters: admin, explain: self, retention: admin, producer: producer,
        forward: producer, catalog: catalog, delivery_ledger: ledger, capture: capture,
        backfill: MySqlBackfill, scratch: self,
    );
    fn replay(&self) -> Result<&dyn outbox_core::backend::Replay, Unsupported> {
        if self.cdc() {
            // Streamed rows are never marked delivered: nothing tells a replay which to pick.
            return Err(Unsupported::new("mysql-cdc", "replay").with_hint(
                "in CDC mode rows stay `pending` after delivery; replay from the broker's retention, or run the relay in poll mode (docs/mysql.md, CDC)",
            ));
        }
        Ok(&self.admin)
    }
}
