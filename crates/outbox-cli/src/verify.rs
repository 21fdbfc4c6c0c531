//! `outbox verify`: reconciles the events the outbox table says were delivered in a window
//! with what the destination holds (the logic is `outbox_runtime::verify`; this prints it).
//!
//! Exit codes: 0 nothing lost, no phantom, no order break; 1 any of them; 2 cannot verify
//! (the reason on stderr, naming what is missing).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use outbox_core::admin::when;
use outbox_core::verify::{Basis, ReadProgress};
use outbox_runtime::verify::{Finding, OrderBreak, Report, Verdict};
use outbox_runtime::{Config, Origin};
use time::OffsetDateTime;

/// `outbox verify` arguments.
#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    /// Events written at or after this time: an age (`1h`, the default: the last hour) or an
    /// RFC 3339 time (`2026-11-22T08:00:00Z`).
    #[arg(long, value_parser = crate::replay::parse_time, default_value = "1h")]
    since: OffsetDateTime,
    /// Print the report as JSON (its keys: docs/operations.md, "Proving delivery").
    #[arg(long)]
    json: bool,
    /// Ids listed per finding (lost, phantom, duplicates, order breaks, ...).
    #[arg(long, value_name = "N", default_value_t = 10)]
    ids: usize,
}

/// Runs the verification and prints it; returns the exit code (0, 1 or 2).
pub(crate) async fn run(loaded: anyhow::Result<(Config, Origin)>, args: VerifyArgs) -> ExitCode {
    let config = match loaded {
        Ok((config, _)) => config,
        Err(e) => return cannot_verify(&crate::chain(e.as_ref()), args.json),
    };
    let progress = Progress::new(!args.json);
    let options = outbox_runtime::verify::Options {
        since: args.since,
        max_ids: args.ids,
    };
    let result = outbox_runtime::verify::verify(&config, &options, &progress).await;
    progress.finish();
    let report = match result {
        Ok(report) => report,
        Err(e) => return cannot_verify(&e.0, args.json),
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => return cannot_verify(&format!("encoding the report: {e}"), false),
        }
    } else {
        print_report(&report, args.ids);
    }
    if let Some(reason) = &report.cannot_verify {
        eprintln!("error: cannot verify: {reason}");
    }
    ExitCode::from(report.exit_code)
}

/// Exit 2 with the reason (and, with `--json`, a report saying so on stdout).
fn cannot_verify(reason: &str, json: bool) -> ExitCode {
    let reason = reason.strip_prefix("cannot verify: ").unwrap_or(reason);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "verdict": Verdict::CannotVerify,
                "exit_code": Verdict::CannotVerify.exit_code(),
                "cannot_verify": reason,
            })
        );
    }
    eprintln!("error: cannot verify: {reason}");
    ExitCode::from(Verdict::CannotVerify.exit_code())
}

