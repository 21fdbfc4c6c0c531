//! The relay's retention schedule (`[retention]`): batched deletes of delivered rows past the
//! window (and partition rotation where the backend has partitions), once at start and then
//! every `interval`, through the backend's [`Retention`] ability.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::admin::RetentionSettings;
use outbox_core::backend::{Backend, Retention};
use outbox_core::relay::ErrorChain;
use serde::Deserialize;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

/// Counter: rows removed by retention (deleted rows plus the rows of dropped partitions).
pub const RETENTION_DELETED: &str = "outbox_retention_deleted_total";
/// Counter: partitions dropped by retention.
pub const RETENTION_PARTITIONS_DROPPED: &str = "outbox_retention_partitions_dropped_total";
/// Gauge (seconds): how long the last retention run took.
pub const RETENTION_LAST_RUN_SECONDS: &str = "outbox_retention_last_run_duration_seconds";
/// Gauge (Unix seconds): when the last retention run finished successfully.
pub const RETENTION_LAST_SUCCESS: &str = "outbox_retention_last_success_timestamp_seconds";

/// `[retention]`: the relay's retention schedule, and the defaults of `outbox retention run`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Run retention inside the relay every `interval` (default true). In partitioned mode
    /// this also creates the partitions ahead, so keep it on (or run `outbox retention run`
    /// from cron).
    pub enabled: bool,
    /// Delivered events younger than this are kept (default 7d).
    #[serde(with = "humantime_serde")]
    pub keep: Duration,
    /// Time between two runs (default 10m). The first run starts with the relay.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Rows deleted per statement, each in its own short transaction (default 5000).
    pub batch: u32,
    /// Pause between two batches (default 20ms), so the relay and vacuum get their turn.
    #[serde(with = "humantime_serde")]
    pub pause: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            keep: Duration::from_secs(7 * 86_400),
            interval: Duration::from_secs(600),
            batch: 5_000,
            pause: Duration::from_millis(20),
        }
    }
}

impl RetentionConfig {
    /// The settings of one run.
    pub fn settings(&self) -> RetentionSettings {
        RetentionSettings {
            keep: self.keep,
            batch: self.batch,
            pause: self.pause,
            ..RetentionSettings::default()
        }
    }

    /// Checks what serde cannot; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch == 0 {
            return Err("retention.batch: must be greater than 0".into());
        }
        if self.batch > 1_000_000 {
            return Err("retention.batch: at most 1000000 rows per statement".into());
        }
        if self.interval < Duration::from_secs(1) {
            return Err("retention.interval: must be at least 1s".into());
        }
        if self.pause > Duration::from_secs(60) {
            return Err("retention.pause: at most 60s".into());
        }
        Ok(())
    }
}

/// Starts the relay's retention schedule (when `[retention] enabled`): one run at start, then
/// one every `interval`, until `shutdown`. A failed run is logged and retried at the next
/// interval; it never stops the relay.
pub fn spawn(settings: &RetentionConfig, backend: Arc<dyn Backend>, shutdown: CancellationToken) {
    let settings = settings.clone();
    if let Err(e) = backend.retention() {
        tracing::info!("no retention schedule: {e}");
        return;
    }
    if !settings.enabled {
        tracing::info!("retention schedule disabled ([retention] enabled = false)");
        return;
    }
    tracing::info!(keep = %humantime::format_duration(settings.keep), interval = %humantime::format_duration(settings.interval), batch = settings.batch, "retention schedule started");
    tokio::spawn(async move {
        loop {
            let started = Instant::now();
            let result = tokio::select! {
                r = async {
                    match backend.retention() {
                        Ok(retention) => run_once(&settings, retention, &shutdown).await,
                        Err(e) => Err(e.to_string()),
                    }
                } => r,
                () = shutdown.cancelled() => return,
            };
            let elapsed = started.elapsed();
            metrics::gauge!(RETENTION_LAST_RUN_SECONDS).set(elapsed.as_secs_f64());
            match result {
                Ok((removed, dropped)) => {
                    metrics::counter!(RETENTION_DELETED).increment(removed);
                    metrics::counter!(RETENTION_PARTITIONS_DROPPED).increment(dropped);
                    #[allow(clippy::cast_precision_loss)]
                    let at = OffsetDateTime::now_utc().unix_timestamp() as f64;
                    metrics::gauge!(RETENTION_LAST_SUCCESS).set(at);
                    tracing::info!(
                        removed,
                        partitions_dropped = dropped,
                        seconds = elapsed.as_secs_f64(),
                        "retention run finished"
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "retention run failed; retrying at the next interval")
                }
            }
            tokio::select! {
                () = tokio::time::sleep(settings.interval) => {}
                () = shutdown.cancelled() => return,
            }
        }
    });
}

/// One scheduled run: (rows removed, partitions dropped).
async fn run_once(
    settings: &RetentionConfig,
    retention: &dyn Retention,
    shutdown: &CancellationToken,
) -> Result<(u64, u64), String> {
    let now = OffsetDateTime::now_utc();
    let mut stop = |_| {
        if shutdown.is_cancelled() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let report = retention
        .run(now, &settings.settings(), &mut stop)
        .await
        .map_err(|e| ErrorChain(&e).to_string())?;
    for k in &report.partitions_kept {
        tracing::warn!(partition = %k.name, reason = %k.reason, "retention kept an old partition");
    }
    for note in &report.notes {
        tracing::warn!("retention: {note}");
    }
    Ok((report.removed(), report.partitions_dropped.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_keys_have_defaults_and_unknown_keys_are_refused() {
        let c: RetentionConfig = toml::from_str("").expect("defaults");
        assert!(c.enabled);
        assert_eq!(c.keep, Duration::from_secs(7 * 86_400));
        assert_eq!(c.interval, Duration::from_secs(600));
        assert_eq!(c.batch, 5000);
        let c: RetentionConfig =
            toml::from_str("enabled = false\nkeep = \"36h\"\ninterval = \"1m\"\nbatch = 100")
                .expect("valid");
        assert_eq!(c.keep, Duration::from_secs(36 * 3600));
        assert!(c.validate().is_ok());
        let e = toml::from_str::<RetentionConfig>("kept = \"1d\"").expect_err("unknown key");
        assert!(e.to_string().contains("unknown field `kept`"), "{e}");
        let zero = RetentionConfig {
            batch: 0,
            ..RetentionConfig::default()
        };
        assert_eq!(
            zero.validate().expect_err("zero"),
            "retention.batch: must be greater than 0"
        );
    }
}
