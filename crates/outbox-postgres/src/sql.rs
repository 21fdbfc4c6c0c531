//! The one place where a configured schema or table name enters SQL.
//!
//! Queries and migrations live in `.sql` files with placeholders (`{{table}}`, `{{schema}}`,
//! `{{name:_suffix}}`, `{{qname:_suffix}}`, `{{regclass:_suffix}}`). [`render`] fills them
//! from a [`QualifiedTable`], whose parts are validated identifiers, always double-quoted.
//! Suffixes come from the `.sql` files shipped with this crate, never from input.
//!
//! [`Cols`] reads the rows of the operator queries for `outbox_core::admin_rows`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use outbox_core::admin_rows::Columns;
use outbox_core::migration::render_sql;
use outbox_core::{Identifier, QualifiedTable};
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{FromRow, Postgres, SqlSafeStr};
use time::OffsetDateTime;
use uuid::Uuid;

/// Fills the placeholders of `template` for `table`.
///
/// # Panics
/// On an unknown placeholder or a malformed suffix: both are bugs in this crate's `.sql`
/// files (covered by tests), never caused by input.
pub(crate) fn render(template: &str, table: &QualifiedTable) -> String {
    render_with(template, table, &[])
}

/// [`render`], plus named identifiers of other objects (`{{publication}}` for CDC): each is
/// a validated [`Identifier`], written double-quoted.
pub(crate) fn render_with(
    template: &str,
    table: &QualifiedTable,
    named: &[(&str, &Identifier)],
) -> String {
    match &table.schema {
        Some(schema) => render_sql(template, Some(schema), &table.table, named),
        None => render_sql(template, Some(&public()), &table.table, named),
    }
}

/// The schema of a table configured without one.
fn public() -> Identifier {
    Identifier::new("public").expect("a valid identifier")
}

outbox_sql::query_set! {
    /// Every query of this crate, rendered once for one outbox table.
    pub(crate) struct Queries;
    fn new(table: &QualifiedTable), rendered by |sql| render(sql, table);
    files "outbox_" {
        claim_batch, claim_batch_unordered, mark_delivered, delete_delivered, schedule_retry,
        dead_letter, positions_advance, insert, insert_batch, copy_in, backlog, held_aggregates,
        lock_waits, dead_list, dead_show, dead_retry, dead_purge, cdc_dead_restream,
        cdc_dead_retry_lock,
    }
}

/// False once this process connected through a transaction pooler
/// (`source.transaction_pooling`): statements are then unnamed, prepared and run inside one
/// transaction each, never cached by name on a server connection another client may get next.
static NAMED_STATEMENTS: AtomicBool = AtomicBool::new(true);

/// Switches this process to unnamed statements (see [`NAMED_STATEMENTS`]).
pub(crate) fn use_unnamed_statements() {
    NAMED_STATEMENTS.store(false, Ordering::Relaxed);
}

pub(crate) fn named() -> bool {
    NAMED_STATEMENTS.load(Ordering::Relaxed)
}

/// `sqlx::query`, with named (cached) statements unless a transaction pooler is in between.
#[allow(clippy::disallowed_methods)] // the one place this crate makes statements
pub(crate) fn query<'q>(sql: impl SqlSafeStr) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(sql).persistent(named())
}

/// `sqlx::query_as`, see [`query`].
#[allow(clippy::disallowed_methods)] // the one place this crate makes statements
pub(crate) fn query_as<'q, O>(sql: impl SqlSafeStr) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_as(sql).persistent(named())
}

/// `sqlx::query_scalar`, see [`query`].
#[allow(clippy::disallowed_methods)] // the one place this crate makes statements
pub(crate) fn query_scalar<'q, O>(sql: impl SqlSafeStr) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_scalar(sql).persistent(named())
}

/// A rendered statement, marked as audited for sqlx: its only dynamic parts are validated,
/// quoted identifiers inserted by [`render`].
pub(crate) fn stmt(sql: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(sql))
}

/// A row of an operator query, for `outbox_core::admin_rows`: ids are `uuid`, times
/// `timestamptz`.
pub(crate) struct Cols<'r>(pub(crate) &'r PgRow);

impl Columns for Cols<'_> {
    type Error = sqlx::Error;

    outbox_core::forward_plain_columns!();

    fn id(&self, i: usize) -> Result<Uuid, sqlx::Error> {
        self.0.try_get(i)
    }

    fn time(&self, i: usize) -> Result<OffsetDateTime, sqlx::Error> {
        self.0.try_get(i)
    }

    fn time_opt(&self, i: usize) -> Result<Option<OffsetDateTime>, sqlx::Error> {
        self.0.try_get(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::Identifier;

    fn table() -> QualifiedTable {
        QualifiedTable::new(
            Some(Identifier::new("app").expect("valid")),
            Identifier::new("events").expect("valid"),
        )
    }

    #[test]
    fn placeholders_render_to_quoted_identifiers() {
        let sql = render(
            "{{table}} {{schema}} {{name:_idx}} {{qname:_seq}} {{regclass:_seq}}",
            &table(),
        );
        assert_eq!(
            sql,
            "\"app\".\"events\" \"app\" \"events_idx\" \"app\".\"events_seq\" '\"app\".\"events_seq\"'::regclass"
        );
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
