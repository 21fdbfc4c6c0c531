//! `outbox capture snapshot` (docs/capture.md, "Snapshot"): drives a capture's snapshot chunk
//! by chunk, at most `--rate` rows per second, with a progress bar on a terminal and plain
//! progress lines otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use outbox_core::capture::snapshot::chunk_rows;
use outbox_core::capture::{Capture, CaptureEntry, CaptureError, SnapshotStart};

/// `--rate` when not given: rows per second.
pub(crate) const DEFAULT_RATE: u32 = 1_000;

/// How often a plain progress line is printed when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(2);

/// Snapshots the capture of `entry` to its end (or resumes it), printing what it did.
pub(crate) async fn run(
    capture: &dyn Capture,
    entry: CaptureEntry<'_>,
    rate: u32,
) -> anyhow::Result<()> {
    let e = |e: CaptureError| anyhow::anyhow!(crate::chain(&e));
    let mut run = capture.snapshot(entry).await.map_err(e)?;
    let start = run.start().clone();
    println!("{}", start_line(&start, rate));
    let limit = chunk_rows(rate);
    let progress = Progress::new(&start);
    let began = Instant::now();
    let mut rows: u64 = 0;
    loop {
        let chunk = run.chunk(limit).await.map_err(|err| {
            progress.finish();
            anyhow::anyhow!(
                "{} ({rows} rows snapshotted by this run before it)",
                crate::chain(&err)
            )
        })?;
        rows += chunk.rows;
        progress.advance(rows, start.rows_done + rows);
        if chunk.finished {
            break;
        }
        // Throttle: this run's rows never run ahead of `rate` per second.
        let due = Duration::from_secs_f64(rows as f64 / f64::from(rate));
        if let Some(wait) = due.checked_sub(began.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    progress.finish();
    let secs = began.elapsed().as_secs_f64();
    println!(
        "capture {}: snapshot finished: {rows} rows of {} in {secs:.1}s ({:.0} rows/s), {} in this snapshot",
        start.name,
        start.table,
        rows as f64 / secs.max(1e-3),
        start.rows_done + rows,
    );
    Ok(())
}

fn start_line(start: &SnapshotStart, rate: u32) -> String {
    let from = if start.resumed {
        format!(
            "resuming after {} rows already snapshotted",
            start.rows_done
        )
    } else {
        "starting".to_owned()
    };
    format!(
        "capture {}: snapshot of {} by {}: {from}, about {} rows left, at most {rate} rows/s in chunks of {}",
        start.name,
        start.table,
        start.key,
        start.rows_left,
        chunk_rows(rate)
    )
}

/// A bar on a terminal (stderr), a plain line every few seconds otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    name: String,
    total: u64,
    last_line: std::cell::Cell<Instant>,
}

impl Progress {
    fn new(start: &SnapshotStart) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(start.rows_left);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} rows ({per_sec}, {eta} left) {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Self {
            bar,
            name: start.name.clone(),
            total: start.rows_left,
            last_line: std::cell::Cell::new(Instant::now()),
        }
    }

    /// `rows` done by this run, `all` in the snapshot.
    fn advance(&self, rows: u64, all: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(rows),
            None if self.last_line.get().elapsed() >= LINE_EVERY => {
                self.last_line.set(Instant::now());
                eprintln!(
                    "capture {}: snapshot {rows}/{} rows ({all} in this snapshot)",
                    self.name, self.total
                );
            }
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
