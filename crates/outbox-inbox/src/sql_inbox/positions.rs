//! Delivery positions (`aggregate_seq`) a consumer applied, and the order gate that reads
//! and passes them ([`order_gate`](super::SqlInbox::order_gate)).

use futures::future::BoxFuture;
use sqlx::{Database, Pool};

use super::{Session, SqlInbox};
use crate::error::InboxError;
use crate::lane::{ConsumerOrder, OrderGate};
use crate::sql::stmt;

with_sql_bounds! {
    impl<D> SqlInbox<D> {
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

    }
}

/// The order gate over one inbox, for one consumer.
struct InboxGate<D: Database> {
    inbox: SqlInbox<D>,
    pool: Pool<D>,
    consumer: String,
}

with_sql_bounds! {
    impl<D> OrderGate for InboxGate<D> {
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
}
