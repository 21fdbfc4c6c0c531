//! The binlog session: the single-streamer lock, where the stream resumes (the kept
//! position, by file and offset or by GTID), and saving that position as it moves.

use std::collections::HashSet;

use mysql_async::BinlogStreamRequest;
use outbox_core::SourceError;
use outbox_core::spill::TxnBuffer;
use sqlx::{Connection as _, MySqlConnection, Row as _};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::super::binlog::{Columns, GtidState, binlog_opts};
use super::super::setup::{STREAM, load_position};
use super::log::by_aggregate_seq;
use super::{IDLE_SAVE_EVERY, Live, MySqlCdcSource, STANDBY_RETRY, binlog_error, connect_options};
use crate::sql::stmt;

/// Takes the stream's lock for table `?` of the connection's database, without waiting.
const LOCK_TAKE: &str =
    "SELECT GET_LOCK(CONCAT('outbox_cdc.', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?))), 0)";
/// 1 while this connection holds the stream's lock for table `?`.
const LOCK_HELD: &str = "SELECT IS_USED_LOCK(CONCAT('outbox_cdc.', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?)))) = CONNECTION_ID()";

impl MySqlCdcSource {
    /// Opens the stream if this source does not hold it yet. `Ok(false)`: standing by.
    pub(super) async fn ensure_streaming(&mut self) -> Result<bool, SourceError> {
        if self.live.is_some() {
            return Ok(true);
        }
        if !self.cs.claim.due() {
            return Ok(false);
        }
        let Some(lock) = self.take_lock().await? else {
            if self.cs.claim.stand_by() {
                tracing::info!(table = %self.table, retry_every = ?STANDBY_RETRY, "another relay streams this outbox's binlog; standing by");
            }
            return Ok(false);
        };
        // The stream is ours now: nobody else moves the kept position.
        let kept = load_position(&self.pool, &self.queries)
            .await
            .map_err(|e| self.db_err("reading the CDC position", e))?
            .ok_or_else(|| {
                SourceError::fatal(format!(
                    "no CDC position is kept for {}: run `outbox migrate` with source.mode = \"cdc\"",
                    self.table
                ))
            })?;
        let start = kept.at.clone();
        let mut token = start.token().ok_or_else(|| {
            SourceError::fatal(format!("unexpected binlog file name `{}`", start.file))
        })?;
        self.columns = Some(self.read_columns().await?);
        self.load_dead().await?;
        let mariadb = super::super::setup::current_gtid(&self.pool)
            .await
            .map_err(|e| self.db_err("reading the GTID position", e))?
            .is_some();
        let gtid = kept
            .gtid
            .as_deref()
            .filter(|_| mariadb)
            .and_then(GtidState::parse)
            .filter(|g| !g.is_empty());
        let opts = binlog_opts(&self.config).map_err(SourceError::fatal)?;
        let mut conn = mysql_async::Conn::new(opts)
            .await
            .map_err(|e| binlog_error("connecting for the binlog", &start, e))?;
        let mut request = BinlogStreamRequest::new(self.server_id);
        if mariadb {
            use mysql_async::prelude::Queryable as _;
            // GTID-aware: real GTID events, and a start by GTID position when one is kept.
            let mut setup = vec![("SET @mariadb_slave_capability = 4", None)];
            if let Some(g) = &gtid {
                setup.push(("SET @slave_connect_state = ?", Some(g.to_string())));
                setup.push(("SET @slave_gtid_strict_mode = 0", None));
            }
            for (sql, param) in setup {
                let done = match param {
                    Some(p) => conn.exec_drop(sql, (p,)).await,
                    None => conn.query_drop(sql).await,
                };
                done.map_err(|e| binlog_error("preparing the binlog session", &start, e))?;
            }
        }
        if gtid.is_none() {
            request = request
                .with_filename(start.file.as_bytes())
                .with_pos(start.offset);
        } else if !self.has_binlog_file(&start.file).await? {
            // Resuming by GTID on a server without the kept file (a failover to a replica):
            // its file names and offsets start over, so the kept token does too.
            tracing::warn!(kept_file = %start.file, gtid = %kept.gtid.as_deref().unwrap_or_default(), "the kept binlog file is not on this server (failover?): resuming by GTID");
            self.rebase_row().await?;
            token = 0;
        }
        // A file of that name may still be another binlog (a replica seeded after the
        // primary's binlog began has its own `binlog.000001`): checked at the first
        // transaction (`apply`).
        let check_token = gtid.is_some() && token > 0;
        let stream = conn
            .get_binlog_stream(request)
            .await
            .map_err(|e| binlog_error("opening the binlog stream", &start, e))?;
        let head = super::super::setup::current_position(&self.pool)
            .await
            .map_err(|e| self.db_err("reading the binlog head", e))?;
        self.cs.catch_up = head.and_then(|h| h.token()).filter(|h| *h > token);
        self.files.note(&start.file);
        self.cs.ledger.reset(token);
        self.saved = token;
        self.gtids.clear();
        tracing::info!(
            table = %self.table,
            resume_at = %format!("{}:{}", start.file, start.offset),
            gtid = %gtid.as_ref().map(ToString::to_string).unwrap_or_default(),
            server_id = self.server_id,
            took_over = self.cs.claim.took(),
            "streaming the outbox from the binlog"
        );
        self.cs.set_streaming(true);
        self.live = Some(Live {
            stream,
            lock,
            lock_seen: Instant::now(),
            file: Some(start.file),
            described: false,
            pending: TxnBuffer::new(self.spill.clone(), Some(by_aggregate_seq)),
            gtid: mariadb.then(|| gtid.unwrap_or_default()),
            txn_gtid: None,
            check_token,
        });
        Ok(true)
    }

