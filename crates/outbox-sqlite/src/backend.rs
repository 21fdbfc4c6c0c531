//! SQLite behind the core's backend seam: [`SqliteConfig`] opens a [`SqliteBackend`], which
//! builds the relay's single pipeline (one writer, a lease) and answers the operator commands.
//! `outbox replay` puts delivered rows back in line (`crate::replay`).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::admin::{
    DeliveryModel, DoctorCheck, DoctorThresholds, EventStory, Explanation, HeldAggregate,
    StatusReport, Verdict,
};
use outbox_core::backend::{
    Backend, BackendConfig, BoxedSource, OpenError, OpenOptions, Pipelines, SchemaFixes,
    schema_check,
};
use outbox_core::sink::BoxFuture;
use outbox_core::source::Inspect;
use outbox_core::{RelayConfig, SourceError, SourceErrorKind};
use sqlx::{Row, SqlitePool};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::backfill::SqliteBackfill;
use crate::config::SqliteConfig;
use crate::dead::SqliteDeadLetters;
use crate::inspect::SqliteInspector;
use crate::migrate::{SCHEMA_VERSION, migrate, schema_version};
use crate::poll::SqlitePollSource;
use crate::producer::SqliteOutbox;
use crate::retention::{SqliteRetention, SqliteRetentionError};

/// What `outbox doctor` says to do about the outbox table's schema.
const SCHEMA_FIXES: SchemaFixes = SchemaFixes {
    migrate: "run `outbox migrate` (the relay also migrates SQLite when it starts)",
    unreadable: "check that source.path is an outbox database",
};

impl BackendConfig for SqliteConfig {
    const KIND: &'static str = "sqlite";

    fn claims_url(url: &str) -> bool {
        url.starts_with("sqlite:") || url.ends_with(".db")
    }

    fn validate(&self, relay: &RelayConfig) -> Result<(), String> {
        SqliteConfig::validate(self)?;
        // The relay publishes nothing it could not finish before the lease runs out (fencing
        // a paused relay), so a lease shorter than one publish would publish nothing.
        outbox_core::backend::check_claim_outlasts_publish(
            "source.lease_ttl",
            self.lease_ttl,
            relay,
        )
    }

    fn describe(&self) -> String {
        format!("SQLite `{}`", self.path.display())
    }

    fn for_subscription(&self, name: &str) -> Result<Self, String> {
        // The same file, the subscription's own table (with its own relay lease).
        let config = Self {
            table: outbox_core::backend::subscription_table(&self.table, name)?,
            ..self.clone()
        };
        SqliteConfig::validate(&config)?;
        Ok(config)
    }

    fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
        crate::config::scratch_config(self, tag)
    }

    fn open(&self, _options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>> {
        Box::pin(async move {
            let pool = crate::connect(self).await.map_err(|e| {
                OpenError::new(
                    format!("cannot open SQLite database `{}`", self.path.display()),
                    "check source.path and the directory's permissions",
                    e,
                )
            })?;
            Ok(Arc::new(SqliteBackend::new(pool, self.clone())) as Arc<dyn Backend>)
        })
    }
}

/// An opened SQLite outbox.
#[derive(Debug)]
pub struct SqliteBackend {
    pool: SqlitePool,
    config: SqliteConfig,
    dead: SqliteDeadLetters,
    inspector: SqliteInspector,
    retention: SqliteRetention,
    replay: crate::replay::SqliteReplay,
    producer: SqliteProducer,
    ledger: crate::verify::SqliteLedger,
    capture: crate::capture::SqliteCapture,
    catalog: crate::catalog::SqliteCatalog,
}

impl SqliteBackend {
    pub(crate) fn config(&self) -> &SqliteConfig {
        &self.config
    }

    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The backend over `pool` (see [`crate::connect`]).
    pub fn new(pool: SqlitePool, config: SqliteConfig) -> Self {
        Self {
            dead: SqliteDeadLetters::new(pool.clone(), &config.table),
            inspector: SqliteInspector::new(pool.clone(), &config),
            retention: SqliteRetention::new(pool.clone(), &config.table),
            replay: crate::replay::SqliteReplay::new(
                pool.clone(),
                &config.table,
                config.on_delivered,
            ),
            ledger: crate::verify::SqliteLedger::new(pool.clone(), &config),
            capture: crate::capture::SqliteCapture::new(pool.clone(), config.table.clone()),
            catalog: crate::catalog::SqliteCatalog::new(pool.clone(), &config.table),
            producer: SqliteProducer {
                pool: pool.clone(),
                outbox: SqliteOutbox::new(config.table.clone()),
            },
            pool,
            config,
        }
    }

    async fn install(&self) -> Result<(), SourceError> {
        migrate(&self.pool, &self.config.table)
            .await
            .map_err(|e| {
                SourceError::fatal(format!(
                    "preparing the outbox in `{}`: {}",
                    self.config.path.display(),
                    outbox_core::relay::ErrorChain(&e)
                ))
            })
            .map(drop)
    }

    async fn story(&self, id: Uuid, now: OffsetDateTime) -> Result<Explanation, SourceError> {
        let Some(event) = self.dead.show(id, now).await? else {
            return Ok(Explanation::NotFound {
                message: format!(
                    "no event with id {id} in outbox table {} of `{}`",
                    self.config.table,
                    self.config.path.display()
                ),
                notes: Vec::new(),
            });
        };
        // One relay per file and no row locks: nothing else can hold an event back but an
        // earlier dead or retrying one.
        let verdict = match (event.state.as_str(), event.backoff_until) {
            ("delivered", _) => Verdict::Delivered,
            ("dead", _) => Verdict::Dead,
            (_, Some(until)) => Verdict::Backoff { until },
            _ => match self.dead.blocker(&event, now).await? {
                Some(blocker) => Verdict::BlockedByEarlier { blocker },
                None => Verdict::Ready { ahead: 0 },
            },
        };
        Ok(Explanation::Found(Box::new(EventStory {
            event,
            verdict,
            model: DeliveryModel::Lease,
        })))
    }

