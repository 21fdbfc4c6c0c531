//! What a crash test prints: a progress line on a terminal (plain lines otherwise), then the
//! lost / phantom / order breaks / duplicates table with a PASS or FAIL line, or `--json`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_core::verify::ReadProgress;
use outbox_runtime::verify::Report;
use uuid::Uuid;

use super::chaos::Chaos;
use super::producers::Written;
use super::scratch::Removal;

/// Exit code: the crash test passed.
const PASS: u8 = 0;
/// Exit code: it found a fault.
const FAIL: u8 = 1;
/// Exit code: it could not run.
const CANNOT_RUN: u8 = 2;

/// Everything a finished run found.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) duration: Duration,
    pub(super) relays: u16,
    pub(super) producers: u16,
    pub(super) database: String,
    pub(super) table: String,
    pub(super) committed: u64,
    pub(super) rolled_back: u64,
    pub(super) failed_writes: u64,
    pub(super) kills: u64,
    pub(super) pauses: u64,
    pub(super) relay_exits: u64,
    pub(super) pause_seconds: u64,
    pub(super) drain_seconds: f64,
    pub(super) undelivered: u64,
    pub(super) rolled_back_seen: Vec<Uuid>,
    pub(super) verified: Report,
    pub(super) logs: Option<PathBuf>,
    pub(super) log_tails: Option<String>,
}

impl Outcome {
    fn passed(&self) -> bool {
        self.verified.verdict == outbox_runtime::verify::Verdict::Ok
            && self.rolled_back_seen.is_empty()
            && self.undelivered == 0
    }
}

/// Prints the result; returns exit code 0 (PASS) or 1 (FAIL).
pub(super) fn print(outcome: &Outcome, removals: &[Removal], json: bool) -> ExitCode {
    let code = if outcome.passed() { PASS } else { FAIL };
    if json {
        let r = &outcome.verified;
        let value = serde_json::json!({
            "verdict": if code == PASS { "pass" } else { "fail" },
            "exit_code": code,
            "duration_seconds": outcome.duration.as_secs_f64(),
            "relays": outcome.relays,
            "producers": outcome.producers,
            "committed": outcome.committed,
            "rolled_back": outcome.rolled_back,
            "failed_writes": outcome.failed_writes,
            "kills": outcome.kills,
            "pauses": outcome.pauses,
            "relay_exits": outcome.relay_exits,
            "drain_seconds": outcome.drain_seconds,
            "undelivered": outcome.undelivered,
            "lost": r.lost,
            "phantom": r.phantom,
            "rolled_back_delivered": {
                "count": outcome.rolled_back_seen.len(),
                "ids": outcome.rolled_back_seen.iter().take(10).collect::<Vec<_>>(),
            },
            "order_breaks": r.order_breaks,
            "duplicates": r.duplicates,
            "verify": r,
            "scratch": removals,
            "logs": outcome.logs,
        });
        println!("{value:#}");
        return ExitCode::from(code);
    }
    let r = &outcome.verified;
    println!(
        "outbox crash-test: {} with {} relay(s) and {} producer(s)",
        humantime::format_duration(outcome.duration),
        outcome.relays,
        outcome.producers
    );
    println!("  database     {}", outcome.database);
    println!("  scratch      {}", outcome.table);
    println!("  destination  {}", r.destination.describe);
    println!();
    let row = |label: &str, value: String| println!("  {label:<24} {value}");
    row(
        "written",
        format!(
            "{} event(s) committed, {} rolled back{}",
            outcome.committed,
            outcome.rolled_back,
            if outcome.failed_writes > 0 {
                format!(" ({} write(s) failed)", outcome.failed_writes)
            } else {
                String::new()
            }
        ),
    );
    row(
        "chaos",
        format!(
            "{} SIGKILL(s) and restarts, {} SIGSTOP pause(s) of {}s (past the claim){}",
            outcome.kills,
            outcome.pauses,
            outcome.pause_seconds,
            if outcome.relay_exits > 0 {
                format!(", {} relay exit(s) on their own", outcome.relay_exits)
            } else {
                String::new()
            }
        ),
    );
    row(
        "drained",
        if outcome.undelivered == 0 {
            format!("yes, in {:.1}s", outcome.drain_seconds)
        } else {
            format!(
                "NO: {} event(s) still undelivered after {:.0}s without progress",
                outcome.undelivered, outcome.drain_seconds
            )
        },
    );
    row("delivered (table)", r.source.delivered.to_string());
    row("read back", r.destination.read.to_string());
    row("lost", r.lost.count.to_string());
    row("phantom", r.phantom.count.to_string());
    row(
        "rolled back, delivered",
        outcome.rolled_back_seen.len().to_string(),
    );
    row("order breaks", crate::verify::order_breaks(r));
    row(
        "duplicates",
        format!(
            "{}   (copies beyond the first: at-least-once allows them)",
            r.duplicates.count
        ),
    );
    crate::verify::print_ids("lost", &r.lost, false);
    crate::verify::print_ids("phantom", &r.phantom, false);
    if !outcome.rolled_back_seen.is_empty() {
        println!();
        println!("  rolled back, yet delivered:");
        for id in outcome.rolled_back_seen.iter().take(10) {
            println!("    {id}");
        }
    }
    if !r.order_break_details.is_empty() {
        println!();
        println!("  order breaks:");
        for b in &r.order_break_details {
            println!("    {}", crate::verify::order_break(b));
        }
    }
    println!();
    print_removals(removals);
    if let Some(tails) = &outcome.log_tails {
        println!();
        println!("  relay logs (last lines):");
        print!("{tails}");
    }
    println!();
    if code == PASS {
        println!(
            "PASS: {} committed event(s) delivered through {} kill(s) and {} pause(s): none lost, no phantom, no rolled-back event{}",
            r.source.delivered,
            outcome.kills,
            outcome.pauses,
            if r.order_checked {
                ", per-aggregate order held"
            } else {
                ""
            }
        );
    } else {
        println!(
            "FAIL: {} lost, {} phantom, {} rolled-back delivered, {} order break(s), {} undelivered",
            r.lost.count,
            r.phantom.count,
            outcome.rolled_back_seen.len(),
            r.order_breaks.count,
            outcome.undelivered
        );
    }
    ExitCode::from(code)
}

