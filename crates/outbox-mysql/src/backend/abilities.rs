//! The operator abilities of a MySQL outbox beyond the core ones: `outbox why` (the story of
//! one event), dead letters, replay and retention (forwarded to [`MySqlAdmin`]), and the
//! producer for `outbox bench` and the fan-out's copies.

use outbox_core::admin::{DeliveryModel, EventStory, Explanation, Verdict};
use outbox_core::backend::Backend;
use outbox_core::sink::BoxFuture;
use outbox_core::{NewEvent, SourceError};
use sqlx::MySqlPool;
use time::OffsetDateTime;
use uuid::Uuid;

use super::MySqlBackend;
use crate::admin::MySqlAdmin;
use crate::producer::MySqlOutbox;

impl MySqlBackend {
    /// `outbox why`: where event `id` stands at `now`, and why.
    async fn story(&self, id: Uuid, now: OffsetDateTime) -> Result<Explanation, SourceError> {
        let Some(event) = self.admin.show(id, now).await? else {
            return Ok(Explanation::NotFound {
                message: format!(
                    "no event with id {id} in outbox table {} of {}",
                    self.config.table,
                    self.database()
                ),
                notes: Vec::new(),
            });
        };
        let verdict = match (event.state.as_str(), event.backoff_until) {
            ("delivered", _) => Verdict::Delivered,
            ("dead", _) => Verdict::Dead,
            (_, Some(until)) => Verdict::Backoff { until },
            _ => match self.admin.blocker(&event, now).await? {
                Some(blocker) => Verdict::BlockedByEarlier { blocker },
                None => Verdict::Ready { ahead: 0 },
            },
        };
        Ok(Explanation::Found(Box::new(EventStory {
            event,
            verdict,
            model: DeliveryModel::Claims,
        })))
    }
}

outbox_core::forward_explain!(MySqlBackend, story);

outbox_core::forward_dead_letter_store!(MySqlAdmin);

outbox_core::forward_replay!(
    MySqlAdmin,
    plan = replay_plan,
    ids = replay_ids,
    replay_batch = replay_ids_batch
);

outbox_core::forward_retention!(MySqlAdmin, preview = retention_preview, run = retention_run);

/// The producer library on the backend's own pool (`outbox bench`).
#[derive(Debug)]
pub(super) struct MySqlProducer {
    pub(super) pool: MySqlPool,
    pub(super) outbox: MySqlOutbox,
}

impl MySqlProducer {
    async fn write(&self, events: &[NewEvent]) -> Result<(), SourceError> {
        let mut tx = self.pool.begin().await.map_err(|e| unavailable(&e))?;
        self.outbox
            .enqueue_batch(&mut tx, events)
            .await
            .map_err(|e| unavailable(&e))?;
        tx.commit().await.map_err(|e| unavailable(&e))
    }
}

impl outbox_core::backend::Forward for MySqlProducer {
    fn copy_in<'a>(
        &'a self,
        events: &'a [outbox_core::Event],
    ) -> BoxFuture<'a, Result<u64, SourceError>> {
        Box::pin(async move {
            let mut conn = self.pool.acquire().await.map_err(|e| unavailable(&e))?;
            self.outbox
                .copy_in(&mut conn, events)
                .await
                .map_err(|e| unavailable(&e))
        })
    }
}

outbox_core::forward_producer!(MySqlProducer, fill = write, commit = write);

/// A producer error as a retryable source error with its causes.
fn unavailable(e: &(dyn std::error::Error + 'static)) -> SourceError {
    SourceError::unavailable(outbox_core::relay::ErrorChain(e).to_string())
}
