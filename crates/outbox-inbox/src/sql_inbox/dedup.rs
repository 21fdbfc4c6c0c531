//! Deduplication: recording `(consumer, event_id)` in the side effect's own transaction
//! (`record`, `begin`, `process`, with the delivery position for `*_message`), and looking a
//! record up (`contains`).

use futures::future::BoxFuture;
use sqlx::{Executor, Pool, Transaction};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Session, SqlInbox, begin};
use crate::error::InboxError;
use crate::sql::{finish, stmt};
use crate::{InboxMessage, Outcome};

with_sql_bounds! {
    impl<D> SqlInbox<D> {
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

    }
}
