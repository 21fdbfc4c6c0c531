//! PostgreSQL behind the core's backend seam: [`PostgresConfig`] opens a [`PgBackend`], which
//! builds the relay's pipelines (polling or CDC) and answers every operator command.
//!
//! Everything PostgreSQL-specific that an operator sees (the replication slot, producers
//! waiting on an aggregate's ordering lock, the transaction holding the vacuum horizon) is
//! rendered here, so the command line prints it without knowing PostgreSQL.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::admin::{
    DeadLetter, DoctorCheck, DoctorThresholds, Explanation, ReplayPlan, ReplaySelection,
    RetentionPreview, RetentionReport, RetentionSettings, RetrySelection, StatusReport,
    StoredEventDetail, when,
};
use outbox_core::backend::{
    Backend, BackendConfig, BoxedSource, DeadLetterStore, Explain, Forward, OpenError, OpenOptions,
    Pipelines, Producer, Replay, Retention, RetentionProgress, Watchdog,
};
use outbox_core::metrics as m;
use outbox_core::sink::BoxFuture;
use outbox_core::source::Inspect;
use outbox_core::{NewEvent, Ordering, RelayConfig, SourceError, SourceErrorKind};
use sqlx::PgPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::cdc::{PgCdcInspector, PgCdcSource, SlotStatus, setup_cdc};
use crate::config::{Mode, PostgresConfig};
use crate::dead::PgDeadLetters;
use crate::inspect::{OpenTransaction, PgInspector};
use crate::migrate::{MigrateOptions, SCHEMA_VERSION, migrate_with, schema_version};
use crate::poll::PgPollSource;
use crate::producer::PgOutbox;
use crate::replay::{PgReplay, ReplayError};
use crate::retention::{PgRetention, RetentionError};

impl BackendConfig for PostgresConfig {
    const KIND: &'static str = "postgres";

    fn claims_url(url: &str) -> bool {
        url.starts_with("postgres://") || url.starts_with("postgresql://")
    }

    fn validate(&self, relay: &RelayConfig) -> Result<(), String> {
        PostgresConfig::validate(self)?;
        if relay.ordering == Ordering::Total && self.mode != Mode::Cdc {
            return Err("relay.ordering: `total` needs the CDC source (source.mode = \"cdc\"); the polling source offers `none` or `per-aggregate`".into());
        }
        if self.claim_timeout <= relay.publish_timeout {
            return Err(format!(
                "source.claim_timeout: must be longer than relay.publish_timeout ({:?})",
                relay.publish_timeout
            ));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        self.url.redacted()
    }

    fn for_subscription(&self, name: &str) -> Result<Self, String> {
        // A subscription's table is always polled: its rows are written by the fan-out, and
        // its claims keep the subscription's own progress, retries and dead letters.
        let config = Self {
            table: outbox_core::backend::subscription_table(&self.table, name)?,
            mode: Mode::Poll,
            ..self.clone()
        };
        PostgresConfig::validate(&config)?;
        Ok(config)
    }

    fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
        crate::scratch::scratch_config(self, tag)
    }

    fn open(&self, options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>> {
        Box::pin(async move {
            let pool = crate::connect(self, options.connections)
                .await
                .map_err(|e| {
                    OpenError::new(
                        format!("cannot connect to {}", self.url),
                        "check source.url (host, port, user, password, database) and that PostgreSQL runs",
                        e,
                    )
                })?;
            Ok(Arc::new(PgBackend::new(pool, self.clone())) as Arc<dyn Backend>)
        })
    }
}

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

