//! [`MySqlCdcInspector`]: the CDC backlog and how far the kept position trails the server's
//! binlog, for metrics and `outbox status`.
//!
//! In CDC mode undelivered events are binlog, not row state: streamed rows stay `pending`.
//! A running source adds its in-memory counts; `status` in another process shows where the
//! kept position stands against the server's binlog.

use std::sync::Arc;

use outbox_core::SourceError;
use outbox_core::admin::DoctorCheck;
use outbox_core::source::{Backlog, Inspect};
use outbox_core::stream_ledger::LedgerStats;
use sqlx::MySqlPool;
use sqlx::Row as _;
use time::OffsetDateTime;

use super::queries::CdcQueries;
use super::setup::{current_position, load_position};
use crate::config::MySqlConfig;

use crate::error::source_error;
use crate::sql::stmt;

/// Reads the CDC backlog of one outbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MySqlCdcInspector {
    pool: MySqlPool,
    table: String,
    queries: Arc<CdcQueries>,
    stats: Option<Arc<LedgerStats>>,
}

impl MySqlCdcInspector {
    /// An inspector without a running source (for `outbox status`).
    pub fn new(pool: MySqlPool, config: &MySqlConfig) -> Self {
        Self {
            pool,
            table: config.table.to_string(),
            queries: Arc::new(CdcQueries::new(&config.table)),
            stats: None,
        }
    }

    pub(crate) fn with_stats(
        pool: MySqlPool,
        config: &MySqlConfig,
        stats: Arc<LedgerStats>,
    ) -> Self {
        Self {
            stats: Some(stats),
            ..Self::new(pool, config)
        }
    }

    /// Large transactions the running source took from scratch files (`source.spill_*`), as
    /// of its last fetch or settle; `None` without a running source.
    pub fn spilled(&self) -> Option<outbox_core::stream_ledger::Spilled> {
        self.stats.as_ref().map(|s| s.spilled())
    }

    /// The backlog at `now`: dead letters from the table, the rest from a running source.
    pub async fn backlog_at(&self, now: OffsetDateTime) -> Result<Backlog, SourceError> {
        let dead: i64 = sqlx::query_scalar(stmt(&self.queries.dead_count))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| source_error("reading the backlog", &self.table, e))?;
        Ok(LedgerStats::backlog(self.stats.as_deref(), dead, now))
    }

    /// Where the kept position stands, for `status`: one line each.
    pub async fn position_lines(&self) -> Result<Vec<String>, SourceError> {
        let err = |e| source_error("reading the CDC position", &self.table, e);
        let kept = load_position(&self.pool, &self.queries)
            .await
            .map_err(err)?;
        let head = current_position(&self.pool).await.map_err(err)?;
        let mut lines = Vec::new();
        match &kept {
            None => lines.push(
                "binlog position    none kept: run `outbox migrate` with source.mode = \"cdc\""
                    .to_owned(),
            ),
            Some(kept) => lines.push(format!(
                "binlog position    {}:{}{} acknowledged (moved {})",
                kept.at.file,
                kept.at.offset,
                kept.gtid
                    .as_ref()
                    .map(|g| format!(" (GTID {g})"))
                    .unwrap_or_default(),
                kept.moved
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
            )),
        }
        if let Some(head) = &head {
            let behind = match &kept {
                Some(kept) if kept.at.file == head.file => {
                    format!(
                        ", {} bytes ahead of it",
                        head.offset.saturating_sub(kept.at.offset)
                    )
                }
                Some(_) => ", in a later binlog file".to_owned(),
                None => String::new(),
            };
            lines.push(format!(
                "binlog head        {}:{}{behind}",
                head.file, head.offset
            ));
        }
        lines.push(
            "(CDC: undelivered events are binlog, not row state; `pending` counts only a running relay's memory)".to_owned(),
        );
        Ok(lines)
    }
}

