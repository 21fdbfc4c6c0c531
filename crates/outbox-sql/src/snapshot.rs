//! The sqlx half of `outbox capture snapshot` that the SQL databases share: a chunk's
//! transaction ([`SqlSnapshot`], the [`SnapshotTx`] that `outbox-core`'s `Chunked` runs) locks
//! the capture's progress row, records the chunk and commits the same way on every database,
//! and a snapshot starts only when the capture's triggers are on its table
//! ([`check_triggers`]).
//!
//! A database supplies the rest ([`SnapshotDb`]): its `BEGIN`, how its progress row's key
//! decodes ([`LockedKey`]; a key kept as text needs nothing), the chunk's read-and-insert, and which of its errors mean "run the chunk again" or
//! "a NULL where the outbox wants a value". Its `capture_snapshot_lock.sql` takes the
//! capture's name as its one parameter; its `capture_snapshot_advance.sql` takes the new last
//! key, the rows to add, whether the snapshot finished, then the capture's name (and any
//! parameter of its own after those, [`SnapshotDb::bind_advance`]).

use outbox_core::capture::recorded::check_trigger;
use outbox_core::capture::snapshot::SnapshotTx;
use outbox_core::capture::{CaptureEntry, CaptureError, op_trigger_name};
use sqlx::query::Query;
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Transaction, Type,
};

/// One database's part of a snapshot chunk's transaction (see the module docs).
pub trait SnapshotDb: Send + Sync {
    /// The database.
    type Database: Database;
    /// A primary-key value as the progress row keeps it.
    type Key: Send
        + Sync
        + LockedKey<Self::Database>
        + for<'e> Encode<'e, Self::Database>
        + Type<Self::Database>;

    /// Begins a chunk's transaction.
    fn begin(
        &self,
    ) -> impl Future<Output = Result<Transaction<'static, Self::Database>, sqlx::Error>> + Send;

    /// The lock or advance statement `sql`, to be bound: `sqlx::query` unless the database
    /// makes its statements otherwise (unnamed behind a transaction pooler, say).
    fn query(sql: &str) -> Query<'static, Self::Database, <Self::Database as Database>::Arguments> {
        sqlx::query(sqlx::AssertSqlSafe(sql))
    }

    /// Reads up to `limit` rows after `last` (from the start when `None`) in key order,
    /// share-locked, and inserts their snapshot events; returns how many and the last key
    /// (`None` when there was no row). [`SnapshotTx::write`].
    fn write(
        &self,
        tx: &mut Transaction<'static, Self::Database>,
        last: Option<&Self::Key>,
        limit: u32,
    ) -> impl Future<Output = Result<(u64, Option<Self::Key>), sqlx::Error>> + Send;

    /// Binds the advance statement's parameters after the four every database takes; none
    /// unless the database's statement has more.
    fn bind_advance(
        query: Query<'static, Self::Database, <Self::Database as Database>::Arguments>,
    ) -> Query<'static, Self::Database, <Self::Database as Database>::Arguments> {
        query
    }

    /// A deadlock, lock timeout or serialization failure: [`SnapshotTx::retryable`].
    fn retryable(e: &sqlx::Error) -> bool;

    /// A NULL aggregate id, event type or payload refused by the outbox table:
    /// [`SnapshotTx::null_in_row`].
    fn null_in_row(e: &sqlx::Error) -> bool;
}

/// A progress row's last key as the lock statement reads it.
pub trait LockedKey<DB: Database>: Sized {
    /// The last key in the row the lock statement read (`None`: no chunk yet).
    fn locked(row: &DB::Row) -> Result<Option<Self>, sqlx::Error>;
}

/// A key kept as text (the lock statement's one column).
impl<DB> LockedKey<DB> for String
where
    DB: Database,
    usize: ColumnIndex<DB::Row>,
    String: for<'r> Decode<'r, DB> + Type<DB>,
{
    fn locked(row: &DB::Row) -> Result<Option<Self>, sqlx::Error> {
        row.try_get(0)
    }
}

/// A capture's snapshot chunks on one SQL database: the progress statements, rendered for the
/// capture's outbox, and the database's part.
pub struct SqlSnapshot<D> {
    name: String,
    lock: String,
    advance: String,
    db: D,
}

impl<D> SqlSnapshot<D> {
    /// The chunks of capture `name`: `lock` and `advance` are the database's rendered
    /// `capture_snapshot_lock.sql` and `capture_snapshot_advance.sql` (see the module docs).
    pub fn new(name: impl ToString, lock: String, advance: String, db: D) -> Self {
        Self {
            name: name.to_string(),
            lock,
            advance,
            db,
        }
    }
}

impl<D, DB> SnapshotTx for SqlSnapshot<D>
where
    D: SnapshotDb<Database = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'e> Option<&'e D::Key>: Encode<'e, DB> + Type<DB>,
    String: for<'e> Encode<'e, DB> + Type<DB>,
    i64: for<'e> Encode<'e, DB> + Type<DB>,
    bool: for<'e> Encode<'e, DB> + Type<DB>,
{
    type Tx = Transaction<'static, DB>;
    type Key = D::Key;
    type Error = sqlx::Error;

    async fn begin(&self) -> Result<Self::Tx, sqlx::Error> {
        self.db.begin().await
    }

    async fn lock(&self, tx: &mut Self::Tx) -> Result<Option<Option<D::Key>>, sqlx::Error> {
        let row = D::query(&self.lock)
            .bind(&self.name)
            .fetch_optional(&mut **tx)
            .await?;
        row.as_ref().map(D::Key::locked).transpose()
    }

    async fn write(
        &self,
        tx: &mut Self::Tx,
        last: Option<&D::Key>,
        limit: u32,
    ) -> Result<(u64, Option<D::Key>), sqlx::Error> {
        self.db.write(tx, last, limit).await
    }

    async fn advance(
        &self,
        tx: &mut Self::Tx,
        last: Option<&D::Key>,
        rows: u64,
        finished: bool,
    ) -> Result<(), sqlx::Error> {
        let query = D::query(&self.advance)
            .bind(last)
            .bind(rows as i64)
            .bind(finished)
            .bind(&self.name);
        D::bind_advance(query).execute(&mut **tx).await.map(drop)
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), sqlx::Error> {
        tx.commit().await
    }

    fn retryable(e: &sqlx::Error) -> bool {
        D::retryable(e)
    }

    fn null_in_row(e: &sqlx::Error) -> bool {
        D::null_in_row(e)
    }
}

/// Checks that each trigger of the capture `entry` is on `table`, asking `trigger_of` (the
/// database's query of the table a trigger is on, its name bound) over `conn`. Without them,
/// live changes would not follow the snapshot. A database error is worded with `context`.
pub async fn check_triggers<DB>(
    conn: &mut DB::Connection,
    entry: CaptureEntry<'_>,
    table: &str,
    trigger_of: &'static str,
    context: &str,
) -> Result<(), CaptureError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    String: for<'e> Encode<'e, DB> + for<'r> Decode<'r, DB> + Type<DB>,
{
    let name = entry.config.name();
    for op in entry.config.ops() {
        let on: Option<String> = sqlx::query_scalar(trigger_of)
            .bind(op_trigger_name(&name, op))
            .fetch_optional(&mut *conn)
            .await
            .map_err(CaptureError::database(context))?;
        check_trigger(entry, op, table, on.as_deref())?;
    }
    Ok(())
}
