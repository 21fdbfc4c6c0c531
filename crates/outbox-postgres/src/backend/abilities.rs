//! The operator abilities of a PostgreSQL outbox beyond the core ones: `outbox why` (with
//! the open transactions an unseen event may wait for), dead letters, replay and retention
//! (forwarded to [`PgDeadLetters`], [`PgReplay`] and [`PgRetention`]), and the producer for
//! `outbox bench` and the fan-out's copies.

use std::ops::ControlFlow;
use std::time::Duration;

use outbox_core::admin::{
    Explanation, ReplayPlan, ReplaySelection, RetentionPreview, RetentionReport, RetentionSettings,
};
use outbox_core::backend::{Backend, Retention, RetentionProgress};
use outbox_core::sink::BoxFuture;
use outbox_core::{SourceError, SourceErrorKind};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{PgBackend, unavailable};
use crate::dead::PgDeadLetters;
use crate::producer::PgOutbox;
use crate::replay::{PgReplay, ReplayError};
use crate::retention::{PgRetention, RetentionError};

impl PgBackend {
    /// `outbox why`: where event `id` stands at `now`; for an id not (yet) visible, the
    /// transactions that wrote to the table and have not committed.
    async fn explain_event(
        &self,
        id: Uuid,
        now: OffsetDateTime,
    ) -> Result<Explanation, SourceError> {
        let i = &self.inspector;
        if let Some(story) = i.why(id, now).await? {
            return Ok(Explanation::Found(Box::new(story)));
        }
        let table = self.table();
        let writers = i.uncommitted_writers(10).await?;
        if writers.is_empty() {
            return Ok(Explanation::NotFound {
                message: format!(
                    "no event with id {id} in outbox table {table} (never written, rolled back, or deleted: on_delivered = \"delete\" or retention)"
                ),
                notes: Vec::new(),
            });
        }
        let mut notes = vec![format!(
            "Transactions that wrote to {table} and have not committed yet (an event becomes visible, and publishable, when its transaction commits):"
        )];
        // A producer blocked on its aggregate's ordering lock is a writer too (the insert
        // started); say who it waits for.
        let waits = i.lock_waits(50).await?;
        let text = id.to_string();
        for w in &writers {
            let mut extra = String::new();
            if let Some(lock) = waits.iter().find(|l| l.waiting_pid == w.pid) {
                extra.push_str(&format!(
                    "  <- waits for the aggregate's ordering lock held by pid {}",
                    lock.holder_pid
                ));
            }
            if w.query.as_deref().is_some_and(|q| q.contains(&text)) {
                extra.push_str("  <- its last query names this id");
            }
            notes.push(format!("  {}{extra}", w.describe()));
        }
        Ok(Explanation::NotFound {
            message: format!(
                "no committed event with id {id} in outbox table {table}; if one of the {} open writer(s) above wrote it, it waits for that commit",
                writers.len()
            ),
            notes,
        })
    }
}

outbox_core::forward_explain!(PgBackend, explain_event);

outbox_core::forward_dead_letter_store!(PgDeadLetters, show = show_at);

impl From<ReplayError> for SourceError {
    fn from(e: ReplayError) -> Self {
        match e {
            ReplayError::Source(e) => e,
            other => SourceError::fatal(other.to_string()),
        }
    }
}

impl PgReplay {
    /// [`PgReplay::plan`] with the count of [`Replay::plan`](outbox_core::backend::Replay::plan).
    async fn plan_preview(
        &self,
        selection: &ReplaySelection,
        preview: usize,
    ) -> Result<ReplayPlan, ReplayError> {
        let preview = i64::try_from(preview).unwrap_or(i64::MAX);
        self.plan(selection, preview).await
    }
}

outbox_core::forward_replay!(
    PgReplay,
    plan = plan_preview,
    ids = ids,
    replay_batch = replay_batch
);

fn retention_error(e: RetentionError) -> SourceError {
    let kind = match &e {
        RetentionError::Database { source, .. } => crate::error::classify(source),
        RetentionError::Layout(_) => SourceErrorKind::Fatal,
    };
    SourceError::new(kind, outbox_core::relay::ErrorChain(&e).to_string())
}

impl Retention for PgRetention {
    fn preview(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> BoxFuture<'_, Result<RetentionPreview, SourceError>> {
        Box::pin(async move {
            PgRetention::preview(self, now, keep)
                .await
                .map_err(retention_error)
        })
    }
    fn run<'a>(
        &'a self,
        now: OffsetDateTime,
        settings: &'a RetentionSettings,
        progress: &'a mut RetentionProgress<'_>,
    ) -> BoxFuture<'a, Result<RetentionReport, SourceError>> {
        Box::pin(async move {
            let mut step = |n: u64| -> ControlFlow<()> { progress(n) };
            PgRetention::run(self, now, settings, &mut step)
                .await
                .map_err(retention_error)
        })
    }
}

/// The producer library on the backend's own pool (`outbox bench`).
#[derive(Debug)]
pub(super) struct PgProducer {
    pub(super) pool: crate::db::Db,
    pub(super) outbox: PgOutbox,
}

outbox_core::pool_producer!(PgProducer, unavailable);
