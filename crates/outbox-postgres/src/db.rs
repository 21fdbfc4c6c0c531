//! [`Db`]: how the relay and the operator commands reach PostgreSQL. A pool that runs every
//! statement in a transaction of its own, committed before the statement's future returns.
//!
//! Why (docs/polling.md, "Through PgBouncer"): a transaction pooler such as PgBouncer in
//! `pool_mode = transaction` hands a client's next transaction, or its next statement outside
//! one, to whichever server connection is free. sqlx runs a statement with bind parameters in
//! two round trips when it is not cached (Parse/Describe, then Bind/Execute, each closed by a
//! Sync); a pooler may run the second half on another server, where the unnamed statement is
//! someone else's. A named (cached) statement is worse: its name (`sqlx_s_1`, …) means another
//! client's statement on another server, and runs that statement with this client's
//! parameters. Inside an explicit transaction the pooler keeps one server until `COMMIT`, and
//! with unnamed statements nothing outlives the transaction. So, through a pooler:
//!
//! - every statement sent on a `&Db` runs as `BEGIN; statement; COMMIT`, and its future
//!   resolves only after the `COMMIT` answered: a write is durable when the caller hears
//!   "done", never later, in a task the caller cannot await (what the pool hooks this
//!   replaced did: a fan-out copy could commit after the outbox rows it copied were marked
//!   delivered, or never, if the relay died in between);
//! - statements are never named ([`Execute::persistent`] is false for every statement);
//! - statements that belong together take [`Db::begin`] and commit themselves.
//!
//! The same code runs without a pooler (statements then keep their cached names): one path for
//! both deployments, so the path through a pooler is the one every test exercises. The cost
//! without a pooler is two short round trips (`BEGIN`, `COMMIT`) per statement sent on the
//! pool, none of which is per event.
//!
//! A [`Db`] is not a [`PgPool`]: code holding one cannot reach a connection outside a
//! transaction. The CDC source, which needs a replication session and is refused through a
//! pooler at config time, keeps a plain pool.

use futures::{StreamExt, TryStreamExt};
use sqlx::postgres::{PgArguments, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{Executor, PgPool, Postgres, Transaction};
use sqlx_core::Either;
use sqlx_core::executor::Execute;
use sqlx_core::sql_str::SqlStr;

/// A pool that hands out transactions only (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Db {
    pool: PgPool,
    /// Through a transaction pooler (`source.transaction_pooling`): no named statements.
    pooled: bool,
}

impl Db {
    /// `pool`, reached through a transaction pooler when `pooled`.
    pub(crate) fn new(pool: PgPool, pooled: bool) -> Self {
        Self { pool, pooled }
    }

    /// A transaction for statements that belong together. Run them with
    /// [`crate::sql::query`] (unnamed through a pooler) and commit it.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool.begin().await
    }
}

/// `query`, never named through a pooler.
struct Unnamed<E> {
    query: E,
    named: bool,
}

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(self) -> SqlStr {
        self.query.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.query.statement()
    }

    fn take_arguments(
        &mut self,
    ) -> Result<Option<PgArguments>, Box<dyn std::error::Error + Send + Sync>> {
        self.query.take_arguments()
    }

    fn persistent(&self) -> bool {
        self.named && self.query.persistent()
    }
}

impl<'d> Executor<'d> for &'_ Db {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures::stream::BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'd: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let db = self.clone();
        // The rows are collected before COMMIT: a stream that stopped half-way must not leave
        // a transaction open on a shared server connection.
        let all = async move {
            let mut tx = db.pool.begin().await?;
            let query = Unnamed {
                query,
                named: !db.pooled,
            };
            let steps: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(steps)
        };
        futures::stream::once(all)
            .map(|steps| match steps {
                Ok(steps) => futures::stream::iter(steps.into_iter().map(Ok)).left_stream(),
                Err(e) => futures::stream::once(async move { Err(e) }).right_stream(),
            })
            .flatten()
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures::future::BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'd: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.pool.begin().await?;
            let query = Unnamed {
                query,
                named: !db.pooled,
            };
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> futures::future::BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'd: 'e,
    {
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.pool.begin().await?;
            let statement = (&mut *tx).prepare_with(sql, parameters).await?;
            tx.commit().await?;
            Ok(statement)
        })
    }

    // Required by sqlx's `offline` feature, which this crate turns on (`macros`, Cargo.toml).
    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> futures::future::BoxFuture<'e, Result<sqlx_core::describe::Describe<Postgres>, sqlx::Error>>
    where
        'd: 'e,
    {
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.pool.begin().await?;
            let described = (&mut *tx).describe(sql).await?;
            tx.commit().await?;
            Ok(described)
        })
    }
}
