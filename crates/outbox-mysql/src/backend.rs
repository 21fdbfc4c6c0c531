//! MySQL and MariaDB behind the core's backend seam: [`MySqlConfig`] opens a
//! [`MySqlBackend`], which builds the relay's pipelines (one polling source per worker; any
//! number of relay replicas) and answers the operator commands.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::admin::{
    DeadLetter, DeliveryModel, DoctorCheck, DoctorThresholds, EventStory, Explanation, ReplayPlan,
    ReplaySelection, RetentionPreview, RetentionReport, RetentionSettings, RetrySelection,
    StatusReport, StoredEventDetail, Verdict,
};
use outbox_core::backend::{
    Backend, BackendConfig, BoxedSource, DeadLetterStore, Explain, OpenError, OpenOptions,
    Pipelines, Producer, Retention, RetentionProgress,
};
use outbox_core::sink::BoxFuture;
use outbox_core::{NewEvent, Ordering, RelayConfig, SourceError, Unsupported};
use sqlx::MySqlPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::admin::MySqlAdmin;
use crate::cdc::{
    MySqlCdcInspector, MySqlCdcSource, binlog_problems, replication_check, setup_cdc,
};
use crate::config::{ClaimMode, Mode, MySqlConfig};
use crate::lease::MySqlLeaseSource;
use crate::migrate::{SCHEMA_VERSION, migrate, schema_version};
use crate::poll::MySqlPollSource;
use crate::producer::MySqlOutbox;
use crate::server::{server_version, session_tls};

impl BackendConfig for MySqlConfig {
    const KIND: &'static str = "mysql";

    fn claims_url(url: &str) -> bool {
        url.starts_with("mysql://") || url.starts_with("mariadb://")
    }

