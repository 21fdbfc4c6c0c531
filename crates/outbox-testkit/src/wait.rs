//! Waiting for a condition in tests.
//!
//! Prefer a notification when the thing under test offers one (the testkit's
//! `wait_for*` methods, a `watch` channel, a database `LISTEN`): they return the moment the
//! condition holds. [`eventually`] is the generic fallback for conditions nothing announces,
//! such as a row count in a database: it polls with short sleeps, within a bound.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often [`eventually`] checks its condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Checks `condition` every [`POLL_INTERVAL`] until it returns true; fails after `timeout`
/// (the last check happens at the deadline, so a condition that holds by then passes).
///
/// ```
/// # async fn example(pool: sqlx::PgPool) -> anyhow::Result<()> {
/// use std::time::Duration;
/// use outbox_testkit::wait::eventually;
///
/// eventually(Duration::from_secs(5), || async {
///     let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE delivered_at IS NULL")
///         .fetch_one(&pool).await.unwrap_or(-1);
///     pending == 0
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn eventually<F, Fut>(timeout: Duration, mut condition: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            anyhow::bail!("condition still false after {timeout:?}");
        }
        tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
    }
}

/// Fetches from `source` and settles every event as delivered, `batch` at a time, until the
/// event `until` arrived or, with `stop_after`, at least that many were settled; returns the
/// ids in the order fetched. Fails once `timeout` passed without a new event (an event seen
/// before, handed over again after a lost session, is no progress). For sources driven
/// directly, without a relay (an empty fetch waits with
/// [`outbox_core::Source::wait_for_events`]).
pub async fn settle_until<S: outbox_core::Source>(
    source: &mut S,
    until: uuid::Uuid,
    stop_after: Option<usize>,
    batch: usize,
    timeout: Duration,
) -> anyhow::Result<Vec<uuid::Uuid>> {
    let mut got = Vec::new();
    let mut seen = std::collections::HashSet::new();
    settle_while(source, batch, timeout, |events| {
        got.extend(events.iter().map(|e| e.id));
        let before = seen.len();
        seen.extend(events.iter().map(|e| e.id));
        Step {
            more: !got.contains(&until) && stop_after.is_none_or(|n| got.len() < n),
            progressed: seen.len() > before,
        }
    })
    .await?;
    Ok(got)
}

/// As [`settle_until`], until `count` events were settled, remembering nothing else (for
/// memory benchmarks: any batch counts as progress).
pub async fn settle_count<S: outbox_core::Source>(
    source: &mut S,
    count: usize,
    batch: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let mut settled = 0;
    settle_while(source, batch, timeout, |events| {
        settled += events.len();
        Step {
            more: settled < count,
            progressed: true,
        }
    })
    .await
}

/// The settlements that record every one of `events` as delivered: what a relay records
/// after publishing them, for tests that drive a source by hand
/// (`source.settle(&all_delivered(&fetched.events), now)`).
pub fn all_delivered(events: &[outbox_core::Event]) -> Vec<outbox_core::source::Settlement> {
    events
        .iter()
        .map(|e| outbox_core::source::Settlement {
            position: e.position,
            outcome: outbox_core::source::Outcome::Delivered,
        })
        .collect()
}

/// What [`settle_while`]'s caller makes of one settled batch.
struct Step {
    /// Go on fetching.
    more: bool,
    /// The batch held something not seen before: the wait starts over.
    progressed: bool,
}

/// Fetches and settles as delivered while `step` (given each batch) says so; gives up once
/// `timeout` passed without progress (the wait follows progress, so a busy machine slows it
/// down without failing it, and a source that hands over the same events again and again
/// still fails).
async fn settle_while<S: outbox_core::Source>(
    source: &mut S,
    batch: usize,
    timeout: Duration,
    mut step: impl FnMut(&[outbox_core::Event]) -> Step,
) -> anyhow::Result<()> {
    let mut deadline = Instant::now() + timeout;
    loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the source handed over nothing new for {timeout:?} before what was expected"
        );
        let fetched = match source.fetch(batch, time::OffsetDateTime::now_utc()).await {
            Ok(fetched) => fetched,
            // As the relay does: a database that went away (a reset connection) is retried;
            // nothing was recorded, so the batch comes again.
            Err(e) if e.kind() == outbox_core::source::SourceErrorKind::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if fetched.events.is_empty() {
            source.wait_for_events(Duration::from_millis(200)).await;
            continue;
        }
        source
            .settle(
                &all_delivered(&fetched.events),
                time::OffsetDateTime::now_utc(),
            )
            .await?;
        let Step { more, progressed } = step(&fetched.events);
        if progressed {
            deadline = Instant::now() + timeout;
        }
        if !more {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn passes_once_the_condition_holds_and_fails_after_the_timeout() {
        let calls = AtomicU32::new(0);
        eventually(Duration::from_secs(1), || async {
            calls.fetch_add(1, Ordering::SeqCst) >= 3
        })
        .await
        .expect("holds on the fourth check");
        assert_eq!(calls.load(Ordering::SeqCst), 4);

        let err = eventually(Duration::from_millis(100), || async { false })
            .await
            .expect_err("never holds");
        assert!(err.to_string().contains("100ms"), "{err}");
    }
}
