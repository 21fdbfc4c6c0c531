//! Retention: `outbox retention run` and the relay's schedule (`[retention]`).
//!
//! The work is in the database crates (`outbox_postgres::PgRetention`,
//! `outbox_sqlite::SqliteRetention`): batched deletes of delivered rows past the window and,
//! for a partitioned PostgreSQL outbox, partition rotation. This module reads the config,
//! shows progress, prints the result and runs it on a timer inside the relay.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde::Deserialize;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SourceConfig};

/// Counter: rows removed by retention (deleted rows plus the rows of dropped partitions).
pub(crate) const RETENTION_DELETED: &str = "outbox_retention_deleted_total";
/// Counter: partitions dropped by retention.
pub(crate) const RETENTION_PARTITIONS_DROPPED: &str = "outbox_retention_partitions_dropped_total";
/// Gauge (seconds): how long the last retention run took.
pub(crate) const RETENTION_LAST_RUN_SECONDS: &str = "outbox_retention_last_run_duration_seconds";
/// Gauge (Unix seconds): when the last retention run finished successfully.
pub(crate) const RETENTION_LAST_SUCCESS: &str = "outbox_retention_last_success_timestamp_seconds";

/// `[retention]`: the relay's retention schedule, and the defaults of `outbox retention run`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RetentionConfig {
    /// Run retention inside the relay every `interval` (default true). In partitioned mode
    /// this also creates the partitions ahead, so keep it on (or run `outbox retention run`
    /// from cron).
    pub(crate) enabled: bool,
    /// Delivered events younger than this are kept (default 7d).
    #[serde(with = "humantime_serde")]
    pub(crate) keep: Duration,
    /// Time between two runs (default 10m). The first run starts with the relay.
    #[serde(with = "humantime_serde")]
    pub(crate) interval: Duration,
    /// Rows deleted per statement, each in its own short transaction (default 5000).
    pub(crate) batch: u32,
    /// Pause between two batches (default 20ms), so the relay and vacuum get their turn.
    #[serde(with = "humantime_serde")]
    pub(crate) pause: Duration,
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
    /// Checks what serde cannot; errors name the key.
    pub(crate) fn validate(&self) -> Result<(), String> {
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

/// `outbox retention ...`
#[derive(Debug, Subcommand)]
pub(crate) enum RetentionCommand {
    /// Delete delivered events older than the window now (and rotate partitions), in batches.
    Run(RunArgs),
}

/// `outbox retention run`
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Keep delivered events younger than this (e.g. 7d, 12h, 30m). Default: retention.keep.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    older_than: Option<Duration>,
    /// Rows per delete statement. Default: retention.batch.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: Option<u32>,
    /// Count what would be removed, remove nothing.
    #[arg(long)]
    dry_run: bool,
}