    fn validate(&self, relay: &RelayConfig) -> Result<(), String> {
        MySqlConfig::validate(self)?;
        if relay.ordering == Ordering::Total {
            return Err("relay.ordering: `total` is not offered by the MySQL polling source; use `none` or `per-aggregate`".into());
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
        format!("MySQL {}", self.url.redacted())
    }

    fn for_subscription(&self, name: &str) -> Result<Self, String> {
        if self.mode == Mode::Cdc {
            return Err(
                "source.mode: [[subscription]] needs mode = \"poll\" with kind = \"mysql\" (the binlog source does not fan out yet)"
                    .into(),
            );
        }
        // The same database, the subscription's own table, polled: its rows are written by
        // the fan-out, and its claims keep the subscription's own progress, retries and
        // dead letters.
        let config = Self {
            table: outbox_core::backend::subscription_table(&self.table, name)?,
            ..self.clone()
        };
        MySqlConfig::validate(&config)?;
        Ok(config)
    }

    fn scratch(&self, tag: &outbox_core::Identifier) -> Result<Self, String> {
        crate::scratch::scratch_config(self, tag)
    }

    fn open(&self, options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>> {
        Box::pin(async move {
            let connections = self.max_connections.unwrap_or(options.connections);
            let pool = crate::connect(self, connections).await.map_err(|e| {
                OpenError::new(
                    format!("cannot connect to MySQL at {}", self.url.redacted()),
                    "check source.url (mysql://user:password@host:port/database) and that the server is running",
                    e,
                )
            })?;
            Ok(Arc::new(MySqlBackend::new(pool, self.clone())) as Arc<dyn Backend>)
        })
    }
}

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

    fn cdc(&self) -> bool {
        self.config.mode == Mode::Cdc
    }

    /// CDC mode: the server's binlog settings (checked before the schema: they do not depend
    /// on it, and a refused `migrate` names them).
    async fn binlog_check(&self) -> DoctorCheck {
        match binlog_problems(&self.pool).await {
            Ok(problems) if problems.is_empty() => DoctorCheck::ok(
                "binlog",
                "log_bin ON, binlog_format ROW, binlog_row_image FULL",
            ),
            Ok(problems) => DoctorCheck::red(
                "binlog",
                problems.join("; "),
                "set them in the server's config and restart it (docs/mysql.md, CDC)",
            ),
            Err(e) => DoctorCheck::red(
                "binlog",
                format!(
                    "cannot read the binlog settings: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                "check source.url",
            ),
        }
    }

    /// CDC mode: replication privileges, the kept position and its binlog file.
    async fn cdc_checks(&self, out: &mut Vec<DoctorCheck>) {
        out.push(replication_check(&self.pool, &self.config).await);
        let inspector = MySqlCdcInspector::new(self.pool.clone(), &self.config);
        out.push(inspector.retention_check(OffsetDateTime::now_utc()).await);
        match inspector.position_lines().await {
            Ok(lines) if lines.iter().any(|l| l.contains("none kept")) => {
                out.push(DoctorCheck::red(
                    "cdc_position",
                    "no binlog position is kept for this outbox",
                    "run `outbox migrate` with source.mode = \"cdc\"",
                ))
            }
            Ok(lines) => out.push(DoctorCheck::ok(
                "cdc_position",
                lines
                    .iter()
                    .take(2)
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("; "),
            )),
            Err(e) => out.push(DoctorCheck::red(
                "cdc_position",
                format!("cannot read the CDC position: {e}"),
                "grant REPLICATION CLIENT (MySQL) or BINLOG MONITOR (MariaDB) to source.url's user",
            )),
        }
    }

    /// Whether the relay's connections are encrypted: fine either way on loopback, a
    /// warning when a plain connection crosses a network.
    async fn transport(&self) -> DoctorCheck {
        match session_tls(&self.pool).await {
            Ok(Some(tls)) => DoctorCheck::ok("connection", format!("TLS ({tls})")),
            Ok(None) if self.config.is_loopback() => {
                DoctorCheck::ok("connection", "not encrypted (loopback)")
            }
            Ok(None) => DoctorCheck::warn(
                "connection",
                "not encrypted: passwords and events cross the network in clear",
                "add ?ssl-mode=verify_identity&ssl-ca=/path/ca.pem to source.url (docs/mysql.md, TLS)",
            ),
            Err(e) => DoctorCheck::red(
                "connection",
                format!(
                    "cannot read the session's TLS status: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                "check source.url",
            ),
        }
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

    async fn story(&self, id: Uuid, now: OffsetDateTime) -> Result<Explanation, SourceError> {
        let Some(event) = self.admin.show(id, now).await? else {
            return Ok(Explanation::NotFound {
                message: format!(
                    "no event with id {id} in outbox table {} of {}",
                    self.config.table,
                    self.database()
                ),
                notes: Vec::new(),
            });
        };
        let verdict = match (event.state.as_str(), event.backoff_until) {
            ("delivered", _) => Verdict::Delivered,
            ("dead", _) => Verdict::Dead,
            (_, Some(until)) => Verdict::Backoff { until },
            _ => match self.admin.blocker(&event, now).await? {
                Some(blocker) => Verdict::BlockedByEarlier { blocker },
                None => Verdict::Ready { ahead: 0 },
            },
        };
        Ok(Explanation::Found(Box::new(EventStory {
            event,
            verdict,
            model: DeliveryModel::Claims,
        })))
    }

    async fn checks(&self, thresholds: DoctorThresholds) -> Vec<DoctorCheck> {
        let table = &self.config.table;
        let mut out = Vec::new();
        match server_version(&self.pool).await {
            Ok(v) => out.push(match v.check_polling() {
                Ok(()) => DoctorCheck::ok("server", v.text.clone()),
                Err(why) => {
                    DoctorCheck::red("server", why, "upgrade to MySQL 8.0.4+ or MariaDB 10.6+")
                }
            }),
            Err(e) => {
                out.push(DoctorCheck::red(
                    "server",
                    format!(
                        "cannot read the server version: {}",
                        outbox_core::relay::ErrorChain(&e)
                    ),
                    "check source.url",
                ));
                return out;
            }
        }
        out.push(self.transport().await);
        if self.cdc() {
            out.push(self.binlog_check().await);
        }
        match schema_version(&self.pool, table).await {
            Ok(Some(v)) if v >= SCHEMA_VERSION => {
                out.push(DoctorCheck::ok("schema", format!("version {v}")));
            }
            Ok(found) => {
                out.push(DoctorCheck::red(
                    "schema",
                    format!(
                        "outbox table {table} has schema version {}, this build expects {SCHEMA_VERSION}",
                        found.map_or("none".to_owned(), |v| v.to_string()),
                    ),
                    "run `outbox migrate`",
                ));
                return out;
            }
            Err(e) => {
                out.push(DoctorCheck::red(
                    "schema",
                    format!(
                        "cannot read the schema version: {}",
                        outbox_core::relay::ErrorChain(&e)
                    ),
                    "check the privileges of source.url's user (SELECT on the outbox tables)",
                ));
                return out;
            }
        }
        out.push(self.privileges().await);
        if self.cdc() {
            self.cdc_checks(&mut out).await;
            return out;
        }
        match self.admin.backlog_at(OffsetDateTime::now_utc()).await {
            Ok(b) => out.extend(outbox_core::admin::backlog_checks(
                &b,
                thresholds.stuck_after,
                "is a relay running and reaching the broker? `outbox status` shows held aggregates; `outbox why ID` explains one event",
            )),
            Err(e) => out.push(DoctorCheck::red(
                "oldest_pending",
                format!(
                    "cannot read the backlog: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                "run `outbox migrate`",
            )),
        }
        out
    }
}

impl MySqlBackend {
    /// Whether source.url's user may do what the relay does to the outbox table: `EXPLAIN`
    /// of each statement kind checks the privilege (roles included) without running it.
    async fn privileges(&self) -> DoctorCheck {
        let table = self.admin_table();
        let mut missing = Vec::new();
        for (privilege, statement) in [
            (
                "SELECT",
                format!("EXPLAIN SELECT position FROM {table} WHERE position = 0"),
            ),
            (
                "UPDATE",
                format!("EXPLAIN UPDATE {table} SET state = state WHERE position = 0"),
            ),
            (
                "DELETE",
                format!("EXPLAIN DELETE FROM {table} WHERE position = 0"),
            ),
        ] {
            // The table name is a validated, quoted identifier; nothing else varies.
            match sqlx::query(sqlx::AssertSqlSafe(statement))
                .fetch_all(&self.pool)
                .await
            {
                Ok(_) => {}
                Err(sqlx::Error::Database(db))
                    if db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|m| m.number() == 1142) =>
                {
                    missing.push(privilege);
                }
                Err(e) => {
                    return DoctorCheck::red(
                        "privileges",
                        format!(
                            "cannot check the privileges: {}",
                            outbox_core::relay::ErrorChain(&e)
                        ),
                        "check source.url",
                    );
                }
            }
        }
        if missing.is_empty() {
            return DoctorCheck::ok(
                "privileges",
                format!("SELECT, UPDATE, DELETE on {}", self.config.table),
            );
        }
        DoctorCheck::red(
            "privileges",
            format!(
                "source.url's user lacks {} on outbox table {}: the relay cannot {}",
                missing.join(", "),
                self.config.table,
                if missing.contains(&"SELECT") {
                    "read events"
                } else {
                    "record deliveries"
                }
            ),
            format!(
                "GRANT SELECT, UPDATE, DELETE ON <database>.{} TO <user>",
                self.config.table
            ),
        )
    }

    /// The outbox table, quoted for MySQL (rendered from the validated identifier).
    fn admin_table(&self) -> String {
        crate::sql::render("{{table}}", &self.config.table)
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
    fn migrate(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
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
        })
    }
    fn start_relay<'a>(
        &'a self,
        relay: &'a RelayConfig,
    ) -> BoxFuture<'a, Result<Pipelines, SourceError>> {
        Box::pin(async move {
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
        })
    }
    fn pending(&self) -> BoxFuture<'_, Result<Option<u64>, SourceError>> {
        Box::pin(async move {
            if self.cdc() {
                return Ok(None);
            }
            Ok(Some(
                self.admin
                    .backlog_at(OffsetDateTime::now_utc())
                    .await?
                    .pending,
            ))
        })
    }
    fn status(
        &self,
        now: OffsetDateTime,
        _stuck_after: Duration,
    ) -> BoxFuture<'_, Result<StatusReport, SourceError>> {
        Box::pin(async move {
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
            let mut status =
                StatusReport::new(self.database(), self.config.table.to_string(), backlog);
            status.held_aggregates = self.admin.held_aggregates(20).await?;
            Ok(status)
        })
    }
    fn doctor(&self, thresholds: DoctorThresholds) -> BoxFuture<'_, Vec<DoctorCheck>> {
        Box::pin(self.checks(thresholds))
    }
    fn dead_letters(&self) -> Result<&dyn DeadLetterStore, Unsupported> {
        Ok(&self.admin)
    }
    fn explain(&self) -> Result<&dyn Explain, Unsupported> {
        Ok(self)
    }
    fn replay(&self) -> Result<&dyn outbox_core::backend::Replay, Unsupported> {
        if self.cdc() {
            // Streamed rows are never marked delivered: nothing tells a replay which to pick.
            return Err(Unsupported::new("mysql-cdc", "replay").with_hint(
                "in CDC mode rows stay `pending` after delivery; replay from the broker's retention, or run the relay in poll mode (docs/mysql.md, CDC)",
            ));
        }
        Ok(&self.admin)
    }
    fn retention(&self) -> Result<&dyn Retention, Unsupported> {
        Ok(&self.admin)
    }
    fn producer(&self) -> Result<&dyn Producer, Unsupported> {
        Ok(&self.producer)
    }
    fn forward(&self) -> Result<&dyn outbox_core::backend::Forward, Unsupported> {
        Ok(&self.producer)
    }
    fn catalog(&self) -> Result<&dyn outbox_core::catalog::SubscriptionCatalog, Unsupported> {
        Ok(&self.catalog)
    }
    fn backfill(
        &self,
        subscription: &str,
    ) -> Result<Box<dyn outbox_core::backfill::Backfill>, Unsupported> {
        crate::backfill::MySqlBackfill::new(self.pool.clone(), &self.config, subscription)
            .map(|b| Box::new(b) as Box<dyn outbox_core::backfill::Backfill>)
            .map_err(|e| Unsupported::new("mysql", "backfill").with_hint(e))
    }
    fn delivery_ledger(&self) -> Result<&dyn outbox_core::verify::DeliveryLedger, Unsupported> {
        Ok(&self.ledger)
    }
    fn capture(&self) -> Result<&dyn outbox_core::capture::Capture, Unsupported> {
        Ok(&self.capture)
    }
    fn scratch(&self) -> Result<&dyn outbox_core::backend::Scratch, Unsupported> {
        outbox_core::backend::scratch_only(self.kind(), &self.config.table, self)
    }
}

