//! Purging old dedup records, in batches of [`PURGE_BATCH`].

use std::time::Duration;

use sqlx::Pool;
use time::OffsetDateTime;

use super::{Session, SqlInbox};
use crate::PURGE_BATCH;
use crate::error::InboxError;
use crate::sql::stmt;

with_sql_bounds! {
    impl<D> SqlInbox<D> {
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
}
