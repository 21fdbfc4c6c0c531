//! [`SqlInbox`]: the one implementation of the inbox on a SQL database; `PgInbox`,
//! `SqliteInbox` and `MySqlInbox` are this type for `sqlx::Postgres`, `sqlx::Sqlite` and
//! `sqlx::MySql`.
//!
//! # The seam
//!
//! `SqlInbox<D>` is generic over the sqlx [`Database`] type itself: `D: Dialect` is
//! implemented for `Postgres`, `Sqlite` and `MySql` (sealed: no other database can be
//! plugged in from outside). Everything the three inboxes share is written once here, over
//! sqlx's generic `Pool<D>`, `Transaction<'static, D>` and `D::Connection`: the transaction
//! flow of `begin` / `begin_message` / `process` (a duplicate rolls back, or commits its
//! delivery position), the migration plan and its bookkeeping, the positions of the order
//! gate ([`OrderGate`]), the batched purge. A database supplies only what really differs
//! (`Engine`, private):
//!
//! - its SQL, as `.sql` files under `queries/<db>/` and `migrations/<db>/`, loaded with
//!   `include_str!` and rendered once per table by `sql::render` (double-quoted validated
//!   identifiers; `render_mysql` backquotes them): table names never enter SQL raw;
//! - how a value is bound: the event id (`uuid` on PostgreSQL, hyphenated text elsewhere)
//!   and the clock (`timestamptz` / `DATETIME(6)`, Unix microseconds on SQLite);
//! - how a duplicate is detected: `ON CONFLICT DO NOTHING RETURNING 1` returns no row
//!   (PostgreSQL, SQLite), or the insert fails with MySQL's duplicate-key error 1062, which
//!   undoes only that statement;
//! - how transactions start (`BEGIN IMMEDIATE` on SQLite, so that concurrent deliveries
//!   queue on the write lock) and whether single reads and writes run in an explicit
//!   transaction (PostgreSQL, for transaction poolers);
//! - how `migrate` is serialized: inside its transaction by an advisory lock (PostgreSQL)
//!   or the write lock itself (SQLite), or, because MySQL commits DDL on its own, on one
//!   session by a named lock (`GET_LOCK`) around idempotent migrations.
//!
//! Why the database type and not a separate dialect value: the public types keep their
//! names and methods (type aliases of one generic type), the pool and connection types of
//! the signatures follow from `D` (`process` still hands the handler a `&mut PgConnection`
//! on PostgreSQL), and the differences are constants and two lock hooks that the compiler
//! checks per database, rather than three copies of the flow. The generic code needs sqlx's
//! encoding bounds spelled out once per `impl` block (the `where` clauses below); for the
//! three concrete databases they always hold.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use outbox_core::{Identifier, QualifiedTable};
use sqlx::pool::PoolConnection;
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, SqlSafeStr, Transaction,
    Type,
};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{InboxError, MigrateError, MigrationReport};
use crate::lane::{ConsumerOrder, OrderGate};
use crate::sql::{Queries, finish, stmt};
use crate::{DEFAULT_TABLE, InboxMessage, Outcome, PURGE_BATCH};

/// A SQL database the inbox runs on: `sqlx::Postgres` (feature `postgres`), `sqlx::Sqlite`
/// (feature `sqlite`) or `sqlx::MySql` (feature `mysql`). Sealed: what a database supplies
/// (its SQL files, value encodings, duplicate detection, locking) is internal.
pub trait Dialect: engine::Engine {}

impl<D: engine::Engine> Dialect for D {}

pub(crate) mod engine {
    //! What each database supplies to [`SqlInbox`](super::SqlInbox).

    use futures::future::BoxFuture;
    use outbox_core::QualifiedTable;
    use outbox_core::migration::Migration;
    use sqlx::database::HasStatementCache;
    use sqlx::{Database, Encode, Type};
    use time::OffsetDateTime;
    use uuid::Uuid;

