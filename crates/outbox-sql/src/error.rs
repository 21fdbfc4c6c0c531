//! What a `sqlx::Error` means to the relay: wait and retry ([`SourceErrorKind::Unavailable`]),
//! or stop ([`SourceErrorKind::Fatal`]).

use outbox_core::SourceErrorKind;
use sqlx::error::DatabaseError;

/// The kind of `e`. A database error is fatal when `fatal_code` says its code is one (each
/// server has its own codes for "the SQL means nothing here": a missing table or column,
/// syntax, permissions); any other database error may pass (a lost connection, a lock wait,
/// a deadlock, a server restarting). Of sqlx's own errors, a bad configuration and a column
/// that is missing or does not decode are fatal (retrying reads the same row again); the rest
/// (I/O, TLS, a closed or exhausted pool, a protocol hiccup) may pass.
pub fn classify(
    e: &sqlx::Error,
    fatal_code: impl FnOnce(&dyn DatabaseError) -> bool,
) -> SourceErrorKind {
    match e {
        sqlx::Error::Database(db) if fatal_code(db.as_ref()) => SourceErrorKind::Fatal,
        sqlx::Error::Database(_) => SourceErrorKind::Unavailable,
        sqlx::Error::Configuration(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => SourceErrorKind::Fatal,
        _ => SourceErrorKind::Unavailable,
    }
}

/// True when `e` is a database error whose code is `code` (a SQLSTATE such as `42P01`, or a
/// server's own number as text).
pub fn has_code(e: &sqlx::Error, code: &str) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == code)
}

/// True when the SQLSTATE of `db` is of class 42 (syntax or access rule: a missing table or
/// column, bad syntax) or 28 (invalid authorization): the classes PostgreSQL and MySQL share.
pub fn sqlstate_class_42_or_28(db: &dyn DatabaseError) -> bool {
    db.code()
        .is_some_and(|c| c.starts_with("42") || c.starts_with("28"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlx_own_errors_are_sorted_without_asking_the_database() {
        let never = |_: &dyn DatabaseError| -> bool { panic!("not a database error") };
        assert_eq!(
            classify(&sqlx::Error::ColumnNotFound("x".into()), never),
            SourceErrorKind::Fatal
        );
        assert_eq!(
            classify(&sqlx::Error::Configuration("bad url".into()), never),
            SourceErrorKind::Fatal
        );
        assert_eq!(
            classify(&sqlx::Error::PoolTimedOut, never),
            SourceErrorKind::Unavailable
        );
        assert_eq!(
            classify(&sqlx::Error::PoolClosed, never),
            SourceErrorKind::Unavailable
        );
        assert!(!has_code(&sqlx::Error::PoolClosed, "42P01"));
    }
}