    fn cdc(&self) -> bool {
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

    async fn poll_status(
        &self,
        now: OffsetDateTime,
        stuck_after: Duration,
    ) -> Result<StatusReport, SourceError> {
        let i = &self.inspector;
        let mut status = StatusReport::new(self.database(), self.table(), i.backlog_at(now).await?);
        status.held_aggregates = i.held_aggregates(now, 20).await?;
        let waits = i.lock_waits(20).await?;
        let watchdog = i.watchdog(now, stuck_after).await?;
        status.detail_lines.push(format!(
            "stuck              {} event(s) pending longer than {} (metrics.stuck_after)",
            watchdog.stuck_events,
            humantime::format_duration(stuck_after)
        ));
        status
            .detail_lines
            .push(match &watchdog.oldest_transaction {
                Some(t) => format!("horizon held by    {}", t.describe()),
                None => "horizon held by    no open transaction".to_owned(),
            });
        for w in &waits {
            status.blocking_lines.push(format!(
                "producer waits     pid {} waits for the aggregate lock held by pid {} (transaction age {:.1}s, {}): {}",
                w.waiting_pid,
                w.holder_pid,
                w.holder_xact_age_seconds.unwrap_or(0.0),
                w.holder_state.as_deref().unwrap_or("?"),
                w.holder_query.as_deref().unwrap_or("")
            ));
        }
        status
            .sections
            .insert("producer_lock_waits".into(), to_json(&waits));
        status
            .sections
            .insert("watchdog".into(), to_json(&watchdog));
        Ok(status)
    }

    async fn cdc_status(&self, now: OffsetDateTime) -> Result<StatusReport, SourceError> {
        let cdc = PgCdcInspector::new(self.pool.clone(), &self.config);
        let slot = cdc.slot().await?;
        let mut status =
            StatusReport::new(self.database(), self.table(), cdc.backlog_at(now).await?);
        match &slot {
            Some(slot) => status.head_lines.extend(slot_lines(slot)),
            None => status.head_lines.push(format!(
                "replication slot   `{}` does not exist: a relay with source.on_slot_loss = \"recover\" creates it again and recovers from the table; on a first set-up run `outbox migrate` (docs/cdc.md#failover)",
                self.config.slot
            )),
        }
        let recovery = crate::cdc::recovery_status(&self.pool, &self.config)
            .await
            .map_err(|e| {
                crate::error::source_error("reading the slot recovery", &self.table(), e)
            })?;
        if let Some(r) = &recovery {
            status
                .head_lines
                .push(format!("slot recovery      {}", r.describe()));
            status.sections.insert("slot_recovery".into(), r.to_json());
        }
        status.head_lines.push(
            "(CDC: undelivered events are WAL held by the slot, not row state; `pending` counts only a running relay's memory)".to_owned(),
        );
        status.sections.insert(
            "producer_lock_waits".into(),
            serde_json::Value::Array(Vec::new()),
        );
        if let Some(slot) = &slot {
            status
                .sections
                .insert("replication_slot".into(), to_json(slot));
        }
        Ok(status)
    }

    async fn explain_event(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<Explanation, SourceError> {
        let i = &self.inspector;
        if let Some(story) = i.why(id, now).await? {
            return Ok(Explanation::Found(Box::new(story)));
        }
        let table = self.table();
        let writers = i.uncommitted_writers(10).await?;
        if writers.is_empty() {
            return Ok(Explanation::NotFound {
                message: format!(
                    "no event with id {id} in outbox table {table} (never written, rolled back, or deleted: on_delivered = \"delete\" or retention)"
                ),
                notes: Vec::new(),
            });
        }
        let mut notes = vec![format!(
            "Transactions that wrote to {table} and have not committed yet (an event becomes visible, and publishable, when its transaction commits):"
        )];
        // A producer blocked on its aggregate's ordering lock is a writer too (the insert
        // started); say who it waits for.
        let waits = i.lock_waits(50).await?;
        let text = id.to_string();
        for w in &writers {
            let mut extra = String::new();
            if let Some(lock) = waits.iter().find(|l| l.waiting_pid == w.pid) {
                extra.push_str(&format!(
                    "  <- waits for the aggregate's ordering lock held by pid {}",
                    lock.holder_pid
                ));
            }
            if w.query.as_deref().is_some_and(|q| q.contains(&text)) {
                extra.push_str("  <- its last query names this id");
            }
            notes.push(format!("  {}{extra}", w.describe()));
        }
        Ok(Explanation::NotFound {
            message: format!(
                "no committed event with id {id} in outbox table {table}; if one of the {} open writer(s) above wrote it, it waits for that commit",
                writers.len()
            ),
            notes,
        })
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
    fn migrate(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(self.migrate_lines())
    }
    fn start_relay<'a>(
        &'a self,
        relay: &'a RelayConfig,
    ) -> BoxFuture<'a, Result<Pipelines, SourceError>> {
        Box::pin(self.pipelines(relay))
    }
    fn pending(&self) -> BoxFuture<'_, Result<Option<u64>, SourceError>> {
        Box::pin(async move {
            if self.cdc() {
                return Ok(None);
            }
            Ok(Some(self.inspector.backlog().await?.pending))
        })
    }
    fn status(
        &self,
        now: OffsetDateTime,
        stuck_after: Duration,
    ) -> BoxFuture<'_, Result<StatusReport, SourceError>> {
        Box::pin(async move {
            if self.cdc() {
                self.cdc_status(now).await
            } else {
                self.poll_status(now, stuck_after).await
            }
        })
    }
    fn doctor(&self, thresholds: DoctorThresholds) -> BoxFuture<'_, Vec<DoctorCheck>> {
        Box::pin(crate::doctor::doctor(&self.pool, &self.config, thresholds))
    }
    fn dead_letters(&self) -> Result<&dyn DeadLetterStore, outbox_core::Unsupported> {
        Ok(&self.dead)
    }
    fn explain(&self) -> Result<&dyn Explain, outbox_core::Unsupported> {
        Ok(self)
    }
    fn replay(&self) -> Result<&dyn Replay, outbox_core::Unsupported> {
        Ok(&self.replay)
    }
    fn retention(&self) -> Result<&dyn Retention, outbox_core::Unsupported> {
        Ok(&self.retention)
    }
    fn producer(&self) -> Result<&dyn Producer, outbox_core::Unsupported> {
        Ok(&self.producer)
    }
    fn capture(&self) -> Result<&dyn outbox_core::capture::Capture, outbox_core::Unsupported> {
        Ok(&self.capture)
    }
    fn forward(&self) -> Result<&dyn Forward, outbox_core::Unsupported> {
        Ok(&self.producer)
    }
    fn backfill(
        &self,
        subscription: &str,
    ) -> Result<Box<dyn outbox_core::backfill::Backfill>, outbox_core::Unsupported> {
        crate::backfill::PgBackfill::new(self.pool.clone(), &self.config, subscription)
            .map(|b| Box::new(b) as Box<dyn outbox_core::backfill::Backfill>)
            .map_err(|e| outbox_core::Unsupported::new("postgres", "backfill").with_hint(e))
    }
    fn catalog(
        &self,
    ) -> Result<&dyn outbox_core::catalog::SubscriptionCatalog, outbox_core::Unsupported> {
        Ok(&self.catalog)
    }
    fn delivery_ledger(
        &self,
    ) -> Result<&dyn outbox_core::verify::DeliveryLedger, outbox_core::Unsupported> {
        Ok(&self.ledger)
    }
    fn scratch(&self) -> Result<&dyn outbox_core::backend::Scratch, outbox_core::Unsupported> {
        outbox_core::backend::scratch_only(self.kind(), &self.config.table, self)
    }
}