    /// The per-database part of the inbox: constants, the `.sql` templates, two encodings
    /// and the lock hooks of `migrate`.
    #[allow(unreachable_pub)] // reachable as the sealed supertrait of `Dialect`
    pub trait Engine: Database + HasStatementCache {
        /// The public name of the inbox type, for `Debug`.
        const INBOX: &'static str;
        /// The schema of a table given without one (`None`: the database has no schemas or
        /// uses the connection's).
        const DEFAULT_SCHEMA: Option<&'static str>;
        /// The migrations of the inbox tables, in order.
        const MIGRATIONS: &'static [Migration];
        /// `queries/<db>/processed_events_insert.sql`: consumer, event id, now.
        const INSERT: &'static str;
        /// `queries/<db>/processed_events_purge.sql`: cutoff, batch size.
        const PURGE: &'static str;
        /// `queries/<db>/processed_events_contains.sql`: consumer, event id.
        const CONTAINS: &'static str;
        /// `queries/<db>/positions_advance.sql`: consumer, aggregate type and id, seq.
        const POSITIONS_ADVANCE: &'static str;
        /// `queries/<db>/positions_read.sql`: consumer, aggregate type and id.
        const POSITIONS_READ: &'static str;
        /// `queries/<db>/migrations_prepare.sql`, raw SQL: the bookkeeping table.
        const MIGRATIONS_PREPARE: &'static str;
        /// `queries/<db>/migrations_applied.sql`: `(version, checksum)` rows.
        const MIGRATIONS_APPLIED: &'static str;
        /// `queries/<db>/migrations_record.sql`: version, name, checksum (and the clock
        /// when [`MIGRATION_AT`](Self::MIGRATION_AT)).
        const MIGRATIONS_RECORD: &'static str;
        /// The bookkeeping row takes its `applied_at` as a parameter (no SQL default).
        const MIGRATION_AT: bool = false;
        /// The statement that opens an inbox transaction (`None`: sqlx's `BEGIN`).
        const BEGIN: Option<&'static str> = None;
        /// Single reads and writes on the pool (`contains`, `applied_position`, each purge
        /// batch, the order gate's `pass`) run in an explicit transaction.
        const TRANSACTION_PER_CALL: bool = false;
        /// `migrate` runs in one transaction (else on one session, with each migration
        /// idempotent, as DDL commits on its own).
        const MIGRATE_IN_TRANSACTION: bool = true;
        /// The insert returns a row when it inserted and none for a duplicate (`ON
        /// CONFLICT DO NOTHING RETURNING 1`); else a duplicate is an error recognized by
        /// [`is_duplicate_key`](Self::is_duplicate_key).
        const INSERT_RETURNS: bool = true;
        /// `positions_advance.sql` takes the seq a second time (for its update clause).
        const ADVANCE_SEQ_TWICE: bool = false;

        /// The event id as the `event_id` column stores it.
        type Id: for<'q> Encode<'q, Self> + Type<Self> + Send + 'static;
        /// A point in time as the timestamp columns store it.
        type Time: for<'q> Encode<'q, Self> + Type<Self> + Send + 'static;

        /// The event id, encoded.
        fn id(id: Uuid) -> Self::Id;
        /// A point in time, encoded.
        fn time(at: OffsetDateTime) -> Self::Time;
        /// Fills the placeholders of one of this database's `.sql` files for `table`.
        fn render(template: &str, table: &QualifiedTable) -> String;

        /// The rows a statement changed (sqlx has no generic accessor).
        fn rows_affected(result: &Self::QueryResult) -> u64;

        /// Whether `e` is the insert's duplicate-key error (when not
        /// [`INSERT_RETURNS`](Self::INSERT_RETURNS)).
        fn is_duplicate_key(_e: &sqlx::Error) -> bool {
            false
        }

        /// Takes `migrate`'s lock for table `name` on `conn` (in migrate's transaction when
        /// [`MIGRATE_IN_TRANSACTION`](Self::MIGRATE_IN_TRANSACTION)); returns what
        /// [`unlock_migrate`](Self::unlock_migrate) needs.
        fn lock_migrate<'c>(
            _conn: &'c mut Self::Connection,
            _name: &'c str,
            _persistent: bool,
        ) -> BoxFuture<'c, Result<Option<String>, sqlx::Error>> {
            Box::pin(async { Ok(None) })
        }

        /// Releases a session lock taken by [`lock_migrate`](Self::lock_migrate).
        fn unlock_migrate(_conn: &mut Self::Connection, _lock: String) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }
}

