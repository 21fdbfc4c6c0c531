//! The admin conformance suite: the operator commands (`dead`, `why`, `status`, `doctor`,
//! `replay`, `retention`) checked the same way for every backend, through `Arc<dyn Backend>`
//! exactly as the `outbox` command calls them. A database's test implements [`AdminHarness`]
//! and calls [`run_all`].
//!
//! Events are dead-lettered for real: the backend's own relay pipelines
//! ([`Backend::start_relay`]) run under the real [`outbox_core::Relay`] with a
//! [`ScriptedSink`] that rejects one event.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use outbox_core::admin::{
    DoctorThresholds, Explanation, Health, ReplaySelection, RetentionSettings, RetrySelection,
    Verdict,
};
use outbox_core::backend::Backend;
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, SinkErrorKind};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::conformance::{RunningRelay, test_relay_config};
use crate::faults::{Match, ScriptedSink, Times};

/// One fresh, migrated outbox of one backend, as the suite needs it.
pub trait AdminHarness: Send + Sync {
    /// The backend over the outbox (opened through its `BackendConfig`).
    fn backend(&self) -> Arc<dyn Backend>;
    /// Writes `events` in one committed transaction with the producer library.
    fn write(
        &self,
        events: Vec<NewEvent>,
    ) -> impl Future<Output = anyhow::Result<Vec<Uuid>>> + Send;
    /// A backend of the same kind over an outbox that was never migrated (another table or
    /// database), for `doctor` to turn red.
    fn unmigrated(&self) -> impl Future<Output = anyhow::Result<Arc<dyn Backend>>> + Send;
    /// Whether delivery is recorded in the rows (polling); `false` where it is the stream's
    /// position (CDC: rows stay `pending`, `why` says "streamed").
    fn records_delivery_in_rows(&self) -> bool {
        true
    }
    /// Whether delivered rows are kept and retention deletes them by delivery time (polling
    /// with `on_delivered = "mark"`). CDC retention waits on the slot and is covered by the
    /// CDC retention tests; a `delete` outbox has nothing to keep.
    fn retention_by_delivery_time(&self) -> bool {
        true
    }
    /// Whether delivered rows are kept (`on_delivered = "mark"`), so that `why` can say
    /// "delivered" afterwards.
    fn keeps_delivered_rows(&self) -> bool {
        true
    }
}

const WAIT: Duration = Duration::from_secs(30);

fn event(aggregate: &str, n: usize) -> NewEvent {
    NewEvent::new(
        "Order",
        aggregate,
        "order.changed",
        format!("{{\"aggregate\":\"{aggregate}\",\"n\":{n}}}"),
    )
}

/// Runs the backend's own pipelines under the relay until `published` events reached `sink`.
async fn relay_until(
    backend: &dyn Backend,
    sink: Arc<ScriptedSink>,
    published: usize,
) -> anyhow::Result<()> {
    let mut config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 1);
    config.workers = NonZeroUsize::MIN;
    let pipelines = backend.start_relay(&config).await?;
    let relay = RunningRelay::start(config, sink.clone(), pipelines.sources);
    let reached = sink.wait_for_published(published, WAIT).await;
    relay.stop().await?;
    if let Some(closed) = pipelines.closed {
        let _ = tokio::time::timeout(Duration::from_secs(5), closed).await;
    }
    reached.map(drop)
}

