//! [`MySqlCdcSource`]: the outbox table's inserts read from the row-based binlog.
//!
//! One relay streams at a time: the source holds a named lock (`GET_LOCK`, per database and
//! table) on a connection of its own while it streams. Other relays' sources find the lock
//! taken, return no events and try again every [`STANDBY_RETRY`]. A relay that dies (even
//! `kill -9`) closes that connection and the server frees the lock; one that hangs stops
//! using it, and the server ends the idle connection after `source.claim_timeout`
//! (`wait_timeout` on that session), freeing it too. The source checks the lock before each
//! batch and hands the relay a claim that ends before the lock could have been freed, so a
//! relay resumed after a pause publishes nothing stale.

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::{BinlogStream, BinlogStreamRequest};
use outbox_core::change_stream::{self, ChangeStream, LogReader, StreamMeta};
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::spill::{self, Buffered, SpillSettings, Spillable, TxnBuffer};
use outbox_core::stream_ledger;
use outbox_core::{DeadLetterPolicy, Event, Ordering, Source, SourceError};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{Connection as _, MySqlConnection, MySqlPool, Row as _};
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

use super::binlog::{
    BinlogPos, Columns, FileNames, GtidState, MARIADB_GTID_EVENT, binlog_opts, mariadb_gtid, token,
};
use super::queries::CdcQueries;
use super::setup::{STREAM, load_position};
use crate::config::MySqlConfig;
use crate::error::source_error;
use crate::sql::stmt;

/// How often a standby tries to take the stream over.
pub(crate) const STANDBY_RETRY: Duration = change_stream::STANDBY_RETRY;

/// How often the kept position is saved when only transactions without outbox events moved
/// it (every batch of events saves it at once).
const IDLE_SAVE_EVERY: Duration = Duration::from_secs(1);

/// `ER_MASTER_FATAL_ERROR_READING_BINLOG`: the requested binlog file or position is gone.
const BINLOG_GONE: u16 = 1236;

/// What the ledger keeps with each streamed event.
#[derive(Debug, Clone)]
struct Meta {
    /// The row's primary key (`position`), to dead-letter it.
    row: i64,
    /// The row's `seq`.
    seq: i64,
    /// Why the row cannot be published (it is dead-lettered at once).
    invalid: Option<String>,
    /// A dead letter put back to `pending` (streamed from an `UPDATE`).
    put_back: bool,
}

type Entry = stream_ledger::Entry<Meta>;

impl StreamMeta for Meta {
    fn put_back(&self) -> bool {
        self.put_back
    }
}

/// How a large transaction's events are kept in its scratch file.
impl Spillable for Meta {
    fn memory_size(&self) -> usize {
        std::mem::size_of::<Self>() + self.invalid.as_ref().map_or(0, String::len)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        spill::put_u64(out, self.row as u64);
        spill::put_u64(out, self.seq as u64);
        spill::put_u64(out, u64::from(self.put_back));
        match &self.invalid {
            None => spill::put_u64(out, 0),
            Some(why) => {
                spill::put_u64(out, 1);
                spill::put_bytes(out, why.as_bytes());
            }
        }
    }

    fn decode(input: &mut &[u8]) -> std::io::Result<Self> {
        let row = spill::take_u64(input)? as i64;
        let seq = spill::take_u64(input)? as i64;
        let put_back = spill::take_u64(input)? == 1;
        let invalid = match spill::take_u64(input)? {
            0 => None,
            _ => Some(spill::take_string(input)?),
        };
        Ok(Self {
            row,
            seq,
            invalid,
            put_back,
        })
    }
}

/// The order a transaction's events go out in: rows put back to pending in one statement come
/// in table order, so each aggregate's are sorted by `seq` (a stable sort).
fn by_aggregate_seq(a: &(Event, Meta), b: &(Event, Meta)) -> std::cmp::Ordering {
    (&a.0.aggregate_type, &a.0.aggregate_id, a.1.seq).cmp(&(
        &b.0.aggregate_type,
        &b.0.aggregate_id,
        b.1.seq,
    ))
}