fn print_report(r: &Report, max_ids: usize) {
    println!(
        "outbox verify: events written from {} to {}",
        when(r.window.since),
        when(r.window.until)
    );
    let basis = match &r.source.basis {
        Basis::Marked => "rows marked delivered".to_owned(),
        Basis::Deleted => "rows deleted on delivery: delivered events are not kept".to_owned(),
        Basis::Stream { detail } => detail.clone(),
    };
    if r.source.table.contains(&r.source.database) {
        println!("  outbox       {} ({basis})", r.source.table);
    } else {
        println!(
            "  outbox       {} in {} ({basis})",
            r.source.table, r.source.database
        );
    }
    println!("  destination  {}", r.destination.describe);
    println!();
    let row = |label: &str, value: String| println!("  {label:<24} {value}");
    row(
        "delivered (table)",
        format!(
            "{}   (not delivered yet: {}, dead-lettered: {})",
            r.source.delivered, r.source.undelivered, r.source.dead
        ),
    );
    row(
        "read back",
        format!(
            "{}   ({} lane(s))",
            r.destination.read,
            r.destination.lanes.len()
        ),
    );
    row("found", r.matched.to_string());
    row("lost", r.lost.count.to_string());
    row("phantom", r.phantom.count.to_string());
    row(
        "duplicates",
        format!("{}   (copies beyond the first)", r.duplicates.count),
    );
    row("order breaks", order_breaks(r));
    let extra = |label: &str, n: u64| {
        if n > 0 {
            row(label, n.to_string());
        }
    };
    extra("expired at destination", r.expired_at_destination.count);
    extra("deleted from table", r.deleted_from_table.count);
    extra("dead, yet delivered", r.dead_at_destination.count);
    extra("in flight", r.in_flight);
    extra("outside the window", r.outside_window);
    extra("without an event id", r.without_id);

    let list = |label: &str, finding: &Finding| print_ids(label, finding, label != "duplicated");
    list("lost", &r.lost);
    list("phantom", &r.phantom);
    list("duplicated", &r.duplicates);
    if !r.order_break_details.is_empty() {
        println!();
        println!(
            "  order breaks{}:",
            if r.order_breaks.count > r.order_break_details.len() as u64 {
                format!(
                    " (first {} of {})",
                    r.order_break_details.len(),
                    r.order_breaks.count
                )
            } else {
                String::new()
            }
        );
        for b in r.order_break_details.iter().take(max_ids) {
            println!("    {} in {}", order_break(b), b.lane);
        }
    }
    list("expired at the destination", &r.expired_at_destination);
    list("deleted from the table", &r.deleted_from_table);
    list(
        "dead-lettered, yet at the destination",
        &r.dead_at_destination,
    );
    for t in &r.destination.trimmed {
        println!();
        println!("  note: {}", t.detail);
    }
    for note in &r.notes {
        println!("  note: {note}");
    }
    println!();
    let speed = format!(
        "{} event(s) in {:.2}s, {:.0} events/s",
        r.source.delivered, r.seconds, r.events_per_second
    );
    match r.verdict {
        Verdict::Ok => println!(
            "PASS: every delivered event is at the destination, no phantom{} ({speed})",
            if r.order_checked {
                ", per-aggregate order held"
            } else {
                ""
            }
        ),
        Verdict::Failed => println!(
            "FAIL: {} lost, {} phantom, {} order break(s) ({speed})",
            r.lost.count, r.phantom.count, r.order_breaks.count
        ),
        Verdict::CannotVerify => println!("CANNOT VERIFY ({speed}): see the error below"),
    }
}

/// A progress bar on a terminal (stderr), plain stage lines otherwise; nothing with `--json`
/// unless stderr is a terminal.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
}

impl Progress {
    fn new(lines: bool) -> Self {
        Self {
            bar: spinner(),
            lines,
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A spinner on stderr when it is a terminal (`verify`, `crash-test`).
pub(crate) fn spinner() -> Option<indicatif::ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    })
}

/// The `order breaks` row: their count, or why order was not checked.
pub(crate) fn order_breaks(r: &Report) -> String {
    if r.order_checked {
        r.order_breaks.count.to_string()
    } else {
        "not checked (relay.ordering = \"none\")".to_owned()
    }
}

/// One order break: which event arrived after which, by what position.
pub(crate) fn order_break(b: &OrderBreak) -> String {
    format!(
        "{} ({}/{}, {} {}) arrived after {} ({} {})",
        b.id, b.aggregate_type, b.aggregate_id, b.by, b.position, b.after, b.by, b.after_position
    )
}

/// The ids of a finding under `label`, if it has any; with `counted`, the header says when
/// they are only the first of more.
pub(crate) fn print_ids(label: &str, finding: &Finding, counted: bool) {
    if finding.ids.is_empty() {
        return;
    }
    let more = if counted && finding.count > finding.ids.len() as u64 {
        format!(" (first {} of {})", finding.ids.len(), finding.count)
    } else {
        String::new()
    };
    println!();
    println!("  {label}{more}:");
    for id in &finding.ids {
        println!("    {id}");
    }
}

impl ReadProgress for Progress {
    fn stage(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(what.to_owned()),
            None if self.lines => eprintln!("verify: {what}"),
            None => {}
        }
    }

    fn advance(&self, read: u64, total: Option<u64>) {
        let Some(bar) = &self.bar else { return };
        if let Some(total) = total
            && bar.length() != Some(total)
        {
            bar.set_length(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} messages read back ({per_sec}, {eta} left) {msg}",
            ) {
                bar.set_style(style);
            }
        }
        bar.set_position(read);
    }
}