    /// Sets the kept row's token to 0: the kept file and offset were measured in another
    /// binlog than this server's, so this server's positions must not be compared with them.
    /// The GTID, which every server of the replication set shares, still says where to
    /// resume.
    pub(super) async fn rebase_row(&self) -> Result<(), SourceError> {
        sqlx::query(sqlx::AssertSqlSafe(crate::sql::render(
            "UPDATE {{name:_cdc_position}} SET token = 0 WHERE stream = ?",
            &self.config.table,
        )))
        .bind(STREAM)
        .execute(&self.pool)
        .await
        .map_err(|e| self.db_err("re-basing the CDC position", e))?;
        Ok(())
    }

    /// Takes the stream's lock on a connection of its own, which the server ends after
    /// `claim_timeout` idle. `None`: another relay holds it.
    pub(super) async fn take_lock(&self) -> Result<Option<MySqlConnection>, SourceError> {
        let options = connect_options(&self.config)?;
        let mut conn = tokio::time::timeout(
            self.config.connect_timeout,
            MySqlConnection::connect_with(&options),
        )
        .await
        .map_err(|_| SourceError::unavailable("connecting for the CDC lock timed out"))?
        .map_err(|e| self.db_err("connecting for the CDC lock", e))?;
        sqlx::query("SET SESSION wait_timeout = ?")
            .bind(self.config.claim_timeout_secs())
            .execute(&mut conn)
            .await
            .map_err(|e| self.db_err("setting the CDC lock's timeout", e))?;
        let got: Option<i64> = sqlx::query_scalar(LOCK_TAKE)
            .bind(&self.table)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| self.db_err("taking the CDC lock", e))?;
        Ok((got == Some(1)).then_some(conn))
    }

    /// Confirms the lock is still this source's (the server ends a connection left idle for
    /// `claim_timeout`, freeing it): one primary-key-cheap query per batch, which also keeps
    /// the lock's session from idling out while the relay works.
    pub(super) async fn check_lock(&mut self) -> Result<(), SourceError> {
        let Some(live) = self.live.as_mut() else {
            return Ok(());
        };
        let checked_at = Instant::now();
        let held: Result<Option<i64>, sqlx::Error> = sqlx::query_scalar(LOCK_HELD)
            .bind(&self.table)
            .fetch_one(&mut live.lock)
            .await;
        match held {
            Ok(Some(1)) => {
                live.lock_seen = checked_at;
                Ok(())
            }
            Ok(_) => Err(self.lost(SourceError::unavailable(
                "lost the CDC lock (the server ended its idle connection): another relay may stream now",
            ))),
            Err(e) => {
                let e = self.db_err("checking the CDC lock", e);
                Err(self.lost(e))
            }
        }
    }

    /// Whether the server still has binlog file `file` (`SHOW BINARY LOGS`).
    pub(super) async fn has_binlog_file(&self, file: &str) -> Result<bool, SourceError> {
        let rows = sqlx::raw_sql("SHOW BINARY LOGS")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_err("listing the binlog files", e))?;
        Ok(rows
            .iter()
            .any(|r| r.try_get::<String, _>(0).is_ok_and(|f| f == file)))
    }

    pub(super) async fn read_columns(&self) -> Result<Columns, SourceError> {
        let rows: Vec<(String, u32)> = sqlx::query_as(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(ORDINAL_POSITION AS UNSIGNED) \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(&self.table)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.db_err("reading the outbox table's columns", e))?;
        Columns::from_ordinals(&rows).map_err(SourceError::fatal)
    }

    /// The aggregates whose events are checked before they go out: those with dead letters,
    /// and those with dead letters put back and not delivered since.
    pub(super) async fn load_dead(&mut self) -> Result<(), SourceError> {
        let mut dead = HashSet::new();
        for sql in [
            &self.queries.dead_aggregates,
            &self.queries.put_back_aggregates,
        ] {
            let rows: Vec<(String, String)> = sqlx::query_as(stmt(sql))
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_err("reading dead-lettered aggregates", e))?;
            dead.extend(rows);
        }
        self.cs.dead = dead;
        Ok(())
    }

    /// Saves the confirmed position when it moved: at once after a batch of events (`force`),
    /// otherwise at most every [`IDLE_SAVE_EVERY`].
    pub(super) async fn save_position(&mut self, force: bool) -> Result<(), SourceError> {
        let confirmed = self.cs.ledger.confirmed();
        if confirmed <= self.saved || (!force && self.saved_at.elapsed() < IDLE_SAVE_EVERY) {
            return Ok(());
        }
        let Some(at) = self.files.position(confirmed) else {
            return Ok(());
        };
        if self.rebase_row {
            self.rebase_row().await?;
            self.rebase_row = false;
        }
        let gtid = self
            .gtids
            .range(..=confirmed)
            .next_back()
            .map(|(_, g)| g.clone());
        sqlx::query(stmt(&self.queries.position_save))
            .bind(&at.file)
            .bind(at.offset)
            .bind(confirmed as i64)
            .bind(&gtid)
            .bind(crate::poll::utc(OffsetDateTime::now_utc()))
            .bind(STREAM)
            .bind(confirmed as i64)
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_err("saving the CDC position", e))?;
        self.saved = confirmed;
        self.saved_at = Instant::now();
        self.gtids = self.gtids.split_off(&confirmed);
        Ok(())
    }
}