/// The inbox on one SQL table: `PgInbox` (PostgreSQL), `SqliteInbox` (SQLite),
/// `MySqlInbox` (MySQL / MariaDB). Cheap to clone; create it once.
///
/// Every method records `(consumer, event_id)` in the same transaction as the side effect;
/// see the aliases for examples and `docs/inbox.md` for the contract.
pub struct SqlInbox<D> {
    /// Schema-qualified on PostgreSQL; no schema on SQLite and MySQL.
    pub(crate) table: QualifiedTable,
    queries: Arc<Queries>,
    /// Statements named (cached per connection); false through a transaction pooler
    /// (PostgreSQL's `transaction_pooling`).
    pub(crate) named: bool,
    database: PhantomData<fn() -> D>,
}

impl<D> Clone for SqlInbox<D> {
    fn clone(&self) -> Self {
        Self {
            table: self.table.clone(),
            queries: Arc::clone(&self.queries),
            named: self.named,
            database: PhantomData,
        }
    }
}

impl<D: Dialect> fmt::Debug for SqlInbox<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(D::INBOX)
            .field("table", &self.table)
            .field("queries", &self.queries)
            .field("named", &self.named)
            .finish()
    }
}

impl<D: Dialect> Default for SqlInbox<D> {
    /// The table `processed_events` (in `public` on PostgreSQL).
    fn default() -> Self {
        Self::on(QualifiedTable::new(
            None,
            Identifier::new(DEFAULT_TABLE).expect("a valid identifier"),
        ))
    }
}

impl<D: Dialect> SqlInbox<D> {
    /// The inbox on `table`, in the database's default schema when it has none.
    pub(crate) fn on(table: QualifiedTable) -> Self {
        let schema = table
            .schema
            .clone()
            .or_else(|| D::DEFAULT_SCHEMA.map(|s| Identifier::new(s).expect("a valid identifier")));
        let table = QualifiedTable::new(schema, table.table);
        let queries = Arc::new(Queries::of::<D>(&table));
        Self {
            table,
            queries,
            named: true,
            database: PhantomData,
        }
    }

    fn render(&self, template: &str) -> String {
        D::render(template, &self.table)
    }

    /// `sqlx::query`, unnamed through a transaction pooler.
    fn query<'q>(&self, sql: impl SqlSafeStr) -> Query<'q, D, D::Arguments> {
        sqlx::query(sql).persistent(self.named)
    }

    /// `sqlx::query_as`, unnamed through a transaction pooler.
    fn query_as<'q, O>(&self, sql: impl SqlSafeStr) -> QueryAs<'q, D, O, D::Arguments>
    where
        O: for<'r> sqlx::FromRow<'r, D::Row>,
    {
        sqlx::query_as(sql).persistent(self.named)
    }

    /// `sqlx::query_scalar`, unnamed through a transaction pooler.
    fn query_scalar<'q, O>(&self, sql: impl SqlSafeStr) -> QueryScalar<'q, D, O, D::Arguments>
    where
        (O,): for<'r> sqlx::FromRow<'r, D::Row>,
    {
        sqlx::query_scalar(sql).persistent(self.named)
    }
}

/// A connection from the pool for one read or write: in an explicit transaction where the
/// database wants one ([`TRANSACTION_PER_CALL`](engine::Engine::TRANSACTION_PER_CALL)).
enum Session<D: Database> {
    Transaction(Transaction<'static, D>),
    Connection(PoolConnection<D>),
}

impl<D: Dialect> Session<D> {
    async fn open(pool: &Pool<D>) -> Result<Self, sqlx::Error> {
        Ok(if D::TRANSACTION_PER_CALL {
            Self::Transaction(pool.begin().await?)
        } else {
            Self::Connection(pool.acquire().await?)
        })
    }

