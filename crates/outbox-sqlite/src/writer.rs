//! The relay source's own connection for its short write transactions (settle, lease), which
//! waits for SQLite's write lock by polling it every millisecond instead of through SQLite's
//! busy handler.
//!
//! Why: SQLite's busy handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms between
//! attempts. Against a busy producer, which frees the lock for a few microseconds between its
//! transactions and takes it again at once, a relay waiting that way loses round after round:
//! measured in `outbox demo`, settles waited up to 80 ms, and events sat delivered-but-pending
//! for as long. Trying again every millisecond finds a gap within a few. Producers keep the
//! ordinary busy handler, which suits their one-millisecond waits for the relay's short
//! transactions.

use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection, Executor, SqlitePool};

/// SQLITE_BUSY, the primary result code for "another connection holds the lock".
const SQLITE_BUSY: i32 = 5;

/// Pause between two attempts to take the write lock.
const RETRY_EVERY: Duration = Duration::from_millis(1);

/// A dedicated connection (outside the pool) for `BEGIN IMMEDIATE` transactions.
#[derive(Debug)]
pub(crate) struct WriteConnection {
    options: SqliteConnectOptions,
    patience: Duration,
    conn: Option<SqliteConnection>,
    /// A transaction was begun and not yet ended: if it is still set at the next `begin`,
    /// the previous caller was interrupted, and the connection (with its open transaction)
    /// is dropped, which rolls the transaction back.
    open: bool,
}

impl WriteConnection {
    /// A connection to the same file as `pool`, with the same settings except the busy
    /// handler; it waits at most `patience` for the write lock.
    pub(crate) fn new(pool: &SqlitePool, patience: Duration) -> Self {
        let options = (*pool.connect_options())
            .clone()
            .busy_timeout(Duration::ZERO);
        Self {
            options,
            patience,
            conn: None,
            open: false,
        }
    }

    /// The settings this connection opens with (busy handler off).
    pub(crate) fn options(&self) -> &SqliteConnectOptions {
        &self.options
    }

    /// Begins a `BEGIN IMMEDIATE` transaction (SQLite's write lock taken) and returns the
    /// connection to run it on; end it with [`Self::commit`] or [`Self::rollback`].
    pub(crate) async fn begin(&mut self) -> Result<&mut SqliteConnection, sqlx::Error> {
        if std::mem::take(&mut self.open) {
            self.discard().await;
        }
        let deadline = Instant::now() + self.patience;
        loop {
            if self.conn.is_none() {
                self.conn = Some(self.options.connect().await?);
            }
            let Some(conn) = self.conn.as_mut() else {
                continue;
            };
            match conn.execute("BEGIN IMMEDIATE").await {
                Ok(_) => break,
                Err(e) if is_busy(&e) && Instant::now() < deadline => {
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                Err(e) => {
                    if !is_busy(&e) {
                        self.discard().await;
                    }
                    return Err(e);
                }
            }
        }
        self.open = true;
        self.conn
            .as_mut()
            .ok_or_else(|| sqlx::Error::Protocol("the write connection vanished".into()))
    }

    /// Commits the open transaction. On failure the connection is dropped, which rolls the
    /// transaction back.
    pub(crate) async fn commit(&mut self) -> Result<(), sqlx::Error> {
        self.end("COMMIT").await
    }

    /// Rolls the open transaction back (best effort: on failure the connection is dropped,
    /// which rolls it back too).
    pub(crate) async fn rollback(&mut self) {
        let _ = self.end("ROLLBACK").await;
    }

    async fn end(&mut self, statement: &'static str) -> Result<(), sqlx::Error> {
        self.open = false;
        let Some(conn) = self.conn.as_mut() else {
            return Err(sqlx::Error::Protocol("no open write transaction".into()));
        };
        match conn.execute(statement).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.discard().await;
                Err(e)
            }
        }
    }

    async fn discard(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.close().await;
        }
    }
}

fn is_busy(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i32>().ok())
            .is_some_and(|c| c & 0xff == SQLITE_BUSY),
        _ => false,
    }
}
