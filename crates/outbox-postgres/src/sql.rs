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

/// Every query of this crate, rendered once for one outbox table.
#[derive(Debug, Clone)]
pub(crate) struct Queries {
    pub(crate) claim_batch: Arc<str>,
    pub(crate) claim_batch_unordered: Arc<str>,
    pub(crate) mark_delivered: Arc<str>,
    pub(crate) delete_delivered: Arc<str>,
    pub(crate) schedule_retry: Arc<str>,
    pub(crate) dead_letter: Arc<str>,
    pub(crate) positions_advance: Arc<str>,
    pub(crate) insert: Arc<str>,
    pub(crate) insert_batch: Arc<str>,
    pub(crate) copy_in: Arc<str>,
    pub(crate) backlog: Arc<str>,
    pub(crate) held_aggregates: Arc<str>,
    pub(crate) lock_waits: Arc<str>,
    pub(crate) dead_list: Arc<str>,
    pub(crate) dead_show: Arc<str>,
    pub(crate) dead_retry: Arc<str>,
    pub(crate) dead_purge: Arc<str>,
    pub(crate) cdc_dead_restream: Arc<str>,
    pub(crate) cdc_dead_retry_lock: Arc<str>,
}

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../queries/", $name, ".sql"))
    };
}

impl Queries {
    pub(crate) fn new(table: &QualifiedTable) -> Self {
        let r = |t: &str| -> Arc<str> { render(t, table).into() };
        Self {
            claim_batch: r(query_file!("outbox_claim_batch")),
            claim_batch_unordered: r(query_file!("outbox_claim_batch_unordered")),
            mark_delivered: r(query_file!("outbox_mark_delivered")),
            delete_delivered: r(query_file!("outbox_delete_delivered")),
            schedule_retry: r(query_file!("outbox_schedule_retry")),
            dead_letter: r(query_file!("outbox_dead_letter")),
            positions_advance: r(query_file!("outbox_positions_advance")),
            insert: r(query_file!("outbox_insert")),
            insert_batch: r(query_file!("outbox_insert_batch")),
            copy_in: r(query_file!("outbox_copy_in")),
            backlog: r(query_file!("outbox_backlog")),
            held_aggregates: r(query_file!("outbox_held_aggregates")),
            lock_waits: r(query_file!("outbox_lock_waits")),
            dead_list: r(query_file!("outbox_dead_list")),
            dead_show: r(query_file!("outbox_dead_show")),
            dead_retry: r(query_file!("outbox_dead_retry")),
            dead_purge: r(query_file!("outbox_dead_purge")),
            cdc_dead_restream: r(query_file!("outbox_cdc_dead_restream")),
            cdc_dead_retry_lock: r(query_file!("outbox_cdc_dead_retry_lock")),
        }
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
        for sql in [
            &q.claim_batch,
            &q.claim_batch_unordered,
            &q.mark_delivered,
            &q.delete_delivered,
            &q.schedule_retry,
            &q.dead_letter,
            &q.insert,
            &q.insert_batch,
            &q.copy_in,
            &q.backlog,
            &q.held_aggregates,
            &q.lock_waits,
            &q.dead_list,
            &q.dead_show,
            &q.dead_retry,
            &q.dead_purge,
            &q.cdc_dead_restream,
            &q.cdc_dead_retry_lock,
        ] {
            assert!(!sql.contains("{{"), "{sql}");
        }
        for m in crate::migrate::MIGRATIONS {
            assert!(!render(m.sql, &table()).contains("{{"), "{}", m.name);
        }
    }
}
