//! The one place where a configured table name enters SQL.
//!
//! Queries and migrations live in `.sql` files with placeholders (`{{table}}`,
//! `{{name:_suffix}}`). [`render`] fills them from an [`Identifier`], which is validated and
//! always double-quoted. Suffixes come from the `.sql` files shipped with this crate, never
//! from input. SQLite has no schemas, so unlike PostgreSQL there is no schema part.
//!
//! [`Cols`] reads the rows of the operator queries for `outbox_core::admin_rows`.

use std::sync::Arc;

use outbox_core::Identifier;
use outbox_core::admin_rows::Columns;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::timestamp::from_micros;

/// Fills the placeholders of `template` for `table`.
///
/// # Panics
/// On an unknown placeholder or a malformed suffix: both are bugs in this crate's `.sql`
/// files (covered by tests), never caused by input.
pub(crate) fn render(template: &str, table: &Identifier) -> String {
    outbox_core::migration::render_sql(template, None, table, &[])
}

outbox_sql::query_set! {
    /// Every query of this crate, rendered once for one outbox table.
    pub(crate) struct Queries;
    fn new(table: &Identifier), rendered by |sql| render(sql, table);
    files "outbox_" {
        claim_batch, claim_batch_unordered, mark_delivered, delete_delivered, schedule_retry,
        dead_letter, positions_advance, insert, copy_in, backlog, lease_read, lease_acquire,
        lease_renew, lease_release,
    }
}

/// A rendered statement, marked as audited for sqlx: its only dynamic parts are validated,
/// quoted identifiers inserted by [`render`].
pub(crate) fn stmt(sql: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(sql))
}

/// An event id stored as hyphenated text.
pub(crate) fn parse_id(text: String) -> Result<Uuid, sqlx::Error> {
    Uuid::parse_str(&text).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// A row of an operator query, for `outbox_core::admin_rows`: ids are hyphenated text, times
/// Unix microseconds.
pub(crate) struct Cols<'r>(pub(crate) &'r SqliteRow);

impl Columns for Cols<'_> {
    type Error = sqlx::Error;

    outbox_core::forward_plain_columns!();

    fn id(&self, i: usize) -> Result<Uuid, sqlx::Error> {
        parse_id(self.0.try_get(i)?)
    }

    fn time(&self, i: usize) -> Result<OffsetDateTime, sqlx::Error> {
        Ok(from_micros(self.0.try_get(i)?))
    }

    fn time_opt(&self, i: usize) -> Result<Option<OffsetDateTime>, sqlx::Error> {
        Ok(self.0.try_get::<Option<i64>, _>(i)?.map(from_micros))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Identifier {
        Identifier::new("events").expect("valid")
    }

    #[test]
    fn placeholders_render_to_quoted_identifiers() {
        let sql = render("{{table}} {{name:_pending_seq_idx}}", &table());
        assert_eq!(sql, "\"events\" \"events_pending_seq_idx\"");
    }

    #[test]
    #[should_panic(expected = "without a schema")]
    fn a_schema_placeholder_is_a_bug_caught_by_tests() {
        // SQLite has no schemas.
        render("{{schema}}", &table());
    }

    #[test]
    fn every_bundled_query_and_migration_renders_without_leftover_placeholders() {
        let q = Queries::new(&table());
        for (file, sql) in q.all() {
            assert!(!sql.contains("{{"), "{file}: {sql}");
        }
        for m in crate::migrate::MIGRATIONS {
            assert!(!render(m.sql, &table()).contains("{{"), "{}", m.name);
        }
    }
}