impl MySqlCdcInspector {
    /// Whether the binlog the stream resumes from is still on the server, and not about to
    /// be expired: red when the kept file is gone (events since are lost), a warning when the
    /// kept position has not moved for over half the server's binlog retention.
    pub async fn retention_check(&self, now: OffsetDateTime) -> DoctorCheck {
        match self.retention_problem(now).await {
            Ok(None) => DoctorCheck::ok(
                "binlog_retention",
                "the kept position's binlog file is on the server",
            ),
            Ok(Some((true, why))) => DoctorCheck::red(
                "binlog_retention",
                why,
                "events committed since are lost to the stream: see docs/mysql.md, CDC: a lost position",
            ),
            Ok(Some((false, why))) => DoctorCheck::warn(
                "binlog_retention",
                why,
                "is a relay streaming? raise binlog_expire_logs_seconds above the longest outage you must survive",
            ),
            Err(e) => DoctorCheck::warn(
                "binlog_retention",
                format!(
                    "cannot list the binlog files: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                "grant REPLICATION CLIENT (MySQL) or BINLOG MONITOR (MariaDB) to source.url's user",
            ),
        }
    }

    /// `(red, why)` when something is wrong.
    async fn retention_problem(
        &self,
        now: OffsetDateTime,
    ) -> Result<Option<(bool, String)>, sqlx::Error> {
        let Some(super::setup::Kept {
            at: kept, moved, ..
        }) = load_position(&self.pool, &self.queries).await?
        else {
            return Ok(None);
        };
        let files: Vec<String> = sqlx::raw_sql("SHOW BINARY LOGS")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        if !files.contains(&kept.file) {
            return Ok(Some((
                true,
                format!(
                    "binlog file {} where the stream resumes is no longer on the server (purged)",
                    kept.file
                ),
            )));
        }
        let seconds: Option<i64> =
            sqlx::query_scalar("SELECT CAST(@@global.binlog_expire_logs_seconds AS SIGNED)")
                .fetch_one(&self.pool)
                .await
                .ok();
        let retention = match seconds {
            Some(s) if s > 0 => s,
            _ => {
                let days: Option<f64> =
                    sqlx::query_scalar("SELECT CAST(@@global.expire_logs_days AS DOUBLE)")
                        .fetch_one(&self.pool)
                        .await
                        .ok();
                (days.unwrap_or(0.0) * 86_400.0) as i64
            }
        };
        let idle = (now - moved).whole_seconds();
        let newest = files.last().is_some_and(|f| *f == kept.file);
        if retention > 0 && !newest && idle > retention / 2 {
            return Ok(Some((
                false,
                format!(
                    "the kept position has not moved for {idle} s, over half the binlog retention ({retention} s): its file {} will be purged",
                    kept.file
                ),
            )));
        }
        Ok(None)
    }
}

/// Whether `config`'s user may read the binlog: opens a non-blocking binlog session at the
/// server's head (nothing to read, so it ends at once). The server checks `REPLICATION
/// SLAVE` (MariaDB: `REPLICATION REPLICA`), roles included.
pub(crate) async fn replication_check(pool: &MySqlPool, config: &MySqlConfig) -> DoctorCheck {
    use futures::StreamExt as _;
    let fix = "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO <user> (MariaDB: REPLICATION REPLICA, BINLOG MONITOR)";
    let head = match super::setup::current_position(pool).await {
        Ok(Some(head)) => head,
        Ok(None) => {
            return DoctorCheck::red(
                "replication",
                "the server reports no binlog position",
                "start the server with --log-bin",
            );
        }
        Err(e) => {
            return DoctorCheck::red(
                "replication",
                format!(
                    "cannot read the binlog position: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                fix,
            );
        }
    };
    let result = async {
        let opts = super::binlog::binlog_opts(config).map_err(|e| e.to_string())?;
        let conn = mysql_async::Conn::new(opts)
            .await
            .map_err(|e| e.to_string())?;
        let request = mysql_async::BinlogStreamRequest::new(super::source::random_server_id())
            .with_filename(head.file.as_bytes())
            .with_pos(head.offset)
            .with_non_blocking();
        let mut stream = conn
            .get_binlog_stream(request)
            .await
            .map_err(|e| e.to_string())?;
        while let Some(event) = stream.next().await {
            event.map_err(|e| e.to_string())?;
        }
        Ok::<(), String>(())
    }
    .await;
    match result {
        Ok(()) => DoctorCheck::ok("replication", "source.url's user may read the binlog"),
        Err(e) => DoctorCheck::red("replication", format!("cannot read the binlog: {e}"), fix),
    }
}

impl Inspect for MySqlCdcInspector {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        self.backlog_at(OffsetDateTime::now_utc()).await
    }
}