/// A rejected event is a dead letter that `dead list` and `dead show` report with its
/// reason and exact payload, `why` explains it and the event it holds back, `status` counts
/// it, and `dead retry` puts it back in line ahead of the later event of its aggregate.
pub async fn dead_letters_are_listed_explained_and_retried_in_order<H: AdminHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let backend = h.backend();
    let poison = h.write(vec![event("adm-p", 1)]).await?[0];
    let behind = h.write(vec![event("adm-p", 2)]).await?[0];
    let other = h.write(vec![event("adm-ok", 1)]).await?[0];
    let sink = Arc::new(ScriptedSink::new());
    sink.fail(
        Match::EventId(poison),
        SinkErrorKind::Rejected,
        Times::Forever,
    );
    relay_until(&*backend, sink.clone(), 1).await?;
    let first: Vec<Uuid> = sink.published().iter().map(|e| e.id).collect();
    ensure!(
        first == vec![other],
        "only the other aggregate's event flows, got {first:?}"
    );

    let dead = backend.dead_letters()?;
    // The poison event, and (a CDC source parks them as dead letters too) possibly the
    // event behind it, held.
    let listed = dead.list(None, None, 100).await?;
    ensure!(
        listed.first().is_some_and(|d| d.id == poison)
            && listed[1..]
                .iter()
                .all(|d| d.id == behind
                    && d.reason.as_deref().is_some_and(|r| r.starts_with("held:"))),
        "dead list: {listed:?}"
    );
    ensure!(
        listed[0].reason.as_deref().is_some_and(|r| !r.is_empty()),
        "a dead letter carries its reason: {listed:?}"
    );
    ensure!(
        dead.list(Some("no.such.type"), None, 100).await?.is_empty(),
        "the event type filter"
    );
    ensure!(
        dead.list(None, Some("adm-ok"), 100).await?.is_empty(),
        "the aggregate filter"
    );
    let shown = dead.show(poison).await?.context("dead show finds it")?;
    ensure!(shown.state == "dead", "state {}", shown.state);
    ensure!(
        shown.payload == event("adm-p", 1).payload.to_vec(),
        "payload bytes exact"
    );

    let now = OffsetDateTime::now_utc();
    let explain = backend.explain()?;
    match explain.explain(poison, now).await? {
        Explanation::Found(story) => ensure!(
            story.verdict == Verdict::Dead,
            "why dead letter: {:?}",
            story.verdict
        ),
        other => bail!("why {poison}: {other:?}"),
    }
    if h.records_delivery_in_rows() {
        match explain.explain(behind, now).await? {
            Explanation::Found(story) => match &story.verdict {
                Verdict::BlockedByEarlier { blocker } => ensure!(
                    blocker.id == poison,
                    "blocked by {}, expected {poison}",
                    blocker.id
                ),
                v => bail!("why the event behind the dead letter: {v:?}"),
            },
            other => bail!("why {behind}: {other:?}"),
        }
        let status = backend.status(now, Duration::from_secs(60)).await?;
        ensure!(
            status.backlog.dead == 1,
            "status counts the dead letter: {:?}",
            status.backlog
        );
        ensure!(
            status
                .held_aggregates
                .iter()
                .any(|a| a.aggregate_id == "adm-p" && a.head_id == poison),
            "status names the held aggregate: {:?}",
            status.held_aggregates
        );
        let json = serde_json::to_value(&status)?;
        for key in ["pending", "dead", "held_aggregates"] {
            ensure!(json.get(key).is_some(), "status JSON has `{key}`: {json}");
        }
    }
    let unknown = Uuid::now_v7();
    match explain.explain(unknown, now).await? {
        Explanation::NotFound { message, .. } => ensure!(
            message.contains(&unknown.to_string()),
            "not found names the id: {message}"
        ),
        other => bail!("why of an unknown id: {other:?}"),
    }

    // The retry while a relay runs, as in production.
    let healthy = Arc::new(ScriptedSink::new());
    let mut config = test_relay_config(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate, 1);
    config.workers = NonZeroUsize::MIN;
    let pipelines = backend.start_relay(&config).await?;
    let relay = RunningRelay::start(config, healthy.clone(), pipelines.sources);
    let retried = dead.retry(&RetrySelection::Ids(vec![poison])).await;
    let reached = healthy.wait_for_ids(&[poison, behind], WAIT).await;
    relay.stop().await?;
    if let Some(closed) = pipelines.closed {
        let _ = tokio::time::timeout(Duration::from_secs(5), closed).await;
    }
    let retried = retried?;
    ensure!(
        retried == vec![poison] || retried == vec![poison, behind],
        "dead retry returned {retried:?}"
    );
    reached?;
    ensure!(
        dead.list(None, None, 100).await?.is_empty(),
        "no dead letter after the retry"
    );
    let order: Vec<Uuid> = healthy
        .published()
        .iter()
        .filter(|e| e.aggregate_id == "adm-p")
        .map(|e| e.id)
        .collect();
    ensure!(
        order.starts_with(&[poison, behind]),
        "the retried event goes before the one behind it: {order:?}"
    );
    if h.records_delivery_in_rows() && h.keeps_delivered_rows() {
        match explain.explain(poison, OffsetDateTime::now_utc()).await? {
            Explanation::Found(story) => ensure!(
                story.verdict == Verdict::Delivered,
                "why after delivery: {:?}",
                story.verdict
            ),
            other => bail!("why {poison}: {other:?}"),
        }
    }
    Ok(())
}