impl Explain for MySqlBackend {
    fn explain(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> BoxFuture<'_, Result<Explanation, SourceError>> {
        Box::pin(self.story(id, now))
    }
}

impl DeadLetterStore for MySqlAdmin {
    fn list<'a>(
        &'a self,
        event_type: Option<&'a str>,
        aggregate_id: Option<&'a str>,
        limit: i64,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, SourceError>> {
        Box::pin(MySqlAdmin::list(self, event_type, aggregate_id, limit))
    }
    fn show(&self, id: Uuid) -> BoxFuture<'_, Result<Option<StoredEventDetail>, SourceError>> {
        Box::pin(MySqlAdmin::show(self, id, OffsetDateTime::now_utc()))
    }
    fn retry<'a>(
        &'a self,
        selection: &'a RetrySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(MySqlAdmin::retry(self, selection))
    }
    fn purge<'a>(
        &'a self,
        before: OffsetDateTime,
        event_type: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(MySqlAdmin::purge(self, before, event_type))
    }
}

impl outbox_core::backend::Replay for MySqlAdmin {
    fn plan<'a>(
        &'a self,
        selection: &'a ReplaySelection,
        preview: usize,
    ) -> BoxFuture<'a, Result<ReplayPlan, SourceError>> {
        Box::pin(self.replay_plan(selection, preview))
    }
    fn ids<'a>(
        &'a self,
        selection: &'a ReplaySelection,
    ) -> BoxFuture<'a, Result<Vec<Uuid>, SourceError>> {
        Box::pin(self.replay_ids(selection))
    }
    fn replay_batch<'a>(&'a self, ids: &'a [Uuid]) -> BoxFuture<'a, Result<u64, SourceError>> {
        Box::pin(self.replay_ids_batch(ids))
    }
}

