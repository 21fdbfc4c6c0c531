//! `migrate`: the inbox tables created or upgraded, once per database even when several
//! instances start together, each migration recorded in `<table>_migrations`.

use outbox_sql::migrate::Bookkeeping;
use sqlx::Pool;

use super::{SqlInbox, begin};
use crate::error::{MigrateError, MigrationReport};

with_sql_bounds! {
    impl<D> SqlInbox<D> {
        /// Creates or upgrades the inbox tables (the table, its positions, the bookkeeping
        /// table `<table>_migrations`). Idempotent and safe to run concurrently:
        /// - PostgreSQL: one transaction that first takes an advisory lock named after the
        ///   table;
        /// - SQLite: one `BEGIN IMMEDIATE` transaction, so a second `migrate` waits and finds
        ///   nothing to do;
        /// - MySQL / MariaDB: a named lock (`GET_LOCK`, per database and table) held for the
        ///   whole run, so a second `migrate` waits (up to 60 s) and finds nothing to do. Each
        ///   migration is idempotent DDL (MySQL commits DDL on its own), recorded once it
        ///   succeeded.
        pub async fn migrate(&self, pool: &Pool<D>) -> Result<MigrationReport, MigrateError> {
            let name = self.table.to_string();
            let db = |source| MigrateError::database("inbox", &name, source);
            if D::MIGRATE_IN_TRANSACTION {
                let mut tx = begin(pool).await.map_err(db)?;
                D::lock_migrate(&mut tx, &name, self.named)
                    .await
                    .map_err(db)?;
                let report = self.apply_migrations(&mut tx, &name).await?;
                tx.commit().await.map_err(db)?;
                Ok(report)
            } else {
                let mut conn = pool.acquire().await.map_err(db)?;
                // A migrate dropped half-way must not leave a session lock held by a pooled
                // connection: closing the session releases it.
                conn.close_on_drop();
                let lock = D::lock_migrate(&mut conn, &name, self.named)
                    .await
                    .map_err(db)?;
                let result = self.apply_migrations(&mut conn, &name).await;
                if let Some(lock) = lock {
                    D::unlock_migrate(&mut conn, lock).await;
                }
                result
            }
        }

        /// The bookkeeping table, then every migration not applied yet, each recorded.
        async fn apply_migrations(
            &self,
            conn: &mut D::Connection,
            name: &str,
        ) -> Result<MigrationReport, MigrateError> {
            let book = Bookkeeping {
                kind: "inbox",
                table: name,
                create: self.render(D::MIGRATIONS_PREPARE),
                read: self.render(D::MIGRATIONS_APPLIED),
                record: self.render(D::MIGRATIONS_RECORD),
            };
            let mut run = book.on(conn);
            let plan = run.pending(D::MIGRATIONS).await?;
            let mut report = MigrationReport {
                applied: Vec::new(),
                version: plan.current,
            };
            for (m, checksum) in plan.to_apply {
                run.run_script(self.render(m.sql)).await?;
                run.record(m, &checksum).await?;
                report.applied.push((m.version, m.name));
                report.version = m.version;
            }
            Ok(report)
        }
    }
}
