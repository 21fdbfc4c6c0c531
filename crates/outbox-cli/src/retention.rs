//! `outbox retention run`: the backend's retention (batched deletes of delivered rows past the
//! window and, for a partitioned PostgreSQL outbox, partition rotation) with a progress bar.
//! The relay's own schedule is `outbox_runtime::retention`.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use outbox_core::admin::RetentionSettings;
use outbox_runtime::Config;
use time::OffsetDateTime;

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
    let backend = crate::backend::open(config, 2).await?;
    let retention = backend.retention()?;
    let table = backend.table();
    let e = crate::backend::source_error;
    let preview = retention.preview(now, keep).await.map_err(e)?;
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
    let settings = RetentionSettings {
        batch,
        ..config.retention.settings()
    };
    let settings = RetentionSettings { keep, ..settings };
    let bar = progress_bar(preview.rows, batch);
    let report = retention
        .run(now, &settings, &mut |n| {
            bar.set_position(n);
            ControlFlow::Continue(())
        })
        .await
        .map_err(e)?;
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