impl Explain for PgBackend {
    fn explain(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> BoxFuture<'_, Result<Explanation, SourceError>> {
        Box::pin(self.explain_event(id, now))
    }
}

impl DeadLetterStore for PgDeadLetters {
    fn list<'a>(
        &'a self,
        event_type: Option<&'a str>,
        aggregate_id: Option<&'a str>,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, SourceError>> {
        Box::pin(PgDeadLetters::list(self, event_type, aggregate_id, limit))
    }
    fn show(&self, id: Uuid) -> BoxFuture<'_, Result<Option<StoredEventDetail>, SourceError>> {
        Box::pin(PgDeadLetters::show(self, id))
    }
    fn retry<'a>(
        &'a self,
        selection: &'a RetrySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(PgDeadLetters::retry(self, selection))
    }
    fn purge<'a>(
        &'a self,
        before: OffsetDateTime,
        event_type: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(PgDeadLetters::purge(self, before, event_type))
    }
}

fn replay_error(e: ReplayError) -> SourceError {
    match e {
        ReplayError::Source(e) => e,
        other => SourceError::fatal(other.to_string()),
    }
}

impl Replay for PgReplay {
    fn plan<'a>(
        &'a self,
        selection: &'a ReplaySelection,
        preview: usize,
    ) -> BoxFuture<'a, Result<ReplayPlan, SourceError>> {
        let preview = i64::try_from(preview).unwrap_or(i64::MAX);
        Box::pin(async move {
            PgReplay::plan(self, selection, preview)
                .await
                .map_err(replay_error)
        })
    }
    fn ids<'a>(
        &'a self,
        selection: &'a ReplaySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(async move { PgReplay::ids(self, selection).await.map_err(replay_error) })
    }
    fn replay_batch<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<u64, SourceError>> {
        Box::pin(async move {
            PgReplay::replay_batch(self, ids)
                .await
                .map_err(replay_error)
        })
    }
}

fn retention_error(e: RetentionError) -> SourceError {
    let kind = match &e {
        RetentionError::Database { source, .. } => crate::error::classify(source),
        RetentionError::Layout(_) => SourceErrorKind::Fatal,
    };
    SourceError::new(kind, outbox_core::relay::ErrorChain(&e).to_string())
}

impl Retention for PgRetention {
    fn preview(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> BoxFuture<'_, Result<RetentionPreview, SourceError>> {
        Box::pin(async move {
            PgRetention::preview(self, now, keep)
                .await
                .map_err(retention_error)
        })
    }
    fn run<'a>(
        &'a self,
        now: OffsetDateTime,
        settings: &'a RetentionSettings,
        progress: &'a mut RetentionProgress<'_>,
    ) -> BoxFuture<'a, Result<RetentionReport, SourceError>> {
        Box::pin(async move {
            let mut step = |n: u64| -> ControlFlow<()> { progress(n) };
            PgRetention::run(self, now, settings, &mut step)
                .await
                .map_err(retention_error)
        })
    }
}

