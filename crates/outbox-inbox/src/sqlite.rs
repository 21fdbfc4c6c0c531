//! [`SqliteInbox`]: the inbox on SQLite ([`SqlInbox`] over `sqlx::Sqlite`), with its
//! migration and its own bookkeeping table (`<table>_migrations`).
//!
//! Differences from PostgreSQL: `event_id` is UUID text and `processed_at` Unix microseconds
//! (as in the SQLite outbox), and the inbox transaction starts with `BEGIN IMMEDIATE`, so it
//! holds SQLite's one write lock from the start: concurrent deliveries queue (up to
//! `busy_timeout`) instead of failing when a read transaction tries to become a write one.
//! `migrate` is one `BEGIN IMMEDIATE` transaction too, so a second one waits and finds
//! nothing to do.

use outbox_core::migration::Migration;
use outbox_core::{Identifier, QualifiedTable};
use sqlx::Sqlite;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::sql::{SQLITE_MIGRATIONS, render};
use crate::sql_inbox::{SqlInbox, engine::Engine};

/// The inbox on one SQLite table; same API as [`PgInbox`](crate::PgInbox). Cheap to clone.
pub type SqliteInbox = SqlInbox<Sqlite>;

impl SqlInbox<Sqlite> {
    /// The inbox on `table`.
    pub fn new(table: Identifier) -> Self {
        Self::on(QualifiedTable::new(None, table))
    }

    /// The inbox table.
    pub fn table(&self) -> &Identifier {
        &self.table.table
    }
}

impl Engine for Sqlite {
    const INBOX: &'static str = "SqliteInbox";
    const DEFAULT_SCHEMA: Option<&'static str> = None;
    const MIGRATIONS: &'static [Migration] = SQLITE_MIGRATIONS;
    const INSERT: &'static str = include_str!("../queries/sqlite/processed_events_insert.sql");
    const PURGE: &'static str = include_str!("../queries/sqlite/processed_events_purge.sql");
    const CONTAINS: &'static str = include_str!("../queries/sqlite/processed_events_contains.sql");
    const POSITIONS_ADVANCE: &'static str = include_str!("../queries/sqlite/positions_advance.sql");
    const POSITIONS_READ: &'static str = include_str!("../queries/sqlite/positions_read.sql");
    const MIGRATIONS_PREPARE: &'static str =
        include_str!("../queries/sqlite/migrations_prepare.sql");
    const MIGRATIONS_APPLIED: &'static str =
        include_str!("../queries/sqlite/migrations_applied.sql");
    const MIGRATIONS_RECORD: &'static str = include_str!("../queries/sqlite/migrations_record.sql");
    const BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");

    type Id = String;
    type Time = i64;

    fn id(id: Uuid) -> String {
        id.hyphenated().to_string()
    }

    /// Unix microseconds, the SQLite outbox's timestamp representation.
    fn time(at: OffsetDateTime) -> i64 {
        i64::try_from(at.unix_timestamp_nanos() / 1_000).unwrap_or(i64::MAX)
    }

    fn rows_affected(result: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    fn render(template: &str, table: &QualifiedTable) -> String {
        render(template, None, &table.table)
    }
}
