//! The one place where a configured schema or table name enters SQL, and the bundled
//! migrations of both dialects.
//!
//! Queries and migrations live in `.sql` files with placeholders (`{{table}}`, `{{schema}}`,
//! `{{name:_suffix}}`, `{{qname:_suffix}}`). [`render`] fills them from validated
//! [`Identifier`]s, always double-quoted. Suffixes come from the `.sql` files shipped with
//! this crate, never from input.

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

/// A rendered statement, marked as audited for sqlx: its only dynamic parts are validated,
/// quoted identifiers inserted by [`render`].
pub(crate) fn stmt(sql: &Arc<str>) -> sqlx::AssertSqlSafe<Arc<str>> {
    sqlx::AssertSqlSafe(Arc::clone(sql))
}

#[cfg(feature = "postgres")]
/// PostgreSQL migrations, in order. Append only; never edit one that has shipped.
pub(crate) const PG_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "processed_events",
        sql: include_str!("../migrations/postgres/0001_processed_events.sql"),
    },
    Migration {
        version: 2,
        name: "positions",
        sql: include_str!("../migrations/postgres/0002_positions.sql"),
    },
];

#[cfg(feature = "sqlite")]
/// SQLite migrations, in order. Append only; never edit one that has shipped.
pub(crate) const SQLITE_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "processed_events",
        sql: include_str!("../migrations/sqlite/0001_processed_events.sql"),
    },
    Migration {
        version: 2,
        name: "positions",
        sql: include_str!("../migrations/sqlite/0002_positions.sql"),
    },
];

/// The schema version this build of the library expects (both dialects).
pub const SCHEMA_VERSION: i32 = 2;

/// Every query of one dialect, rendered once for one inbox table.
#[derive(Debug, Clone)]
pub(crate) struct Queries {
    pub(crate) insert: Arc<str>,
    pub(crate) purge: Arc<str>,
    pub(crate) contains: Arc<str>,
    pub(crate) positions_advance: Arc<str>,
    pub(crate) positions_read: Arc<str>,
}

impl Queries {
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(schema: &Identifier, table: &Identifier) -> Self {
        let r = |t: &str| -> Arc<str> { render(t, Some(schema), table).into() };
        Self {
            insert: r(include_str!(
                "../queries/postgres/processed_events_insert.sql"
            )),
            purge: r(include_str!(
                "../queries/postgres/processed_events_purge.sql"
            )),
            contains: r(include_str!(
                "../queries/postgres/processed_events_contains.sql"
            )),
            positions_advance: r(include_str!("../queries/postgres/positions_advance.sql")),
            positions_read: r(include_str!("../queries/postgres/positions_read.sql")),
        }
    }

    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite(table: &Identifier) -> Self {
        let r = |t: &str| -> Arc<str> { render(t, None, table).into() };
        Self {
            insert: r(include_str!(
                "../queries/sqlite/processed_events_insert.sql"
            )),
            purge: r(include_str!("../queries/sqlite/processed_events_purge.sql")),
            contains: r(include_str!(
                "../queries/sqlite/processed_events_contains.sql"
            )),
            positions_advance: r(include_str!("../queries/sqlite/positions_advance.sql")),
            positions_read: r(include_str!("../queries/sqlite/positions_read.sql")),
        }
    }
}

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
    #[cfg(all(feature = "postgres", feature = "sqlite"))]
    fn every_bundled_query_and_migration_renders_without_leftover_placeholders() {
        let pg = Queries::postgres(&id("public"), &id("seen"));
        let lite = Queries::sqlite(&id("seen"));
        for sql in [
            &pg.insert,
            &pg.purge,
            &pg.contains,
            &lite.insert,
            &lite.purge,
            &lite.contains,
            &pg.positions_advance,
            &pg.positions_read,
            &lite.positions_advance,
            &lite.positions_read,
        ] {
            assert!(!sql.contains("{{"), "{sql}");
        }
        for m in PG_MIGRATIONS {
            assert!(!render(m.sql, Some(&id("public")), &id("seen")).contains("{{"));
        }
        for m in SQLITE_MIGRATIONS {
            assert!(!render(m.sql, None, &id("seen")).contains("{{"));
        }
    }
}
