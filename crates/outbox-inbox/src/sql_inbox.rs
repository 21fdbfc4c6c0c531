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
//!
//! The flow is split by concern: [`engine`] (what a database supplies), `dedup` (recording an
//! event id with the side effect), `positions` (the order gate's delivery positions),
//! `migrate` and `purge`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use outbox_core::{Identifier, QualifiedTable};
use sqlx::pool::PoolConnection;
use sqlx::query::{Query, QueryScalar};
use sqlx::{Database, Pool, SqlSafeStr, Transaction};

use crate::DEFAULT_TABLE;
#[cfg(doc)]
use crate::lane::OrderGate;
use queries::Queries;

/// A SQL database the inbox runs on: `sqlx::Postgres` (feature `postgres`), `sqlx::Sqlite`
/// (feature `sqlite`) or `sqlx::MySql` (feature `mysql`). Sealed: what a database supplies
/// (its SQL files, value encodings, duplicate detection, locking) is internal.
pub trait Dialect: engine::Engine {}

impl<D: engine::Engine> Dialect for D {}

pub(crate) mod engine;

/// Writes the `impl<D> ... { ... }` it is given with the sqlx bounds of the generic code over
/// `D` as its `where` clause: what `D`'s connection executes and the types it binds and
/// decodes. Spelled once here: a trait cannot carry them, as Rust implies only a trait's
/// bounds on `Self` at its use sites, not bounds on `&mut D::Connection` or `String`. For
/// the three concrete databases they always hold.
macro_rules! with_sql_bounds {
    (impl<D> $($rest:tt)*) => {
        with_sql_bounds!(@head [] $($rest)*);
    };
    // The header is everything before the last brace group, the body.
    (@head [$($head:tt)*] { $($body:tt)* }) => {
        impl<D> $($head)*
        where
            D: $crate::sql_inbox::Dialect,
            for<'c> &'c mut D::Connection: sqlx::Executor<'c, Database = D>,
            D::Arguments: sqlx::IntoArguments<D>,
            for<'q> &'q str: sqlx::Encode<'q, D>,
            str: sqlx::Type<D>,
            for<'q> String: sqlx::Encode<'q, D>,
            String: sqlx::Type<D> + for<'r> sqlx::Decode<'r, D>,
            for<'q> i64: sqlx::Encode<'q, D>,
            i64: sqlx::Type<D> + for<'r> sqlx::Decode<'r, D>,
            for<'q> i32: sqlx::Encode<'q, D>,
            i32: sqlx::Type<D> + for<'r> sqlx::Decode<'r, D>,
            bool: sqlx::Type<D> + for<'r> sqlx::Decode<'r, D>,
            usize: sqlx::ColumnIndex<D::Row>,
        {
            $($body)*
        }
    };
    (@head [$($head:tt)*] $next:tt $($rest:tt)*) => {
        with_sql_bounds!(@head [$($head)* $next] $($rest)*);
    };
}

mod dedup;
mod migrate;
mod positions;
mod purge;
mod queries;

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

/// A transaction for the inbox: `BEGIN`, or the database's own statement.
async fn begin<D: Dialect>(pool: &Pool<D>) -> Result<Transaction<'static, D>, sqlx::Error> {
    match D::BEGIN {
        Some(statement) => pool.begin_with(statement).await,
        None => pool.begin().await,
    }
}

#[cfg(test)]
mod tests;
