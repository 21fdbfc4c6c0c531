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

pub use outbox_core::migration::MigrateError;

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this call (version, name).
    pub applied: Vec<(i32, &'static str)>,
    /// The schema version after the call.
    pub version: i32,
}
