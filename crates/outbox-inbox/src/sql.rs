//! The one place where a configured schema or table name enters SQL, and the bundled
//! migrations of every dialect.
//!
//! Queries and migrations live in `.sql` files with placeholders (`{{table}}`, `{{schema}}`,
//! `{{name:_suffix}}`, `{{qname:_suffix}}`). [`render`] fills them from validated
//! [`Identifier`]s, always double-quoted; `render_mysql` writes them backquoted, MySQL's
//! identifier quote. Suffixes come from the `.sql` files shipped with this crate, never from
//! input.

use std::sync::Arc;

use outbox_core::Identifier;
use outbox_core::migration::Migration;

/// Fills the placeholders of `template` for `table` in `schema` (`None` for SQLite, which
/// has no schemas: names stay unqualified and `{{schema}}` is a bug).
///
/// # Panics
/// On an unknown placeholder or a malformed suffix: both are bugs in this crate's `.sql`
/// files (covered by tests), never caused by input.
pub(crate) fn render(template: &str, schema: Option<&Identifier>, table: &Identifier) -> String {
    outbox_core::migration::render_sql(template, schema, table, &[])
}

/// Fills the placeholders of a MySQL `template` for `table` (in the connection's database),
/// backquoted. The bundled MySQL files contain no double quote of their own, so every `"` of
/// the shared renderer's output is an identifier quote and becomes a backquote.
///
/// # Panics
/// On a double quote in `template`, an unknown placeholder or a malformed suffix: bugs in
/// this crate's `.sql` files (covered by tests), never caused by input.
#[cfg(feature = "mysql")]
pub(crate) fn render_mysql(template: &str, table: &Identifier) -> String {
    assert!(
        !template.contains('"'),
        "a double quote in bundled MySQL SQL (it would be a string literal)"
    );
    render(template, None, table).replace('"', "`")
}

/// Runs `handler` in `tx` (none: a duplicate) and commits on `Ok`; on `Err` rolls back the
/// side effect and the dedup record together. Shared by every database's `process`.
pub(crate) async fn finish<DB, T, E, F>(
    tx: Option<sqlx::Transaction<'static, DB>>,
    handler: F,
) -> Result<crate::Outcome<T>, crate::InboxError<E>>
where
    DB: sqlx::Database,
    F: for<'c> FnOnce(&'c mut DB::Connection) -> futures::future::BoxFuture<'c, Result<T, E>>,
{
    let Some(mut tx) = tx else {
        return Ok(crate::Outcome::Duplicate);
    };
    match handler(&mut tx).await {
        Ok(value) => {
            tx.commit().await.map_err(crate::InboxError::Database)?;
            Ok(crate::Outcome::Processed(value))
        }
        Err(e) => {
            // Dropping would roll back too; rolling back now frees the key at once.
            let _ = tx.rollback().await;
            Err(crate::InboxError::Handler(e))
        }
    }
}

/// A rendered statement, marked as audited for sqlx: its only dynamic parts are validated,
/// quoted identifiers inserted by [`render`].
pub(crate) fn stmt(sql: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(sql))
}

#[cfg(feature = "postgres")]
/// PostgreSQL migrations, in order. Append only; never edit one that has shipped.
pub(crate) const PG_MIGRATIONS: &[Migration] =
    outbox_core::migrations!("migrations/postgres": "0001_processed_events", "0002_positions");

#[cfg(feature = "sqlite")]
/// SQLite migrations, in order. Append only; never edit one that has shipped.
pub(crate) const SQLITE_MIGRATIONS: &[Migration] =
    outbox_core::migrations!("migrations/sqlite": "0001_processed_events", "0002_positions");

#[cfg(feature = "mysql")]
/// MySQL / MariaDB migrations, in order. Append only; never edit one that has shipped. DDL
/// commits on its own in MySQL, so each file is idempotent (`IF NOT EXISTS`).
pub(crate) const MYSQL_MIGRATIONS: &[Migration] =
    outbox_core::migrations!("migrations/mysql": "0001_processed_events", "0002_positions");

/// The schema version this build of the library expects (every dialect).
pub const SCHEMA_VERSION: i32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Identifier {
        Identifier::new(s).expect("valid")
    }

    #[test]
    fn placeholders_render_to_quoted_identifiers() {
        let sql = render(
            "{{table}} {{schema}} {{name:_idx}} {{qname:_migrations}}",
            Some(&id("app")),
            &id("seen"),
        );
        assert_eq!(
            sql,
            "\"app\".\"seen\" \"app\" \"seen_idx\" \"app\".\"seen_migrations\""
        );
        assert_eq!(
            render("{{table}} {{qname:_migrations}}", None, &id("seen")),
            "\"seen\" \"seen_migrations\""
        );
    }

    #[test]
    #[should_panic(expected = "without a schema")]
    fn a_schema_placeholder_in_sqlite_sql_is_a_bug_caught_by_tests() {
        render("{{schema}}", None, &id("seen"));
    }

    #[test]
    #[cfg(feature = "mysql")]
    #[should_panic(expected = "double quote")]
    fn a_double_quote_in_bundled_mysql_sql_is_a_bug_caught_by_tests() {
        render_mysql("SELECT \"x\"", &id("seen"));
    }
}