/// An open binlog session with the lock that makes it this relay's alone.
struct Live {
    stream: BinlogStream,
    lock: MySqlConnection,
    /// When the lock was last seen held by this source.
    lock_seen: Instant,
    /// The current binlog file.
    file: Option<String>,
    /// A format description was read: later events' checksums are stripped by the reader.
    described: bool,
    /// Events of the transaction being read, released at its commit (in a scratch file past
    /// `source.spill_after_*`).
    pending: TxnBuffer<(Event, Meta)>,
    /// MariaDB: the GTID position after the last transaction read, and the GTID of the one
    /// being read (domain, server, seq, standalone).
    gtid: Option<GtidState>,
    txn_gtid: Option<(u32, u32, u64, bool)>,
    /// Resumed by GTID: the first transaction's end tells whether the kept token was
    /// measured in this server's binlog.
    check_token: bool,
}

/// Reads the outbox from the binlog (`source.mode = "cdc"`).
///
/// Delivery contract (the [`Source`] contract, plus):
/// - Events come in commit order (the binlog's); each carries its row's `seq` as the
///   `aggregate_seq` header, as in polling mode.
/// - The kept position (`<table>_cdc_position`) moves only over the contiguous prefix of
///   transactions whose every event was delivered or dead-lettered. After a crash the stream
///   resumes there: nothing is lost, the tail after it is published again.
/// - Retried and released events wait in memory and come back in order; retry counts live in
///   memory too and restart from zero after a restart.
/// - A row put back to `pending` (`outbox dead retry`) is streamed again (an `UPDATE` from
///   `dead` or `delivered` to `pending` in the binlog).
pub struct MySqlCdcSource {
    pool: MySqlPool,
    config: MySqlConfig,
    queries: Arc<CdcQueries>,
    database: String,
    table: String,
    /// The shared change-stream state: ledger, dead-letter checks, the claim.
    cs: ChangeStream<Meta>,
    server_id: u32,
    live: Option<Live>,
    /// When an open transaction goes to a scratch file (`source.spill_*`).
    spill: Arc<SpillSettings>,
    columns: Option<Columns>,
    files: FileNames,
    /// Token of the kept position as last saved.
    saved: u64,
    saved_at: Instant,
    /// MariaDB: the GTID position at the end of each transaction not yet saved, by token.
    gtids: BTreeMap<u64, String>,
    /// The kept row's token belongs to another server's binlog: set it to 0 before the next
    /// save (which only ever moves it forward).
    rebase_row: bool,
}

impl std::fmt::Debug for MySqlCdcSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlCdcSource")
            .field("table", &self.table)
            .field("streaming", &self.live.is_some())
            .field("confirmed", &self.cs.ledger.confirmed())
            .finish_non_exhaustive()
    }
}