    fn conn(&mut self) -> &mut D::Connection {
        match self {
            Self::Transaction(tx) => tx,
            Self::Connection(conn) => conn,
        }
    }

    async fn close(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Transaction(tx) => tx.commit().await,
            Self::Connection(_) => Ok(()),
        }
    }
}

impl<D> SqlInbox<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> &'q str: Encode<'q, D>,
    str: Type<D>,
    for<'q> String: Encode<'q, D>,
    String: Type<D> + for<'r> Decode<'r, D>,
    for<'q> i64: Encode<'q, D>,
    i64: Type<D> + for<'r> Decode<'r, D>,
    for<'q> i32: Encode<'q, D>,
    i32: Type<D> + for<'r> Decode<'r, D>,
    bool: Type<D> + for<'r> Decode<'r, D>,
    usize: ColumnIndex<D::Row>,
{
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
        let db = |source| MigrateError::database("inbox", name, source);
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(
            self.render(D::MIGRATIONS_PREPARE),
        )))
        .await
        .map_err(db)?;
        let applied: Vec<(i32, String)> = self
            .query_as(sqlx::AssertSqlSafe(self.render(D::MIGRATIONS_APPLIED)))
            .fetch_all(&mut *conn)
            .await
            .map_err(db)?;
        let plan = outbox_core::migration::plan(D::MIGRATIONS, &applied)
            .map_err(|c| MigrateError::conflict("inbox", name, c))?;
        let mut report = MigrationReport {
            applied: Vec::new(),
            version: plan.current,
        };
        for (m, checksum) in plan.to_apply {
            conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(self.render(m.sql))))
                .await
                .map_err(db)?;
            let record = self
                .query(sqlx::AssertSqlSafe(self.render(D::MIGRATIONS_RECORD)))
                .bind(m.version)
                .bind(m.name)
                .bind(checksum);
            let record = if D::MIGRATION_AT {
                record.bind(D::time(OffsetDateTime::now_utc()))
            } else {
                record
            };
            record.execute(&mut *conn).await.map_err(db)?;
            tracing::info!(table = %name, version = m.version, migration = m.name, "applied inbox migration");
            report.applied.push((m.version, m.name));
            report.version = m.version;
        }
        Ok(report)
    }

    /// Records `(consumer, event_id)` using `executor` (pass `&mut *tx` to use your own
    /// transaction). `true` when recorded now, `false` for a duplicate, in which case the
    /// caller must skip the side effect. Waits while another open transaction holds the
    /// same key (on MySQL / MariaDB up to the server's `innodb_lock_wait_timeout`; there a
    /// duplicate undoes only this statement and the transaction stays usable). On SQLite,
    /// use a write transaction.
    pub async fn record<'e, X: Executor<'e, Database = D>>(
        &self,
        executor: X,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, sqlx::Error> {
        let insert = self
            .query(stmt(&self.queries.insert))
            .bind(consumer)
            .bind(D::id(event_id))
            .bind(D::time(OffsetDateTime::now_utc()));
        if D::INSERT_RETURNS {
            return Ok(insert.fetch_optional(executor).await?.is_some());
        }
        match insert.execute(executor).await {
            Ok(_) => Ok(true),
            Err(e) if D::is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Begins a transaction and records `(consumer, event_id)` in it. `Some(tx)`: first
    /// delivery; run the side effect in `tx` and commit it (dropping it rolls back both).
    /// `None`: a duplicate; nothing is left open.
    ///
    /// Consumer loops with an order gate use [`begin_message`](Self::begin_message) instead,
    /// which also records the message's delivery position.
    pub async fn begin(
        &self,
        pool: &Pool<D>,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<Option<Transaction<'static, D>>, InboxError> {
        self.begin_at(pool, consumer, event_id, None).await
    }

    /// [`begin`](Self::begin) for a delivered message: also records, in the same
    /// transaction, that `consumer` applied the message's delivery position
    /// (`aggregate_seq`), which the loops' order gate ([`order_gate`](Self::order_gate))
    /// reads. A duplicate still records its position (then commits and returns `None`).
    pub async fn begin_message(
        &self,
        pool: &Pool<D>,
        consumer: &str,
        message: &InboxMessage,
    ) -> Result<Option<Transaction<'static, D>>, InboxError> {
        let position = message.aggregate_seq.map(|seq| {
            (
                message.aggregate_type.as_str(),
                message.aggregate_id.as_str(),
                seq,
            )
        });
        self.begin_at(pool, consumer, message.id, position).await
    }

    async fn begin_at(
        &self,
        pool: &Pool<D>,
        consumer: &str,
        event_id: Uuid,
        position: Option<(&str, &str, u64)>,
    ) -> Result<Option<Transaction<'static, D>>, InboxError> {
        let mut tx = begin(pool).await.map_err(InboxError::Database)?;
        let first = self
            .record(&mut *tx, consumer, event_id)
            .await
            .map_err(InboxError::Database)?;
        if let Some((aggregate_type, aggregate_id, seq)) = position {
            self.advance(&mut tx, consumer, aggregate_type, aggregate_id, seq)
                .await
                .map_err(InboxError::Database)?;
        }
        if first {
            Ok(Some(tx))
        } else if position.is_some() {
            tx.commit().await.map_err(InboxError::Database)?;
            Ok(None)
        } else {
            tx.rollback().await.map_err(InboxError::Database)?;
            Ok(None)
        }
    }

    /// Records that `consumer` applied (or deliberately passed) position `seq` of an
    /// aggregate, using `conn` (your transaction). Never moves back.
    pub async fn advance(
        &self,
        conn: &mut D::Connection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        seq: u64,
    ) -> Result<(), sqlx::Error> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        let advance = self
            .query(stmt(&self.queries.positions_advance))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(seq);
        let advance = if D::ADVANCE_SEQ_TWICE {
            advance.bind(seq)
        } else {
            advance
        };
        advance.execute(conn).await?;
        Ok(())
    }

    /// The highest delivery position of an aggregate that `consumer` applied; 0 when none.
    pub async fn applied_position(
        &self,
        pool: &Pool<D>,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<u64, InboxError> {
        let mut session = Session::open(pool).await.map_err(InboxError::Database)?;
        let seq: Option<i64> = self
            .query_scalar(stmt(&self.queries.positions_read))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .fetch_optional(session.conn())
            .await
            .map_err(InboxError::Database)?;
        session.close().await.map_err(InboxError::Database)?;
        Ok(seq.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    /// The order gate of a consumer loop whose handler records through this inbox with
    /// [`begin_message`](Self::begin_message) or [`process_message`](Self::process_message)
    /// as `consumer`: pass it to the loop's `ordered` setting.
    pub fn order_gate(&self, pool: Pool<D>, consumer: impl Into<String>) -> ConsumerOrder {
        ConsumerOrder::new(InboxGate {
            inbox: self.clone(),
            pool,
            consumer: consumer.into(),
        })
    }

    /// [`begin`](Self::begin), then `handler` on the transaction's connection, then commit.
    /// A duplicate returns [`Outcome::Duplicate`] without calling `handler`; a handler error
    /// rolls back the side effect and the dedup record together.
    pub async fn process<T, E, F>(
        &self,
        pool: &Pool<D>,
        consumer: &str,
        event_id: Uuid,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut D::Connection) -> BoxFuture<'c, Result<T, E>>,
    {
        let tx = self
            .begin_at(pool, consumer, event_id, None)
            .await
            .map_err(InboxError::widen)?;
        finish(tx, handler).await
    }

    /// [`process`](Self::process) for a delivered message, recording its delivery position
    /// with the side effect (see [`begin_message`](Self::begin_message)).
    pub async fn process_message<T, E, F>(
        &self,
        pool: &Pool<D>,
        consumer: &str,
        message: &InboxMessage,
        handler: F,
    ) -> Result<Outcome<T>, InboxError<E>>
    where
        F: for<'c> FnOnce(&'c mut D::Connection) -> BoxFuture<'c, Result<T, E>>,
    {
        let tx = self
            .begin_message(pool, consumer, message)
            .await
            .map_err(InboxError::widen)?;
        finish(tx, handler).await
    }

    /// Whether `consumer` has processed `event_id` (committed). For inspection (tests,
    /// support), **not** as a dedup gate: between this check and your side effect another
    /// instance may apply the same event. Deduplicate with `begin`/`process`, which record
    /// the id in the side effect's own transaction.
    pub async fn contains(
        &self,
        pool: &Pool<D>,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool, InboxError> {
        let mut session = Session::open(pool).await.map_err(InboxError::Database)?;
        let found = self
            .query_scalar(stmt(&self.queries.contains))
            .bind(consumer)
            .bind(D::id(event_id))
            .fetch_one(session.conn())
            .await
            .map_err(InboxError::Database)?;
        session.close().await.map_err(InboxError::Database)?;
        Ok(found)
    }

    /// Deletes the ids processed more than `age` ago, in batches; returns how many.
    ///
    /// Keep `age` well above the broker's redelivery window (the longest time a message can
    /// come back: JetStream `ack_wait × max_deliver` plus backoff, the relay's retry horizon,
    /// Kafka retention for a replay; see `docs/inbox.md`): an id purged before its last
    /// redelivery is processed again.
    pub async fn purge_older_than(&self, pool: &Pool<D>, age: Duration) -> Result<u64, InboxError> {
        self.purge_before(pool, OffsetDateTime::now_utc() - age)
            .await
    }

    /// Deletes the ids processed before `cutoff` (the clock as a parameter), in batches of
    /// [`PURGE_BATCH`]; returns how many.
    pub async fn purge_before(
        &self,
        pool: &Pool<D>,
        cutoff: OffsetDateTime,
    ) -> Result<u64, InboxError> {
        let mut total = 0;
        loop {
            let mut session = Session::open(pool).await.map_err(InboxError::Database)?;
            let done = self
                .query(stmt(&self.queries.purge))
                .bind(D::time(cutoff))
                .bind(PURGE_BATCH)
                .execute(session.conn())
                .await
                .map_err(InboxError::Database)?;
            let n = D::rows_affected(&done);
            session.close().await.map_err(InboxError::Database)?;
            total += n;
            if n < PURGE_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

/// A transaction for the inbox: `BEGIN`, or the database's own statement.
async fn begin<D: Dialect>(pool: &Pool<D>) -> Result<Transaction<'static, D>, sqlx::Error> {
    match D::BEGIN {
        Some(statement) => pool.begin_with(statement).await,
        None => pool.begin().await,
    }
}

/// The order gate over one inbox, for one consumer.
struct InboxGate<D: Database> {
    inbox: SqlInbox<D>,
    pool: Pool<D>,
    consumer: String,
}

impl<D> OrderGate for InboxGate<D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    D::Arguments: IntoArguments<D>,
    for<'q> &'q str: Encode<'q, D>,
    str: Type<D>,
    for<'q> String: Encode<'q, D>,
    String: Type<D> + for<'r> Decode<'r, D>,
    for<'q> i64: Encode<'q, D>,
    i64: Type<D> + for<'r> Decode<'r, D>,
    for<'q> i32: Encode<'q, D>,
    i32: Type<D> + for<'r> Decode<'r, D>,
    bool: Type<D> + for<'r> Decode<'r, D>,
    usize: ColumnIndex<D::Row>,
{
    fn applied<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
    ) -> BoxFuture<'a, Result<u64, InboxError>> {
        Box::pin(self.inbox.applied_position(
            &self.pool,
            &self.consumer,
            aggregate_type,
            aggregate_id,
        ))
    }

    fn pass<'a>(
        &'a self,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<(), InboxError>> {
        Box::pin(async move {
            let mut session = Session::open(&self.pool)
                .await
                .map_err(InboxError::Database)?;
            self.inbox
                .advance(
                    session.conn(),
                    &self.consumer,
                    aggregate_type,
                    aggregate_id,
                    seq,
                )
                .await
                .map_err(InboxError::Database)?;
            session.close().await.map_err(InboxError::Database)
        })
    }
}

#[cfg(test)]
mod tests;