/// `purge` deletes the dead letters dead-lettered before the cutoff and returns their ids.
pub async fn purge_deletes_only_dead_letters_older_than_the_cutoff<H: AdminHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let backend = h.backend();
    // One transaction, one batch: when the other event is published, the poison event's
    // outcome is settled with it before the relay stops.
    let ids = h
        .write(vec![event("adm-purge", 1), event("adm-purge-ok", 1)])
        .await?;
    let poison = ids[0];
    let sink = Arc::new(ScriptedSink::new());
    sink.fail(
        Match::EventId(poison),
        SinkErrorKind::Rejected,
        Times::Forever,
    );
    relay_until(&*backend, sink.clone(), 1).await?;
    let dead = backend.dead_letters()?;
    ensure!(
        dead.list(None, None, 10)
            .await?
            .iter()
            .any(|d| d.id == poison),
        "the poison event is a dead letter"
    );
    let long_ago = OffsetDateTime::now_utc() - time::Duration::days(1);
    ensure!(
        dead.purge(long_ago, None).await?.is_empty(),
        "nothing is older than a day"
    );
    let later = OffsetDateTime::now_utc() + time::Duration::minutes(1);
    let purged = dead.purge(later, None).await?;
    ensure!(purged == vec![poison], "purged {purged:?}");
    ensure!(dead.show(poison).await?.is_none(), "the row is gone");
    Ok(())
}

/// Doctor: a healthy, migrated outbox has no red check; one never migrated has a red check
/// with a fix.
pub async fn doctor_is_green_when_healthy_and_red_without_a_schema<H: AdminHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let thresholds = DoctorThresholds {
        stuck_after: Duration::from_secs(3600),
        stale_transaction: Duration::from_secs(3600),
    };
    let checks = h.backend().doctor(thresholds).await;
    let red: Vec<_> = checks.iter().filter(|c| c.health == Health::Red).collect();
    ensure!(red.is_empty(), "red checks on a healthy outbox: {red:?}");
    let checks = h.unmigrated().await?.doctor(thresholds).await;
    ensure!(
        checks
            .iter()
            .any(|c| c.health == Health::Red && c.fix.is_some()),
        "no red check with a fix on an outbox without a schema: {checks:?}"
    );
    Ok(())
}