impl MySqlCdcSource {
    /// A source over `config`'s table; `pool` serves the position, dead letters and checks.
    /// The binlog session opens on the first `fetch`.
    pub fn new(
        pool: MySqlPool,
        config: &MySqlConfig,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> Result<Self, SourceError> {
        let options = connect_options(config)?;
        let database = options
            .get_database()
            .ok_or_else(|| SourceError::fatal("source.url names no database"))?
            .to_owned();
        binlog_opts(config).map_err(SourceError::fatal)?;
        Ok(Self {
            pool,
            queries: Arc::new(CdcQueries::new(&config.table)),
            database,
            table: config.table.to_string(),
            config: config.clone(),
            cs: ChangeStream::new(ordering, dead_letter),
            server_id: config.server_id.unwrap_or_else(random_server_id),
            live: None,
            spill: Arc::new(config.spill_settings()),
            columns: None,
            files: FileNames::default(),
            saved: 0,
            saved_at: Instant::now(),
            gtids: BTreeMap::new(),
            rebase_row: false,
        })
    }

    /// An inspector that reports this source's in-memory backlog.
    pub fn inspector(&self) -> super::MySqlCdcInspector {
        super::MySqlCdcInspector::with_stats(self.pool.clone(), &self.config, self.cs.stats.clone())
    }

    /// True while this source holds the stream.
    pub fn is_streaming(&self) -> bool {
        self.live.is_some()
    }

    fn db_err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// Opens the stream if this source does not hold it yet. `Ok(false)`: standing by.
    async fn ensure_streaming(&mut self) -> Result<bool, SourceError> {
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
        let mariadb = super::setup::current_gtid(&self.pool)
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
        let head = super::setup::current_position(&self.pool)
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
    async fn rebase_row(&self) -> Result<(), SourceError> {
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
    async fn take_lock(&self) -> Result<Option<MySqlConnection>, SourceError> {
        let options = connect_options(&self.config)?;
        let mut conn = tokio::time::timeout(
            self.config.connect_timeout,
            MySqlConnection::connect_with(&options),
        )
        .await
        .map_err(|_| SourceError::unavailable("connecting for the CDC lock timed out"))?
        .map_err(|e| self.db_err("connecting for the CDC lock", e))?;
        sqlx::query("SET SESSION wait_timeout = ?")
            .bind(self.config.claim_timeout.as_secs().max(1))
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
    async fn check_lock(&mut self) -> Result<(), SourceError> {
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
    async fn has_binlog_file(&self, file: &str) -> Result<bool, SourceError> {
        let rows = sqlx::raw_sql("SHOW BINARY LOGS")
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.db_err("listing the binlog files", e))?;
        Ok(rows
            .iter()
            .any(|r| r.try_get::<String, _>(0).is_ok_and(|f| f == file)))
    }

    async fn read_columns(&self) -> Result<Columns, SourceError> {
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
    async fn load_dead(&mut self) -> Result<(), SourceError> {
        let mut dead = HashSet::new();
        for sql in [
            &self.queries.dead_aggregates,
            &self.queries.put_back_aggregates,
        ] {
            let rows = sqlx::query(stmt(sql))
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_err("reading dead-lettered aggregates", e))?;
            for r in &rows {
                let key = (|| Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?)))()
                    .map_err(|e| self.db_err("reading dead-lettered aggregates", e))?;
                dead.insert(key);
            }
        }
        self.cs.dead = dead;
        Ok(())
    }

    /// Ends the session after a failure; the next `fetch` reconnects (if the lock is free)
    /// and the stream resends everything after the kept position.
    fn lost(&mut self, error: SourceError) -> SourceError {
        self.live = None;
        self.cs.set_streaming(false);
        self.cs.ledger.reset(self.saved);
        self.cs.claim.retry_now();
        tracing::warn!(error = %outbox_core::relay::ErrorChain(&error), "binlog stream lost; events after the kept position will be streamed again");
        error
    }

    /// Interprets one binlog event. Returns true when a transaction with events committed.
    fn apply(&mut self, event: &mysql_async::binlog::events::Event) -> Result<bool, SourceError> {
        let Some(live) = self.live.as_mut() else {
            return Ok(false);
        };
        let decode = |e: std::io::Error| {
            SourceError::fatal(format!("decoding the binlog of {} failed", self.table))
                .with_source(e)
        };
        let end = u64::from(event.header().log_pos());
        if let Some(reached) = live
            .file
            .as_deref()
            .filter(|_| end > 0)
            .and_then(|f| token(f, end))
        {
            self.cs.reached(reached);
        }
        if event.header().event_type_raw() == MARIADB_GTID_EVENT {
            if let Some((domain, seq, standalone)) = mariadb_gtid(event.data()) {
                live.txn_gtid = Some((domain, event.header().server_id(), seq, standalone));
            }
            return Ok(false);
        }
        let data = event.read_data().map_err(decode)?;
        let commit = match data {
            Some(EventData::RotateEvent(rotate)) => {
                let raw = rotate.name_raw();
                // A rotate sent before the first format description still carries its
                // checksum: the reader only strips it once it knows the checksum setting.
                let name = if live.described || raw.len() <= 4 {
                    raw
                } else {
                    strip_checksum(raw, live.file.as_deref())
                };
                let name = String::from_utf8_lossy(name).into_owned();
                self.files.note(&name);
                live.file = Some(name);
                false
            }
            Some(EventData::FormatDescriptionEvent(_)) => {
                live.described = true;
                false
            }
            Some(EventData::RowsEvent(rows)) => {
                let Some(columns) = self.columns.as_ref() else {
                    return Ok(false);
                };
                let Some(tme) = live.stream.get_tme(rows.table_id()) else {
                    return Ok(false);
                };
                if tme.database_name() != self.database || tme.table_name() != self.table {
                    return Ok(false);
                }
                if tme.columns_count() as usize != columns.count {
                    return Err(SourceError::unavailable(format!(
                        "the outbox table {} changed shape ({} columns in the binlog, {} known): reading its columns again",
                        self.table,
                        tme.columns_count(),
                        columns.count
                    )));
                }
                let update = matches!(
                    rows,
                    RowsEventData::UpdateRowsEventV1(_) | RowsEventData::UpdateRowsEvent(_)
                );
                let insert = matches!(
                    rows,
                    RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_)
                );
                if !(insert || update) {
                    return Ok(false);
                }
                for row in rows.rows(tme) {
                    let (before, after) = row.map_err(decode)?;
                    let Some(after) = after else { continue };
                    if columns.state(&after) != Some(b"pending") {
                        continue;
                    }
                    // An update streams a row put back to pending (dead letter retried,
                    // replay), never one that stayed pending.
                    if update
                        && before
                            .as_ref()
                            .is_none_or(|b| columns.state(b) == Some(b"pending"))
                    {
                        continue;
                    }
                    let row = columns.row_position(&after).unwrap_or(0);
                    let item = match columns.event(&after) {
                        Ok(event) => {
                            let seq = aggregate_seq(&event);
                            (
                                event,
                                Meta {
                                    row,
                                    seq,
                                    invalid: None,
                                    put_back: update,
                                },
                            )
                        }
                        Err(why) => (
                            placeholder(),
                            Meta {
                                row,
                                seq: 0,
                                invalid: Some(format!("undecodable outbox row: {why}")),
                                put_back: update,
                            },
                        ),
                    };
                    live.pending.push(item).map_err(spill_error)?;
                }
                false
            }
            Some(EventData::XidEvent(_)) => true,
            // COMMIT ends a transaction on non-transactional tables; a standalone GTID's one
            // statement (DDL) is its whole transaction.
            Some(EventData::QueryEvent(q)) => {
                q.query().eq_ignore_ascii_case("COMMIT")
                    || live.txn_gtid.is_some_and(|(.., standalone)| standalone)
            }
            _ => false,
        };
        if !commit {
            return Ok(false);
        }
        let Some(file) = live.file.as_deref() else {
            return Ok(false);
        };
        let Some(token) = token(file, end) else {
            return Ok(false);
        };
        if std::mem::take(&mut live.check_token) && token <= self.cs.ledger.confirmed() {
            // Resumed by GTID, the stream's first transaction ends at or before the kept
            // token: that token was measured in another binlog (a failover to a replica whose
            // file of the same name holds the transactions at other offsets). Left as it is,
            // no position here could pass it: the kept position would stay at the failover
            // and every restart would publish everything since again. Positions start over.
            tracing::warn!(
                kept_token = self.saved,
                first_token = token,
                file,
                "the kept binlog position is not in this server's binlog (failover?): following this server's positions from here"
            );
            self.cs.ledger.reset(0);
            self.saved = 0;
            self.rebase_row = true;
        }
        if let (Some(state), Some((domain, server, seq, _))) =
            (live.gtid.as_mut(), live.txn_gtid.take())
        {
            state.apply(domain, server, seq);
            self.gtids.insert(token, state.to_string());
        }
        // Sorted by `by_aggregate_seq`, in memory or merged from the scratch file's runs.
        match live.pending.take().map_err(spill_error)? {
            Buffered::Memory(events) => {
                let any = !events.is_empty();
                self.cs.ledger.commit(events, token);
                Ok(any)
            }
            Buffered::Spilled(events) => {
                // Loaded in batches by `pump`; the binlog waits until all of it is loaded.
                self.cs.ledger.commit_spilled(events, token);
                Ok(true)
            }
        }
    }

    /// Applies one item of the stream; a failure ends the session.
    fn receive(&mut self, received: BinlogItem) -> Result<bool, SourceError> {
        match received {
            Some(Ok(event)) => self.apply(&event).map_err(|e| self.lost(e)),
            None => Err(self.lost(SourceError::unavailable(
                "the server ended the binlog stream",
            ))),
            Some(Err(e)) => {
                let at = self.files.position(self.saved).unwrap_or(BinlogPos {
                    file: "?".to_owned(),
                    offset: 0,
                });
                let e = binlog_error("reading the binlog stream", &at, e);
                Err(self.lost(e))
            }
        }
    }

    /// Dead-letters queued rows that cannot be published, and settles queued events of
    /// aggregates with dead letters: an event that is itself already dead (streamed again
    /// after a restart) is dropped; with `hold-aggregate` the others are parked as dead
    /// letters behind it. An aggregate whose dead letters were retried or purged flows again.
    async fn resolve(&mut self, now: OffsetDateTime) -> Result<(), SourceError> {
        let invalid: Vec<(Entry, i32, String)> = self
            .cs
            .ledger
            .queued()
            .filter_map(|e| e.meta.invalid.clone().map(|why| (e.clone(), 1, why)))
            .collect();
        if !invalid.is_empty() {
            self.write_dead(&invalid, now).await?;
            for (entry, _, why) in &invalid {
                tracing::error!(row = entry.meta.row, reason = %why, "dead-lettered an outbox row that cannot be published");
                if let Some(entry) = self.cs.ledger.remove_queued(entry.event.position.0) {
                    self.cs.ledger.finish(&entry);
                }
            }
        }
        let groups = self.cs.suspect_groups();
        for (key, positions) in groups {
            let dead_ids: Vec<String> = sqlx::query_scalar(stmt(&self.queries.dead_of_aggregate))
                .bind(&key.0)
                .bind(&key.1)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_err("reading the dead letters of an aggregate", e))?;
            let dead_ids: Vec<Uuid> = dead_ids
                .iter()
                .filter_map(|s| Uuid::parse_str(s).ok())
                .collect();
            if dead_ids.is_empty() {
                // The dead letters were retried or purged. A retried one is streamed again
                // from where `dead retry` committed: an event of this aggregate with a higher
                // `seq` that was streamed before that (the tail after a restart) must not
                // overtake it, so it is streamed again too, after it.
                let put_back: Vec<(i64, i64)> = sqlx::query_as(stmt(&self.queries.put_back_seqs))
                    .bind(&key.0)
                    .bind(&key.1)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.db_err("reading the retried events of an aggregate", e))?;
                // Where the stream holds each put-back row already (its ledger position).
                let held: std::collections::HashMap<i64, i64> = self
                    .cs
                    .ledger
                    .entries()
                    .filter(|e| e.meta.put_back)
                    .map(|e| (e.meta.row, e.event.position.0))
                    .collect();
                let mut overtaking = Vec::new();
                for p in &positions {
                    if let Some(e) = self.cs.ledger.queued_mut(*p) {
                        // A put-back row with a lower seq that the stream has not handed over
                        // ahead of this event (not yet streamed, or streamed after it).
                        let waits = put_back.iter().any(|(row, seq)| {
                            *seq < e.meta.seq && held.get(row).is_none_or(|at| at > p)
                        });
                        if waits {
                            overtaking.push(*p);
                        } else {
                            e.checked = true;
                        }
                    }
                }
                if overtaking.is_empty() {
                    self.cs.dead.remove(&key);
                } else {
                    self.restream(&overtaking).await?;
                }
                continue;
            }
            let park = self.cs.behind_dead(&key, positions, &dead_ids);
            if !park.is_empty() {
                self.write_dead(&park, now).await?;
                self.cs.settle_parked(&key, &park, |_| true);
            }
        }
        Ok(())
    }

    /// Streams the queued events at `positions` again, after everything committed so far
    /// (see `queries/cdc_restream.sql`), and settles them here.
    async fn restream(&mut self, positions: &[i64]) -> Result<(), SourceError> {
        let rows: Vec<i64> = positions
            .iter()
            .filter_map(|p| self.cs.ledger.queued_mut(*p).map(|e| e.meta.row))
            .collect();
        let list = serde_json::Value::from(rows).to_string();
        let err = |e| source_error("streaming events again", &self.table, e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        for state in ["dead", "pending"] {
            sqlx::query(stmt(&self.queries.restream))
                .bind(&list)
                .bind(state)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        for p in positions {
            if let Some(entry) = self.cs.ledger.remove_queued(*p) {
                tracing::info!(event_id = %entry.event.id, "streaming an event again after the retried dead letters of its aggregate");
                self.cs.ledger.finish(&entry);
            }
        }
        Ok(())
    }

    /// Records dead letters in one statement. Waits (row lock) for a producer's transaction
    /// the binlog already showed but the server has not finished committing.
    async fn write_dead(
        &self,
        items: &[(Entry, i32, String)],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let list: Vec<serde_json::Value> = items
            .iter()
            .map(|(e, attempts, reason)| serde_json::json!([e.meta.row, attempts, reason]))
            .collect();
        sqlx::query(stmt(&self.queries.dead_letter))
            .bind(serde_json::Value::Array(list).to_string())
            .bind(crate::poll::utc(now))
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_err("dead-lettering events", e))?;
        Ok(())
    }

    /// Saves the confirmed position when it moved: at once after a batch of events (`force`),
    /// otherwise at most every [`IDLE_SAVE_EVERY`].
    async fn save_position(&mut self, force: bool) -> Result<(), SourceError> {
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

    /// Until when the current claim is this source's alone: the server counts the lock's
    /// session idle from the end of the last check, which began at `lock_seen`, so it cannot
    /// free the lock before `lock_seen + claim_timeout`.
    fn valid_until(&self) -> Option<Instant> {
        let live = self.live.as_ref()?;
        Some(live.lock_seen + self.config.claim_timeout)
    }
}

/// Takes the stream's lock for table `?` of the connection's database, without waiting.
const LOCK_TAKE: &str =
    "SELECT GET_LOCK(CONCAT('outbox_cdc.', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?))), 0)";
/// 1 while this connection holds the stream's lock for table `?`.
const LOCK_HELD: &str = "SELECT IS_USED_LOCK(CONCAT('outbox_cdc.', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?)))) = CONNECTION_ID()";

/// The pool's connection options (the lock's connection is made like the pool's).
fn connect_options(config: &MySqlConfig) -> Result<MySqlConnectOptions, SourceError> {
    MySqlConnectOptions::from_str(&config.connect_url()).map_err(|_| {
        SourceError::fatal(format!(
            "source.url: `{}` is not a valid MySQL URL",
            config.url.redacted()
        ))
    })
}

/// A server id for the binlog session: random, away from the small ids servers use.
pub(crate) fn random_server_id() -> u32 {
    let bytes = Uuid::new_v4().into_bytes();
    (u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) | 0x4000_0000) & 0x7FFF_FFFF
}

