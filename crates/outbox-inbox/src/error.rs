//! Errors of the inbox: one enum for processing ([`InboxError`]), one for migrations
//! ([`MigrateError`]).

use std::convert::Infallible;

/// Why [`process`](crate::PgInbox::process) (or `begin`, `purge_*`) failed. `E` is the
/// handler's own error; operations that run no handler use the default, [`Infallible`].
///
/// Either way nothing was committed: neither the side effect nor the dedup record, so the
/// message must not be acknowledged and a redelivery will run the handler again.
#[derive(Debug, thiserror::Error)]
pub enum InboxError<E = Infallible> {
    /// The inbox database refused a statement or could not be reached.
    #[error("the inbox database failed")]
    Database(#[source] sqlx::Error),
    /// The handler returned an error; its transaction was rolled back.
    #[error("the handler failed; its side effect and the dedup record were rolled back")]
    Handler(#[source] E),
}

impl<E> InboxError<E> {
    /// Whether retrying later may succeed without any change: true for database errors
    /// (connection lost, serialization failure), and for handler errors, which the caller
    /// classifies itself.
    pub fn is_database(&self) -> bool {
        matches!(self, Self::Database(_))
    }
}

impl InboxError<Infallible> {
    /// Widens an error of an operation without handler to any handler error type.
    pub fn widen<E>(self) -> InboxError<E> {
        match self {
            Self::Database(e) => InboxError::Database(e),
            Self::Handler(never) => match never {},
        }
    }
}

/// Why a migration of the inbox table failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database refused a statement or could not be reached.
    #[error("migrating inbox table {table} failed")]
    Database {
        /// The table being migrated.
        table: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// A migration recorded as applied differs from the bundled one.
    #[error(
        "migration {version} of inbox table {table} was applied from different SQL (checksum {found}, this build has {expected}); refusing to continue"
    )]
    Modified {
        /// The table.
        table: String,
        /// Migration version.
        version: i32,
        /// Recorded checksum.
        found: String,
        /// Bundled checksum.
        expected: String,
    },
    /// The database has a newer schema than this build knows.
    #[error(
        "inbox table {table} has schema version {found}, newer than this build's {}; upgrade outbox",
        crate::SCHEMA_VERSION
    )]
    Newer {
        /// The table.
        table: String,
        /// Highest version recorded in the database.
        found: i32,
    },
}

impl MigrateError {
    /// The error for `table` when the recorded migrations cannot be brought up to date.
    pub(crate) fn conflict(table: String, c: outbox_core::migration::MigrationConflict) -> Self {
        use outbox_core::migration::MigrationConflict;
        match c {
            MigrationConflict::Newer { found, .. } => Self::Newer { table, found },
            MigrationConflict::Modified {
                version,
                found,
                expected,
            } => Self::Modified {
                table,
                version,
                found,
                expected,
            },
        }
    }
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this call (version, name).
    pub applied: Vec<(i32, &'static str)>,
    /// The schema version after the call.
    pub version: i32,
}
