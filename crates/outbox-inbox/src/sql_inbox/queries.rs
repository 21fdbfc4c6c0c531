//! Every query of one database, rendered once for one inbox table from the dialect's
//! bundled `.sql` files.

use std::sync::Arc;

#[cfg(test)]
use outbox_core::Identifier;

/// Every query of one database, rendered once for one inbox table.
#[derive(Debug, Clone)]
pub(crate) struct Queries {
    pub(crate) insert: Arc<str>,
    pub(crate) purge: Arc<str>,
    pub(crate) contains: Arc<str>,
    pub(crate) positions_advance: Arc<str>,
    pub(crate) positions_read: Arc<str>,
}

impl Queries {
    /// Every query of database `D`, rendered for `table`.
    pub(crate) fn of<D: super::Dialect>(table: &outbox_core::QualifiedTable) -> Self {
        let r = |t: &str| -> Arc<str> { D::render(t, table).into() };
        Self {
            insert: r(D::INSERT),
            purge: r(D::PURGE),
            contains: r(D::CONTAINS),
            positions_advance: r(D::POSITIONS_ADVANCE),
            positions_read: r(D::POSITIONS_READ),
        }
    }

    #[cfg(all(test, feature = "postgres"))]
    pub(crate) fn postgres(schema: &Identifier, table: &Identifier) -> Self {
        let table = outbox_core::QualifiedTable::new(Some(schema.clone()), table.clone());
        Self::of::<sqlx::Postgres>(&table)
    }

    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) fn sqlite(table: &Identifier) -> Self {
        Self::of::<sqlx::Sqlite>(&outbox_core::QualifiedTable::new(None, table.clone()))
    }

    #[cfg(all(test, feature = "mysql"))]
    pub(crate) fn mysql(table: &Identifier) -> Self {
        Self::of::<sqlx::MySql>(&outbox_core::QualifiedTable::new(None, table.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(any(all(feature = "postgres", feature = "sqlite"), feature = "mysql"))]
    use crate::sql::*;

    #[cfg(any(all(feature = "postgres", feature = "sqlite"), feature = "mysql"))]
    fn id(s: &str) -> Identifier {
        Identifier::new(s).expect("valid")
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

    #[test]
    #[cfg(feature = "mysql")]
    fn every_bundled_mysql_file_renders_backquoted_without_leftover_placeholders() {
        assert_eq!(
            render_mysql("{{table}} {{name:_positions}}", &id("seen")),
            "`seen` `seen_positions`"
        );
        let q = Queries::mysql(&id("seen"));
        for sql in [
            &q.insert,
            &q.purge,
            &q.contains,
            &q.positions_advance,
            &q.positions_read,
        ] {
            assert!(!sql.contains("{{") && !sql.contains('"'), "{sql}");
            assert!(sql.contains("`seen"), "{sql}");
        }
        for m in MYSQL_MIGRATIONS {
            let sql = render_mysql(m.sql, &id("seen"));
            assert!(
                !sql.contains("{{") && sql.contains("IF NOT EXISTS"),
                "{}",
                m.name
            );
        }
        assert_eq!(MYSQL_MIGRATIONS.len(), SCHEMA_VERSION as usize);
    }
}