impl Retention for MySqlAdmin {
    fn preview(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> BoxFuture<'_, Result<RetentionPreview, SourceError>> {
        Box::pin(async move {
            let (rows, oldest) = self.retention_preview(now, keep).await?;
            Ok(RetentionPreview {
                rows,
                oldest,
                ..RetentionPreview::default()
            })
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
            self.retention_run(
                now,
                settings.keep,
                settings.batch,
                settings.pause,
                &mut step,
            )
            .await
        })
    }
}

/// The producer library on the backend's own pool (`outbox bench`).
#[derive(Debug)]
struct MySqlProducer {
    pool: MySqlPool,
    outbox: MySqlOutbox,
}

impl MySqlProducer {
    async fn write(&self, events: &[NewEvent]) -> Result<(), SourceError> {
        let unavailable = |e: &(dyn std::error::Error + 'static)| {
            SourceError::unavailable(outbox_core::relay::ErrorChain(e).to_string())
        };
        let mut tx = self.pool.begin().await.map_err(|e| unavailable(&e))?;
        self.outbox
            .enqueue_batch(&mut tx, events)
            .await
            .map_err(|e| unavailable(&e))?;
        tx.commit().await.map_err(|e| unavailable(&e))
    }
}

impl outbox_core::backend::Forward for MySqlProducer {
    fn copy_in<'a>(
        &'a self,
        events: &'a [outbox_core::Event],
    ) -> BoxFuture<'a, Result<u64, SourceError>> {
        Box::pin(async move {
            let unavailable = |e: &(dyn std::error::Error + 'static)| {
                SourceError::unavailable(outbox_core::relay::ErrorChain(e).to_string())
            };
            let mut conn = self.pool.acquire().await.map_err(|e| unavailable(&e))?;
            self.outbox
                .copy_in(&mut conn, events)
                .await
                .map_err(|e| unavailable(&e))
        })
    }
}

impl Producer for MySqlProducer {
    fn fill<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(self.write(events))
    }
    fn commit<'a>(&'a self, events: &'a [NewEvent]) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(self.write(events))
    }
}