fn print_removals(removals: &[Removal]) {
    for removal in removals {
        match &removal.removed {
            Ok(lines) => println!("  removed      {}", lines.join("; ")),
            Err(e) => println!("  NOT REMOVED  {}: {e}; remove it by hand", removal.created),
        }
    }
}

/// Exit 2: the crash test could not run; says why (and what it removed).
pub(super) fn cannot_run(reason: &str, json: bool, removals: &[Removal]) -> ExitCode {
    if json {
        println!(
            "{:#}",
            serde_json::json!({
                "verdict": "cannot_run",
                "exit_code": CANNOT_RUN,
                "cannot_run": reason,
                "scratch": removals,
            })
        );
    } else if !removals.is_empty() {
        print_removals(removals);
    }
    eprintln!("error: crash-test cannot run: {reason}");
    ExitCode::from(CANNOT_RUN)
}

/// A progress line on a terminal (stderr), plain lines otherwise; nothing with `--json`
/// unless stderr is a terminal.
pub(super) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
}

impl Progress {
    pub(super) fn new(lines: bool) -> Self {
        Self {
            bar: crate::verify::spinner(),
            lines,
        }
    }

    /// A new stage: the spinner's message, or a line.
    pub(super) fn stage(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(what.to_owned()),
            None if self.lines => eprintln!("crash-test: {what}"),
            None => {}
        }
    }

    /// Something that happened (a relay killed): a line above the spinner, or a line.
    pub(super) fn line(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.println(format!("crash-test: {what}")),
            None if self.lines => eprintln!("crash-test: {what}"),
            None => {}
        }
    }

    /// While producers and chaos run: the spinner's message (no lines: too many).
    pub(super) fn running(
        &self,
        elapsed: Duration,
        of: Duration,
        written: &Written,
        chaos: &Chaos,
    ) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!(
                "{}s/{}s: {} committed, {} rolled back; {} kill(s), {} pause(s)",
                elapsed.as_secs(),
                of.as_secs(),
                written.committed.load(Ordering::Relaxed),
                written.rolled_back.load(Ordering::Relaxed),
                chaos.kills.load(Ordering::Relaxed),
                chaos.pauses.load(Ordering::Relaxed),
            ));
        }
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl ReadProgress for Progress {
    fn stage(&self, what: &str) {
        Progress::stage(self, &format!("verify: {what}"));
    }

    fn advance(&self, _read: u64, _total: Option<u64>) {}
}