/// Runs `outbox retention ...`.
pub(crate) async fn run(config: &Config, command: RetentionCommand) -> anyhow::Result<()> {
    let RetentionCommand::Run(args) = command;
    let keep = args.older_than.unwrap_or(config.retention.keep);
    let batch = args.batch.unwrap_or(config.retention.batch);
    let now = OffsetDateTime::now_utc();
    let started = Instant::now();
    let keep_text = humantime::format_duration(keep);
    match &config.source {
        SourceConfig::Postgres(pg) => {
            let pool = outbox_postgres::connect(pg, 2)
                .await
                .with_context(|| format!("cannot connect to {}", pg.url))?;
            let retention = outbox_postgres::PgRetention::new(pool, pg);
            let table = pg.qualified_table();
            let preview = retention
                .preview(now, keep)
                .await
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
            if args.dry_run {
                println!(
                    "dry run: would delete {} delivered event(s) older than {keep_text} from {table}{}",
                    preview.rows,
                    oldest(preview.oldest)
                );
                for (name, rows) in &preview.partitions_dropped {
                    println!("dry run: would drop partition {name} ({rows} delivered event(s))");
                }
                for k in &preview.partitions_kept {
                    println!("dry run: would keep partition {}: {}", k.name, k.reason);
                }
                for note in &preview.notes {
                    println!("note: {note}");
                }
                return Ok(());
            }
            let settings = outbox_postgres::RetentionSettings {
                keep,
                batch,
                pause: config.retention.pause,
                ..outbox_postgres::RetentionSettings::default()
            };
            let bar = progress_bar(preview.rows, batch);
            let report = retention
                .run(now, &settings, &mut |n| {
                    bar.set_position(n);
                    ControlFlow::Continue(())
                })
                .await
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
            bar.finish_and_clear();
            for name in &report.partitions_created {
                println!("created partition {name}");
            }
            for (name, rows) in &report.partitions_dropped {
                println!("dropped partition {name} ({rows} delivered event(s))");
            }
            for k in &report.partitions_kept {
                println!("kept partition {}: {}", k.name, k.reason);
            }
            for note in &report.notes {
                println!("note: {note}");
            }
            println!(
                "deleted {} delivered event(s) older than {keep_text} from {table} in {} batch(es), {:.1}s",
                report.deleted,
                report.batches,
                started.elapsed().as_secs_f64()
            );
        }
        SourceConfig::Sqlite(sq) => {
            if !sq.path.is_file() {
                bail!(
                    "SQLite database `{}` does not exist; nothing to clean up",
                    sq.path.display()
                );
            }
            let pool = outbox_sqlite::connect(sq)
                .await
                .with_context(|| format!("cannot open SQLite database `{}`", sq.path.display()))?;
            let retention = outbox_sqlite::SqliteRetention::new(pool, &sq.table);
            let (rows, first) = retention
                .preview(now, keep)
                .await
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
            if args.dry_run {
                println!(
                    "dry run: would delete {rows} delivered event(s) older than {keep_text} from {} in `{}`{}",
                    sq.table,
                    sq.path.display(),
                    oldest(first)
                );
                return Ok(());
            }
            let bar = progress_bar(rows, batch);
            let report = retention
                .run(now, keep, batch, config.retention.pause, &mut |n| {
                    bar.set_position(n);
                    ControlFlow::Continue(())
                })
                .await
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
            bar.finish_and_clear();
            println!(
                "deleted {} delivered event(s) older than {keep_text} from {} in `{}` in {} batch(es), {:.1}s",
                report.deleted,
                sq.table,
                sq.path.display(),
                report.batches,
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

fn oldest(t: Option<OffsetDateTime>) -> String {
    t.map(|t| format!(" (oldest from {t})")).unwrap_or_default()
}

/// A progress bar on a terminal for runs of more than a few batches; hidden otherwise
/// (indicatif draws nothing when stderr is not a terminal).
fn progress_bar(total: u64, batch: u32) -> indicatif::ProgressBar {
    if total <= u64::from(batch) * 3 {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} deleting delivered events [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// The database a scheduled retention task works on.
pub(crate) enum Target {
    /// A PostgreSQL outbox.
    Postgres(sqlx::PgPool, outbox_postgres::PostgresConfig),
    /// A SQLite outbox.
    Sqlite(sqlx::SqlitePool, outbox_core::Identifier),
}

/// Starts the relay's retention schedule (when `[retention] enabled`): one run at start, then
/// one every `interval`, until `shutdown`. A failed run is logged and retried at the next
/// interval; it never stops the relay.
pub(crate) fn spawn(config: &Config, target: Target, shutdown: CancellationToken) {
    let settings = config.retention.clone();
    if !settings.enabled {
        tracing::info!("retention schedule disabled ([retention] enabled = false)");
        return;
    }
    tracing::info!(keep = %humantime::format_duration(settings.keep), interval = %humantime::format_duration(settings.interval), batch = settings.batch, "retention schedule started");
    tokio::spawn(async move {
        loop {
            let started = Instant::now();
            let result = tokio::select! {
                r = run_once(&settings, &target, &shutdown) => r,
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
    target: &Target,
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
    match target {
        Target::Postgres(pool, pg) => {
            let report = outbox_postgres::PgRetention::new(pool.clone(), pg)
                .run(
                    now,
                    &outbox_postgres::RetentionSettings {
                        keep: settings.keep,
                        batch: settings.batch,
                        pause: settings.pause,
                        ..outbox_postgres::RetentionSettings::default()
                    },
                    &mut stop,
                )
                .await
                .map_err(|e| crate::chain(&e))?;
            for k in &report.partitions_kept {
                tracing::warn!(partition = %k.name, reason = %k.reason, "retention kept an old partition");
            }
            for note in &report.notes {
                tracing::warn!("retention: {note}");
            }
            Ok((report.removed(), report.partitions_dropped.len() as u64))
        }
        Target::Sqlite(pool, table) => {
            let report = outbox_sqlite::SqliteRetention::new(pool.clone(), table)
                .run(
                    now,
                    settings.keep,
                    settings.batch,
                    settings.pause,
                    &mut stop,
                )
                .await
                .map_err(|e| crate::chain(&e))?;
            Ok((report.deleted, 0))
        }
    }
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
