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

use std::collections::BTreeMap;
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use mysql_async::BinlogStream;
use outbox_core::change_stream::{self, ChangeStream};
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::spill::{SpillSettings, TxnBuffer};
use outbox_core::{DeadLetterPolicy, Event, Ordering, Source, SourceError};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{MySqlConnection, MySqlPool};
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

use super::binlog::{BinlogPos, Columns, FileNames, GtidState, binlog_opts};
use super::queries::CdcQueries;
use crate::config::MySqlConfig;
use crate::error::source_error;
use crate::sql::stmt;

mod dead;
mod log;
mod session;

use log::{Binlog, Meta};

/// How often a standby tries to take the stream over.
pub(crate) const STANDBY_RETRY: Duration = change_stream::STANDBY_RETRY;

/// How often the kept position is saved when only transactions without outbox events moved
/// it (every batch of events saves it at once).
const IDLE_SAVE_EVERY: Duration = Duration::from_secs(1);

/// `ER_MASTER_FATAL_ERROR_READING_BINLOG`: the requested binlog file or position is gone.
const BINLOG_GONE: u16 = 1236;

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

    /// Until when the current claim is this source's alone: the server counts the lock's
    /// session idle from the end of the last check, which began at `lock_seen`, so it cannot
    /// free the lock before `lock_seen + claim_timeout`.
    fn valid_until(&self) -> Option<Instant> {
        let live = self.live.as_ref()?;
        Some(live.lock_seen + self.config.claim_timeout)
    }
}

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
            // The lock's session idles while the log is read: a catch-up longer than the
            // claim would let the server free the lock under it (and, the next check failing,
            // start the session over and read the same log again, without end under load).
            let timeout = self
                .config
                .connect_timeout
                .min(self.config.claim_timeout / 2);
            change_stream::catch_up(&mut Binlog(self), limit, timeout).await?;
            // Seen again after the read, so the batch's claim counts from now.
            self.check_lock().await?;
        }
        self.resolve(now).await?;
        self.save_position(false).await?;
        let valid_until = self.valid_until();
        let cs = &mut self.cs;
        Ok(cs
            .ledger
            .fetched(limit, now, cs.ordering, valid_until, &cs.stats))
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