/// Replay: the plan counts exactly the delivered events of the window and filter, and
/// replaying them publishes them again with the same ids; a backend without replay says so.
pub async fn replay_republishes_exactly_the_window_or_says_it_cannot<H: AdminHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let backend = h.backend();
    let replay = match backend.replay() {
        Ok(replay) => replay,
        Err(unsupported) => {
            let text = unsupported.to_string();
            ensure!(
                text.contains("outbox replay") && text.contains(backend.kind()),
                "the refusal names the command and the kind: {text}"
            );
            return Ok(());
        }
    };
    if !h.keeps_delivered_rows() {
        // Delivered rows are deleted: replay must refuse with the reason, not find nothing.
        let all = ReplaySelection {
            since: OffsetDateTime::UNIX_EPOCH,
            until: None,
            aggregate_id: None,
            event_type: None,
        };
        let refused = replay
            .plan(&all, 10)
            .await
            .err()
            .context("replay on an outbox that deletes delivered rows must refuse")?;
        ensure!(
            refused.to_string().contains("on_delivered"),
            "the refusal says why: {refused}"
        );
        return Ok(());
    }
    let since = OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let ids = h
        .write(vec![
            event("adm-r1", 1),
            event("adm-r1", 2),
            event("adm-r2", 1),
        ])
        .await?;
    let sink = Arc::new(ScriptedSink::new());
    relay_until(&*backend, sink, 3).await?;
    let all = ReplaySelection {
        since,
        until: None,
        aggregate_id: None,
        event_type: None,
    };
    let plan = replay.plan(&all, 10).await?;
    ensure!(plan.total == 3, "replay plan counted {}", plan.total);
    let one = ReplaySelection {
        aggregate_id: Some("adm-r1".into()),
        ..all.clone()
    };
    ensure!(
        replay.plan(&one, 10).await?.total == 2,
        "the aggregate filter"
    );
    let selected = replay.ids(&one).await?;
    ensure!(selected == ids[..2], "replay ids {selected:?}");
    ensure!(
        replay.replay_batch(&selected).await? == 2,
        "both put back in line"
    );
    let again = Arc::new(ScriptedSink::new());
    relay_until(&*backend, again.clone(), 2).await?;
    let got: Vec<Uuid> = again.published().iter().map(|e| e.id).collect();
    ensure!(got.starts_with(&ids[..2]), "republished {got:?}");
    Ok(())
}

/// Retention deletes delivered events older than the window and nothing else.
pub async fn retention_deletes_only_delivered_events_past_the_window<H: AdminHarness>(
    h: &H,
) -> anyhow::Result<()> {
    if !h.retention_by_delivery_time() {
        return Ok(());
    }
    let backend = h.backend();
    let delivered = h.write(vec![event("adm-ret", 1)]).await?[0];
    relay_until(&*backend, Arc::new(ScriptedSink::new()), 1).await?;
    let pending = h.write(vec![event("adm-ret", 2)]).await?[0];
    let retention = backend.retention()?;
    // An hour from now, with a one-minute window: the delivered event is past it.
    let later = OffsetDateTime::now_utc() + time::Duration::hours(1);
    let keep = Duration::from_secs(60);
    let preview = retention.preview(later, keep).await?;
    // Deleted rows, or (partitioned tables) the rows of a partition dropped whole.
    let expected = preview.rows
        + preview
            .partitions_dropped
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>();
    ensure!(expected == 1, "preview counted {preview:?}");
    let settings = RetentionSettings {
        keep,
        batch: 10,
        pause: Duration::ZERO,
        ..RetentionSettings::default()
    };
    let report = retention
        .run(later, &settings, &mut |_| {
            std::ops::ControlFlow::Continue(())
        })
        .await?;
    ensure!(
        report.removed() == expected,
        "removed {} of {expected}",
        report.removed()
    );
    let dead = backend.dead_letters()?;
    ensure!(
        dead.show(delivered).await?.is_none(),
        "the delivered event is gone"
    );
    ensure!(
        dead.show(pending).await?.is_some(),
        "the pending event is kept"
    );
    Ok(())
}

/// Runs every check against fresh outboxes from `new_harness`.
pub async fn run_all<H, F, Fut>(new_harness: F) -> anyhow::Result<()>
where
    H: AdminHarness,
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<H>>,
{
    crate::run_checks!(
        "admin conformance",
        new_harness,
        [
            dead_letters_are_listed_explained_and_retried_in_order,
            purge_deletes_only_dead_letters_older_than_the_cutoff,
            doctor_is_green_when_healthy_and_red_without_a_schema,
            replay_republishes_exactly_the_window_or_says_it_cannot,
            retention_deletes_only_delivered_events_past_the_window,
        ]
    )
}
