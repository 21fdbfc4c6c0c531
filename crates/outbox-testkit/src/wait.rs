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
