//! [`CaptureError`]: why a capture command failed.

/// Why a capture command failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// An entry cannot be installed as configured (a missing table or column, a column of an
    /// unusable type, a name taken): the message names the key.
    #[error("{key}: {message}")]
    Invalid {
        /// The config key, e.g. `capture[0].aggregate_id`.
        key: String,
        /// What is wrong, and what to do.
        message: String,
    },
    /// The outbox table does not exist.
    #[error("outbox table {table} does not exist in {database}; run `outbox migrate` first")]
    NotMigrated {
        /// The outbox table.
        table: String,
        /// The database, secrets redacted.
        database: String,
    },
    /// The database refused or could not be reached; nothing was changed.
    #[error("{context}")]
    Database {
        /// What was being done.
        context: String,
        /// The database error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl CaptureError {
    /// An [`Invalid`](Self::Invalid) error for `key`.
    pub fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl CaptureError {
    /// Maps a database error to [`Database`](Self::Database) with `context`.
    pub fn database<E: std::error::Error + Send + Sync + 'static>(
        context: impl Into<String>,
    ) -> impl FnOnce(E) -> Self {
        let context = context.into();
        move |e| Self::Database {
            context,
            source: Box::new(e),
        }
    }
}
