//! The one place where a configured table name enters SQL.
//!
//! Queries and migrations live in `.sql` files with placeholders (`{{table}}`,
//! `{{name:_suffix}}`), filled from a validated [`Identifier`] (letters, digits and `_`
//! only) and written backquoted, MySQL's identifier quote. The bundled files contain no
//! double quote of their own, so every `"` of the shared renderer's output is an identifier
//! quote and becomes a backquote.
//!
//! [`Cols`] reads the rows of the operator queries for `outbox_core::admin_rows`.

use std::sync::Arc;

use outbox_core::Identifier;
use outbox_core::admin_rows::Columns;
use sqlx::Row;
use sqlx::mysql::MySqlRow;
use time::{OffsetDateTime, PrimitiveDateTime};
use uuid::Uuid;

/// Fills the placeholders of `template` for `table`.
///
/// # Panics
/// On an unknown placeholder or a malformed suffix: bugs in this crate's `.sql` files
/// (covered by tests), never caused by input.
pub(crate) fn render(template: &str, table: &Identifier) -> String {
    assert!(
        !template.contains('"'),
        "a double quote in bundled MySQL SQL (it would be a string literal)"
    );
    outbox_core::migration::render_sql(template, None, table, &[]).replace('"', "`")
}

/// The statements of a migration file, split at its `-- ;;` lines.
pub(crate) fn statements(sql: &str) -> impl Iterator<Item = &str> {
    sql.split("\n-- ;;\n")
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

outbox_sql::query_set! {
    /// Every query of this crate, rendered once for one outbox table.
    pub(crate) struct Queries;
    fn new(table: &Identifier), rendered by |sql| render(sql, table);
    files "outbox_" {
        insert, claim_batch, claim_batch_unordered, mark_delivered, delete_delivered,
        schedule_retry, dead_letter, backlog,
    }
    files "" {
        lease_claim, lease_claimed, lease_retry, lease_dead_letter,
    }
    derived {
        /// `insert` up to (not including) its `VALUES`, for multi-row inserts.
        insert_head: Arc<str> = insert
            .split("VALUES")
            .next()
            .unwrap_or_default()
            .trim_end()
            .into(),
        /// The table, rendered, for statements built with a variable number of placeholders.
        table: Arc<str> = render("{{table}}", table).into(),
    }
}

/// A rendered statement, marked as audited for sqlx: its only dynamic parts are validated,
/// quoted identifiers inserted by [`render`].
pub(crate) fn stmt(sql: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(sql))
}

/// A row of an operator query, for `outbox_core::admin_rows`: ids are hyphenated text, times
/// `DATETIME(6)` in UTC.
pub(crate) struct Cols<'r>(pub(crate) &'r MySqlRow);

impl Columns for Cols<'_> {
    type Error = sqlx::Error;

    outbox_core::forward_plain_columns!();

    fn id(&self, i: usize) -> Result<Uuid, sqlx::Error> {
        parse_id(&self.0.try_get::<String, _>(i)?)
    }

    fn time(&self, i: usize) -> Result<OffsetDateTime, sqlx::Error> {
        Ok(self.0.try_get::<PrimitiveDateTime, _>(i)?.assume_utc())
    }

    fn time_opt(&self, i: usize) -> Result<Option<OffsetDateTime>, sqlx::Error> {
        let at: Option<PrimitiveDateTime> = self.0.try_get(i)?;
        Ok(at.map(PrimitiveDateTime::assume_utc))
    }
}

/// An event id stored as text.
pub(crate) fn parse_id(text: &str) -> Result<Uuid, sqlx::Error> {
    Uuid::parse_str(text).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Identifier {
        Identifier::new("events").expect("valid")
    }

    #[test]
    fn placeholders_render_to_backquoted_identifiers() {
        assert_eq!(
            render("{{table}} {{name:_aggregate_heads}}", &table()),
            "`events` `events_aggregate_heads`"
        );
    }

    #[test]
    fn every_bundled_file_renders_without_leftover_placeholders() {
        let q = Queries::new(&table());
        let derived = [("insert_head", &*q.insert_head), ("table", &*q.table)];
        for (file, sql) in q.all().chain(derived) {
            assert!(
                !sql.contains("{{") && sql.contains("`events`"),
                "{file}: {sql}"
            );
        }
        // These also name tables derived from the outbox's (`events_...`).
        let admin = crate::admin::AdminQueries::new(&table());
        let cdc = crate::cdc::CdcQueries::new(&table());
        for (file, sql) in admin.all().chain(cdc.all()) {
            assert!(
                !sql.contains("{{") && sql.contains("`events"),
                "{file}: {sql}"
            );
        }
        for m in crate::migrate::MIGRATIONS {
            let sql = render(m.sql, &table());
            assert!(!sql.contains("{{"), "{}", m.name);
            assert!(statements(&sql).count() > 1, "{}", m.name);
        }
    }
}
