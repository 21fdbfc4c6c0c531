//! `outbox replay`: publish delivered events again (same ids, so consumers dedupe).
//!
//! The selection is counted first; `--dry-run` stops there and shows the first few. Then
//! the events are put back in line in batches (a progress bar for large selections) and the
//! running relay publishes them. How depends on the backend (`outbox_core::backend::Replay`).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::bail;
use clap::Args;
use outbox_core::admin::ReplaySelection;
use outbox_runtime::Config;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::dead::when;

/// Events per batch: one short transaction each, and one progress-bar step.
const BATCH: usize = 5_000;
/// Show a progress bar from this many events on.
const PROGRESS_FROM: u64 = 10_000;

/// `outbox replay` arguments.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// Events written at or after this time: RFC 3339 (`2026-11-22T08:00:00Z`) or an age
    /// (`2h` = two hours ago).
    #[arg(long, value_parser = parse_time)]
    since: OffsetDateTime,
    /// Events written before this time (same formats). Default: now.
    #[arg(long, value_parser = parse_time)]
    until: Option<OffsetDateTime>,
    /// Only this aggregate id.
    #[arg(long)]
    aggregate: Option<String>,
    /// Only this event type.
    #[arg(long = "type")]
    event_type: Option<String>,
    /// Count and show the first events; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(long)]
    yes: bool,
}

/// An RFC 3339 time, or an age (`90s`, `2h`, `1d 6h`) meaning that long before now.
pub(crate) fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return Ok(t);
    }
    match humantime::parse_duration(text) {
        Ok(age) => Ok(OffsetDateTime::now_utc() - age),
        Err(_) => Err(format!(
            "`{text}` is neither an RFC 3339 time (2026-11-22T08:00:00Z) nor an age such as `2h` or `30m`"
        )),
    }
}

pub(crate) async fn run(config: &Config, args: ReplayArgs) -> anyhow::Result<()> {
    if let Some(until) = args.until
        && until <= args.since
    {
        bail!(
            "--until ({}) must be after --since ({})",
            when(until),
            when(args.since)
        );
    }
    let backend = crate::backend::open(config, 1).await?;
    let replay = backend.replay()?;
    let selection = ReplaySelection {
        since: args.since,
        until: args.until,
        aggregate_id: args.aggregate.clone(),
        event_type: args.event_type.clone(),
    };
    let e = crate::backend::source_error;
    let plan = replay.plan(&selection, 5).await.map_err(e)?;
    let window = format!(
        "written from {} to {}{}{}",
        when(selection.since),
        selection
            .until
            .map(when)
            .unwrap_or_else(|| "now".to_owned()),
        selection
            .aggregate_id
            .as_deref()
            .map(|a| format!(", aggregate {a}"))
            .unwrap_or_default(),
        selection
            .event_type
            .as_deref()
            .map(|t| format!(", type {t}"))
            .unwrap_or_default()
    );
    let what = plan.noun;
    if plan.total == 0 {
        println!(
            "no {what} {window} in {}; nothing to replay (delivered rows older than the retention window are deleted)",
            backend.table()
        );
        return Ok(());
    }
    println!("{} {what} {window}", plan.total);
    for p in &plan.preview {
        println!(
            "  {}  {}/{}  {}  created {}",
            p.id,
            p.aggregate_type,
            p.aggregate_id,
            p.event_type,
            when(p.created_at)
        );
    }
    if plan.total > plan.preview.len() as u64 {
        println!("  ... and {} more", plan.total - plan.preview.len() as u64);
    }
    if args.dry_run {
        println!("dry run: nothing replayed");
        return Ok(());
    }
    if !args.yes
        && !confirm(&format!(
            "Publish these {} event(s) again? [y/N] ",
            plan.total
        ))?
    {
        bail!("not confirmed; nothing replayed (pass --yes to skip the question)");
    }
    let bar = (plan.total >= PROGRESS_FROM).then(|| {
        let bar = indicatif::ProgressBar::new(plan.total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} events put back in line ({per_sec}, {eta} left)",
        ) {
            bar.set_style(style);
        }
        bar
    });
    let ids = replay.ids(&selection).await.map_err(e)?;
    let mut done = 0_u64;
    for batch in ids.chunks(BATCH) {
        let n = replay.replay_batch(batch).await.map_err(e)?;
        done += n;
        if let Some(bar) = &bar {
            bar.inc(batch.len() as u64);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    println!(
        "{done} event(s) put back in line; the running relay publishes them again with the same ids{}",
        if done < ids.len() as u64 {
            " (fewer than counted: some changed meanwhile, e.g. deleted by retention)"
        } else {
            ""
        }
    );
    Ok(())
}

fn confirm(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!("refusing to replay without confirmation: stdin is not a terminal; pass --yes");
    }
    eprint!("{question}");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_an_age() {
        let t = parse_time("2026-11-22T08:00:00Z").expect("rfc3339");
        assert_eq!(t.unix_timestamp(), 1_795_334_400);
        let before = OffsetDateTime::now_utc();
        let t = parse_time("2h").expect("age");
        assert!(before - t >= time::Duration::hours(2) - time::Duration::seconds(1));
        let err = parse_time("yesterday").expect_err("bad time");
        assert!(err.contains("`yesterday`"), "{err}");
    }
}