/// The producer library on the backend's own pool (`outbox bench`).
#[derive(Debug)]
struct PgProducer {
    pool: crate::db::Db,
    outbox: PgOutbox,
}

impl Producer for PgProducer {
    fn fill<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            self.outbox
                .enqueue_batch(&self.pool, events)
                .await
                .map(drop)
                .map_err(|e| unavailable(&e))
        })
    }
    fn commit<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await.map_err(|e| unavailable(&e))?;
            self.outbox
                .enqueue_batch(&mut *tx, events)
                .await
                .map_err(|e| unavailable(&e))?;
            tx.commit().await.map_err(|e| unavailable(&e))
        })
    }
}

impl Forward for PgProducer {
    fn copy_in<'a>(
        &'a self,
        events: &'a [outbox_core::Event],
    ) -> BoxFuture<'a, Result<u64, SourceError>> {
        Box::pin(async move {
            self.outbox
                .copy_in(&self.pool, events)
                .await
                .map_err(|e| unavailable(&e))
        })
    }
}

impl Watchdog for PgInspector {
    fn check(&self, stuck_after: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let now = OffsetDateTime::now_utc();
            let w = match self.watchdog(now, stuck_after).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %outbox_core::relay::ErrorChain(&e), "watchdog: could not read stuck events and open transactions");
                    return;
                }
            };
            metrics::gauge!(m::STUCK_EVENTS).set(w.stuck_events as f64);
            if w.stuck_events > 0 {
                tracing::warn!(
                    stuck_events = w.stuck_events,
                    stuck_after = ?stuck_after,
                    "events pending longer than metrics.stuck_after; `outbox status` shows what holds them, `outbox why ID` explains one"
                );
            }
            let (age, pid) = w
                .oldest_transaction
                .as_ref()
                .map_or((0.0, 0.0), |t| (t.xact_age_seconds, f64::from(t.pid)));
            metrics::gauge!(m::OLDEST_TRANSACTION_AGE_SECONDS).set(age);
            metrics::gauge!(m::OLDEST_TRANSACTION_PID).set(pid);
            if let Some(t) = w.oldest_transaction
                && t.xact_age_seconds > stuck_after.as_secs_f64()
            {
                tracing::warn!(
                    pid = t.pid,
                    transaction_age_seconds = t.xact_age_seconds,
                    state = t.state.as_deref().unwrap_or("?"),
                    query_start = ?t.query_start,
                    query = t.query.as_deref().unwrap_or(""),
                    "a long transaction holds the xmin horizon (vacuum cannot clean the outbox table); end it with pg_terminate_backend(pid) if it is stuck"
                );
            }
        })
    }
}

impl OpenTransaction {
    /// One open transaction for a human: pid, state, age, query start, query.
    pub fn describe(&self) -> String {
        format!(
            "pid {} ({}, user {}, application `{}`): transaction open {:.1}s, last query started {}: {}",
            self.pid,
            self.state.as_deref().unwrap_or("?"),
            self.user.as_deref().unwrap_or("?"),
            self.application_name.as_deref().unwrap_or(""),
            self.xact_age_seconds,
            self.query_start.map(when).unwrap_or_else(|| "?".to_owned()),
            self.query.as_deref().unwrap_or("").trim()
        )
    }
}

/// The replication slot in `outbox status`.
fn slot_lines(slot: &SlotStatus) -> Vec<String> {
    let mib = |b: Option<i64>| {
        b.map_or("?".to_owned(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        })
    };
    let mut lines = vec![
        format!(
            "replication slot   `{}`: {} (wal_status {}), confirmed up to {}",
            slot.slot,
            match slot.active_pid {
                Some(pid) if slot.active => format!("streaming to pid {pid}"),
                _ => "no relay streaming".to_owned(),
            },
            slot.wal_status.as_deref().unwrap_or("?"),
            slot.confirmed_flush_lsn.as_deref().unwrap_or("?")
        ),
        format!(
            "slot lag           {} not yet confirmed; {} kept on disk{}",
            mib(slot.retained_wal_bytes),
            mib(slot.restart_lag_bytes),
            slot.safe_wal_size
                .map(|b| format!(
                    "; {} until max_slot_wal_keep_size invalidates it",
                    mib(Some(b))
                ))
                .unwrap_or_default()
        ),
    ];
    if slot.is_lost() {
        lines.push(
            "SLOT LOST          the server invalidated it: see docs/cdc.md#failover".to_owned(),
        );
    }
    lines
}

fn to_json(value: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

/// A setup error (migration, CDC setup) as a fatal source error with its causes.
fn fatal(e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::fatal(outbox_core::relay::ErrorChain(e).to_string())
}

/// A producer error as a retryable source error with its causes.
fn unavailable(e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::unavailable(outbox_core::relay::ErrorChain(e).to_string())
}