/// A rotate event's name without the 4-byte checksum it carries before the first format
/// description (kept when it is the name the stream was asked for, whole).
fn strip_checksum<'a>(raw: &'a [u8], requested: Option<&str>) -> &'a [u8] {
    match requested {
        Some(r) if raw.starts_with(r.as_bytes()) => &raw[..r.len()],
        _ => &raw[..raw.len() - 4],
    }
}

/// The `aggregate_seq` header of an event decoded from a row.
fn aggregate_seq(event: &Event) -> i64 {
    event
        .headers
        .iter()
        .rev()
        .find(|(n, _)| n == outbox_core::message::header::AGGREGATE_SEQ)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// The stand-in event of a row that cannot be decoded (it is only ever dead-lettered).
fn placeholder() -> Event {
    Event {
        id: Uuid::nil(),
        position: outbox_core::Position(0),
        aggregate_type: String::new(),
        aggregate_id: String::new(),
        event_type: String::new(),
        payload: bytes::Bytes::new(),
        headers: Vec::new(),
        created_at: OffsetDateTime::UNIX_EPOCH,
        attempts: 0,
    }
}

/// A scratch file of a large transaction that cannot be written (a full disk): worth retrying,
/// the binlog sends the transaction again.
fn spill_error(e: std::io::Error) -> SourceError {
    SourceError::unavailable(
        "buffering a large transaction in a scratch file (source.spill_dir) failed",
    )
    .with_source(e)
}

/// A binlog session error: a position the server no longer has is fatal, with what to do.
fn binlog_error(context: &str, at: &BinlogPos, e: mysql_async::Error) -> SourceError {
    if let mysql_async::Error::Server(server) = &e
        && server.code == BINLOG_GONE
    {
        return SourceError::fatal(format!(
            "{context}: the server no longer has binlog {}:{} where the stream resumes ({}); events committed since may be lost: see docs/mysql.md, \"CDC: a lost position\"",
            at.file, at.offset, server.message
        ));
    }
    SourceError::unavailable(format!("{context} at {}:{}", at.file, at.offset)).with_source(e)
}

impl Source for MySqlCdcSource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        if let Some(e) = self.cs.failure.take() {
            return Err(e);
        }
        // A fetch without settle: the previous batch goes back untouched.
        self.cs.ledger.release_in_flight();
        if !self.ensure_streaming().await? {
            return Ok(Fetched::default());
        }
        self.check_lock().await?;
        change_stream::pump(&mut Binlog(self))?;
        if self.cs.catch_up.is_some() {
            let timeout = self.config.connect_timeout;
            change_stream::catch_up(&mut Binlog(self), limit, timeout).await?;
        }
        self.resolve(now).await?;
        self.save_position(false).await?;
        let events = self.cs.ledger.take(limit, now, self.cs.ordering);
        self.cs.publish_stats();
        Ok(Fetched {
            more: events.len() >= limit,
            events,
            valid_until: self.valid_until(),
        })
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        // Dead letters first: the only part that can fail, and then nothing is recorded.
        let dead = self.cs.dead_letters(settlements);
        if !dead.is_empty()
            && let Err(e) = self.write_dead(&dead, now).await
        {
            self.cs.ledger.release_in_flight();
            return Err(e);
        }
        let put_back: Vec<i64> = settlements
            .iter()
            .filter(|s| s.outcome == Outcome::Delivered)
            .filter_map(|s| self.cs.ledger.in_flight(s.position.0))
            .filter(|e| e.meta.put_back)
            .map(|e| e.meta.row)
            .collect();
        if !put_back.is_empty() {
            let done = sqlx::query(stmt(&self.queries.put_back_delivered))
                .bind(serde_json::Value::from(put_back).to_string())
                .execute(&self.pool)
                .await;
            if let Err(e) = done {
                self.cs.ledger.release_in_flight();
                return Err(self.db_err("recording retried dead letters as delivered", e));
            }
        }
        self.cs.apply(settlements);
        self.cs.publish_stats();
        self.save_position(true).await
    }

    async fn wait_for_events(&mut self, max: Duration) {
        change_stream::wait_for_events(&mut Binlog(self), max).await;
    }
}

/// One item of the binlog stream.
type BinlogItem = Option<Result<mysql_async::binlog::events::Event, mysql_async::Error>>;

/// The source as the shared machinery reads its log ([`LogReader`]).
struct Binlog<'a>(&'a mut MySqlCdcSource);

impl LogReader for Binlog<'_> {
    type Meta = Meta;
    type Item = BinlogItem;

    fn stream(&self) -> &ChangeStream<Meta> {
        &self.0.cs
    }

    fn stream_mut(&mut self) -> &mut ChangeStream<Meta> {
        &mut self.0.cs
    }

    fn is_open(&self) -> bool {
        self.0.live.is_some()
    }

    fn next_item(&mut self) -> Option<impl Future<Output = BinlogItem> + Send + '_> {
        self.0.live.as_mut().map(|live| live.stream.next())
    }

    fn receive(&mut self, item: BinlogItem) -> Result<bool, SourceError> {
        self.0.receive(item)
    }

    fn lost(&mut self, error: SourceError) -> SourceError {
        self.0.lost(error)
    }

    fn mid_transaction(&self) -> bool {
        self.0.live.as_ref().is_some_and(|l| !l.pending.is_empty())
    }
}