    /// Aggregates held by a retrying or dead head event (`outbox status`).
    async fn held_aggregates(&self, limit: i64) -> Result<Vec<HeldAggregate>, SourceError> {
        let sql = crate::sql::render(
            include_str!("../queries/outbox_held_aggregates.sql"),
            &self.config.table,
        );
        let err = |e| {
            crate::error::source_error("reading held aggregates", &self.config.table.to_string(), e)
        };
        // Rendered by `sql::render` from a validated identifier only.
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        rows.iter()
            .map(|r| {
                let id: String = r.try_get(2)?;
                Ok(HeldAggregate {
                    aggregate_type: r.try_get(0)?,
                    aggregate_id: r.try_get(1)?,
                    head_id: Uuid::parse_str(&id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                    state: r.try_get(3)?,
                    attempts: r.try_get(4)?,
                    next_attempt_at: r
                        .try_get::<Option<i64>, _>(5)?
                        .map(crate::timestamp::from_micros),
                    last_error: r.try_get(6)?,
                    waiting: r.try_get(7)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(err)
    }

    async fn checks(&self, thresholds: DoctorThresholds) -> Vec<DoctorCheck> {
        let table = &self.config.table;
        let mut out = Vec::new();
        let found = schema_version(&self.pool, table)
            .await
            .map_err(|e| e.to_string());
        if !schema_check(&mut out, table, found, SCHEMA_VERSION, SCHEMA_FIXES) {
            return out;
        }
        out.extend(outbox_core::backend::backlog_or_red(
            self.inspector.backlog().await,
            thresholds.stuck_after,
            "is `outbox relay` running on this file? `outbox status` shows the relay lease",
            "run `outbox migrate`",
        ));
        out
    }
}

impl SqliteBackend {
    /// `outbox migrate`: creates or upgrades the schema; what it did, one line each.
    async fn migrate_lines(&self) -> Result<Vec<String>, SourceError> {
        self.install().await?;
        Ok(vec![format!(
            "outbox table {} in `{}` is up to date",
            self.config.table,
            self.config.path.display()
        )])
    }

    /// Installs the schema, then builds the relay's single pipeline.
    async fn pipelines(&self, relay: &RelayConfig) -> Result<Pipelines, SourceError> {
        // Embedded: the relay installs its own schema.
        self.install().await?;
        // SQLite has one writer: one pipeline, guarded by a lease against a second relay.
        let source = SqlitePollSource::new(
            self.pool.clone(),
            &self.config,
            relay.ordering,
            relay.dead_letter,
        );
        Ok(Pipelines {
            sources: vec![BoxedSource::new(source)],
            inspector: Arc::new(self.inspector.clone()),
            watchdog: None,
            closed: None,
        })
    }

    /// Pending events by row state.
    async fn pending_events(&self) -> Result<Option<u64>, SourceError> {
        Ok(Some(self.inspector.backlog().await?.pending))
    }

    /// `outbox status` at `now`.
    async fn status_report(
        &self,
        now: OffsetDateTime,
        _stuck_after: Duration,
    ) -> Result<StatusReport, SourceError> {
        let backlog = self.inspector.backlog_at(now).await?;
        let mut status = StatusReport::new(self.database(), self.config.table.to_string(), backlog);
        status.held_aggregates = self.held_aggregates(20).await?;
        status.sections.insert(
            "producer_lock_waits".into(),
            serde_json::Value::Array(Vec::new()),
        );
        if let Some(lease) = self.inspector.relay_lease().await? {
            status.head_lines.push(format!(
                "relay lease        held by {} until {}",
                lease.holder,
                outbox_core::admin::when(lease.expires_at)
            ));
            status.sections.insert(
                "relay_lease".into(),
                serde_json::to_value(&lease).unwrap_or_default(),
            );
        }
        Ok(status)
    }
}

impl Backend for SqliteBackend {
    fn kind(&self) -> &'static str {
        SqliteConfig::KIND
    }
    fn database(&self) -> String {
        self.config.path.display().to_string()
    }
    fn table(&self) -> String {
        format!("{} in `{}`", self.config.table, self.config.path.display())
    }
    fn single_pipeline(&self) -> bool {
        true
    }
    outbox_core::backend_commands!();
    outbox_core::backend_abilities!(
        dead_letters: dead, explain: self, replay: replay, retention: retention,
        producer: producer, forward: producer, catalog: catalog, delivery_ledger: ledger,
        capture: capture, backfill: SqliteBackfill, scratch: self,
    );
}

outbox_core::forward_explain!(SqliteBackend, story);

outbox_core::forward_dead_letter_store!(SqliteDeadLetters);

impl From<SqliteRetentionError> for SourceError {
    /// A failed retention statement: retryable, with its causes.
    fn from(e: SqliteRetentionError) -> Self {
        SourceError::new(
            SourceErrorKind::Unavailable,
            outbox_core::relay::ErrorChain(&e).to_string(),
        )
    }
}

outbox_core::forward_retention!(SqliteRetention);

/// The producer library on the backend's own pool (`outbox bench`).
#[derive(Debug)]
struct SqliteProducer {
    pool: SqlitePool,
    outbox: SqliteOutbox,
}

outbox_core::pool_producer!(SqliteProducer, unavailable);

/// A producer error as a retryable source error with its causes.
fn unavailable(e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::unavailable(outbox_core::relay::ErrorChain(e).to_string())
}
