//! The bookkeeping half of `migrate`, the same on every SQL database: create the table's
//! `<table>_migrations`, read what it records, decide what to apply
//! ([`outbox_core::migration::plan`]), and record each migration once it is applied. The
//! database crate holds the connection (in its transaction, or under its lock), runs each
//! migration's statements its own way, and renders these statements for its table.

use outbox_core::migration::{self, MigrateError, Migration, MigrationPlan};
use sqlx::database::HasStatementCache;
use sqlx::{Connection, Database, Decode, Encode, Executor, IntoArguments, Type};

/// The statements of one table's `<table>_migrations`, rendered for that table, and what
/// errors name.
#[derive(Debug, Clone)]
pub struct Bookkeeping<'a> {
    /// What the table is, for errors: `"outbox"` or `"inbox"`.
    pub kind: &'static str,
    /// The table whose schema this is, as errors and logs name it.
    pub table: &'a str,
    /// `CREATE TABLE IF NOT EXISTS` of the bookkeeping table.
    pub create: String,
    /// `SELECT version, checksum ... ORDER BY version`.
    pub read: String,
    /// `INSERT` of one applied migration: version, name and checksum, bound in that order.
    pub record: String,
}

impl Bookkeeping<'_> {
    /// A database error of this run.
    pub fn error(&self, e: sqlx::Error) -> MigrateError {
        MigrateError::database(self.kind, self.table, e)
    }
}

impl<'a> Bookkeeping<'a> {
    /// This run's bookkeeping on `conn`, the connection the database crate holds (in its
    /// transaction, or under its lock) and runs the migrations' own statements on
    /// ([`Migrating::conn`]).
    pub fn on<'c, C>(&'c self, conn: &'c mut C) -> Migrating<'c, 'a, C> {
        Migrating { book: self, conn }
    }
}

/// One `migrate` run's bookkeeping on the connection it holds ([`Bookkeeping::on`]).
///
/// Its statements run unprepared or as unnamed statements: they run once per `migrate`, and
/// a transaction pooler in front must not see a named statement.
#[derive(Debug)]
pub struct Migrating<'c, 'a, C> {
    book: &'c Bookkeeping<'a>,
    /// The connection, for the migrations' own statements.
    pub conn: &'c mut C,
}

impl<C, DB> Migrating<'_, '_, C>
where
    C: Connection<Database = DB>,
    DB: Database + HasStatementCache,
    for<'c> &'c mut C: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    i32: Type<DB> + for<'r> Decode<'r, DB> + for<'q> Encode<'q, DB>,
    String: Type<DB> + for<'r> Decode<'r, DB>,
    for<'s> &'s str: Type<DB> + Encode<'s, DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    /// Creates the bookkeeping table when it is missing, reads what it records and plans
    /// which of `bundled` to apply (an edited or unknown recorded migration is refused).
    pub async fn pending<'m>(
        &mut self,
        bundled: &'m [Migration],
    ) -> Result<MigrationPlan<'m>, MigrateError> {
        let book = self.book;
        (&mut *self.conn)
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(book.create.clone())))
            .await
            .map_err(|e| book.error(e))?;
        let applied: Vec<(i32, String)> = sqlx::query_as(sqlx::AssertSqlSafe(book.read.clone()))
            .persistent(false)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(|e| book.error(e))?;
        migration::plan(bundled, &applied)
            .map_err(|c| MigrateError::conflict(book.kind, book.table, c))
    }

    /// Runs one migration's rendered script (one statement or several) as raw SQL.
    pub async fn run_script(&mut self, sql: String) -> Result<(), MigrateError> {
        (&mut *self.conn)
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
            .await
            .map(drop)
            .map_err(|e| self.book.error(e))
    }

    /// Records `m`, just applied with `checksum` (from [`Migrating::pending`]'s plan), and
    /// logs it.
    pub async fn record(&mut self, m: &Migration, checksum: &str) -> Result<(), MigrateError> {
        let book = self.book;
        sqlx::query::<DB>(sqlx::AssertSqlSafe(book.record.clone()))
            .persistent(false)
            .bind(m.version)
            .bind(m.name)
            .bind(checksum)
            .execute(&mut *self.conn)
            .await
            .map_err(|e| book.error(e))?;
        tracing::info!(
            table = %book.table,
            version = m.version,
            migration = m.name,
            "applied {} migration",
            book.kind
        );
        Ok(())
    }
}

/// The [`Bookkeeping`] of `kind` (`"outbox"`, `"inbox"`) for the table named `table`, from the
/// invoking crate's `queries/migrations_create.sql`, `migrations_applied.sql` and
/// `migrations_record.sql` (read at compile time), each rendered by the closure `render`.
#[macro_export]
macro_rules! bookkeeping {
    ($kind:literal, $table:expr, $render:expr) => {{
        let render = $render;
        $crate::migrate::Bookkeeping {
            kind: $kind,
            table: $table,
            create: render(include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/queries/migrations_create.sql"
            ))),
            read: render(include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/queries/migrations_applied.sql"
            ))),
            record: render(include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/queries/migrations_record.sql"
            ))),
        }
    }};
}
