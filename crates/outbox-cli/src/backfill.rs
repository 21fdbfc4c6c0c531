//! `outbox backfill --subscription NAME (--since DURATION | --all)`: copies the retained outbox
//! events that match a subscription's filter into its table, in commit order, while relays
//! run (docs/subscriptions.md, "Backfill").
//!
//! The ids are read once, grouped by aggregate and in commit order within each (so a page
//! holds whole aggregates and each aggregate is held once); then pages of events are read, filtered here with
//! the subscription's own filter (the one the fan-out uses), and handed to the backend, which
//! applies each page in one transaction holding its aggregates (`outbox_core::backfill`).
//! An aggregate the backend cannot hold now (a relay has one of its rows in flight) waits,
//! with every later event of it, for a later round. A kill -9 loses at most the chunk in
//! flight; a rerun finds what is already there and counts it as such.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use outbox_core::backfill::{BackfillCounts, Candidate};
use outbox_runtime::catalog::CatalogError;
use outbox_runtime::subscription::Filter;
use time::OffsetDateTime;

/// Events read and applied per transaction.
const PAGE: usize = 1_000;
/// How long aggregates held by a relay are tried again before the command gives up on them.
const DEFERRED_FOR: Duration = Duration::from_secs(120);
/// Between two tries of deferred aggregates.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Without a terminal: one progress line at most this often.
const LINE_EVERY: Duration = Duration::from_secs(2);

/// `outbox backfill` arguments (`--subscription NAME` is the global flag).
#[derive(Debug, Args)]
pub(crate) struct BackfillArgs {
    /// Retained events written within this long before now (`2h`, `7d`, `1d 6h`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration,
          required_unless_present = "all", conflicts_with = "all")]
    since: Option<Duration>,
    /// Every retained event.
    #[arg(long)]
    all: bool,
}

/// Where the command reads its config from (the global flags).
pub(crate) struct Invocation<'a> {
    pub(crate) config: Option<&'a Path>,
    pub(crate) database_url: Option<&'a str>,
    pub(crate) subscription: Option<&'a str>,
}

pub(crate) async fn run(invocation: Invocation<'_>, args: BackfillArgs) -> anyhow::Result<()> {
    let Some(name) = invocation.subscription else {
        bail!("--subscription: required; name the [[subscription]] to backfill");
    };
    let (config, _) = outbox_runtime::config::load(invocation.config, invocation.database_url)?;
    let backend = crate::backend::open(&config, 2).await?;
    let filter = subscription_filter(&config, &*backend, name).await?;
    let since = match args.since {
        Some(age) => Some(
            OffsetDateTime::now_utc()
                .checked_sub(
                    time::Duration::try_from(age)
                        .map_err(|_| anyhow::anyhow!("--since: `{age:?}` is too long"))?,
                )
                .context("--since: reaches before the year -9999")?,
        ),
        None => None,
    };
    let backfill = backend
        .backfill(name)
        .map_err(|e| anyhow::anyhow!(e.to_string()))?;
    let e = crate::backend::source_error;
    let ids = backfill.ids(since).await.map_err(e)?;
    let mut run = Run::new(ids.len() as u64, name);
    for page in ids.chunks(PAGE) {
        let events = backfill.events(page).await.map_err(e)?;
        let chunk = run.take(events, &filter);
        if !chunk.is_empty() {
            let outcome = backfill.apply(&chunk).await.map_err(e)?;
            run.record(outcome.counts, outcome.deferred);
        }
        run.progress(page.len() as u64);
    }
    let started = Instant::now();
    while !run.deferred.is_empty() && started.elapsed() < DEFERRED_FOR {
        tokio::time::sleep(RETRY_PAUSE).await;
        let waiting = run.retry();
        for page in waiting.chunks(PAGE) {
            let chunk: Vec<Candidate> = page.iter().cloned().filter_map(|c| run.admit(c)).collect();
            if !chunk.is_empty() {
                let outcome = backfill.apply(&chunk).await.map_err(e)?;
                run.record(outcome.counts, outcome.deferred);
            }
        }
    }
    run.finish();
    println!(
        "backfill of subscription `{name}`{}: {}",
        since.map_or_else(
            || " (all retained events)".to_owned(),
            |t| format!(" (events written since {})", crate::dead::when(t))
        ),
        run.summary()
    );
    if !run.deferred.is_empty() {
        bail!(
            "{} event(s) not backfilled: their aggregates stayed in flight at a relay for {:?}; run the command again (what is copied stays)",
            run.deferred.len(),
            DEFERRED_FOR
        );
    }
    Ok(())
}

/// The subscription's filter: from the catalog (what every relay fans out by), or from the
/// file's `[[subscription]]` where the database has no catalog.
async fn subscription_filter(
    config: &outbox_runtime::Config,
    backend: &dyn outbox_core::backend::Backend,
    name: &str,
) -> anyhow::Result<Filter> {
    match outbox_runtime::catalog::find(backend, name).await {
        Ok(sub) => Ok(sub.filter),
        Err(CatalogError::Unsupported(_)) => {
            // Checks the name (the error lists the configured ones).
            outbox_runtime::subscription::for_subscription(config, name)
                .map_err(|e| anyhow::anyhow!(e))?;
            outbox_runtime::subscription::resolve(config)
                .map_err(|e| anyhow::anyhow!(e))?
                .into_iter()
                .find(|s| s.name == name)
                .map(|s| s.filter)
                .context("--subscription: the subscription vanished while resolving")
        }
        Err(e @ CatalogError::Unknown { .. }) => Err(anyhow::anyhow!(
            "--subscription: {e}; add it to [[subscription]] and run `outbox migrate` first"
        )),
        Err(e) => Err(anyhow::anyhow!("--subscription: {e}")),
    }
}

/// The state of one run: counts, deferred candidates, progress.
struct Run {
    counts: BackfillCounts,
    filtered_out: u64,
    deferred: Vec<Candidate>,
    /// Aggregates with a deferred event: their later events wait behind it.
    waiting: HashSet<(String, String)>,
    bar: Option<indicatif::ProgressBar>,
    read: u64,
    total: u64,
    last_line: Instant,
    name: String,
}

impl Run {
    fn new(total: u64, name: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} events ({per_sec}, {eta} left) {msg}",
            ) {
                bar.set_style(style);
            }
            bar
        });
        Self {
            counts: BackfillCounts::default(),
            filtered_out: 0,
            deferred: Vec::new(),
            waiting: HashSet::new(),
            bar,
            read: 0,
            total,
            last_line: Instant::now(),
            name: name.to_owned(),
        }
    }

    /// The events of a page that the subscription takes and whose aggregate is not waiting.
    fn take(&mut self, events: Vec<Candidate>, filter: &Filter) -> Vec<Candidate> {
        let mut chunk = Vec::with_capacity(events.len());
        for c in events {
            if filter.matches(&c.event) {
                chunk.extend(self.admit(c));
            } else {
                self.filtered_out += 1;
            }
        }
        chunk
    }

    /// `c`, unless its aggregate waits behind a deferred event: then it waits too.
    fn admit(&mut self, c: Candidate) -> Option<Candidate> {
        if self.waiting.contains(&key(&c)) {
            self.deferred.push(c);
            None
        } else {
            Some(c)
        }
    }

    /// Takes the deferred events for another round, oldest first.
    fn retry(&mut self) -> Vec<Candidate> {
        self.waiting.clear();
        std::mem::take(&mut self.deferred)
    }

    fn record(&mut self, counts: BackfillCounts, deferred: Vec<Candidate>) {
        self.counts += counts;
        self.deferred.extend(deferred);
        // Per aggregate, commit order: a retry applies them oldest first.
        self.deferred.sort_by_key(|c| c.outbox_seq);
        self.waiting = self.deferred.iter().map(key).collect();
    }

    fn progress(&mut self, read: u64) {
        self.read += read;
        match &self.bar {
            Some(bar) => {
                bar.set_position(self.read);
                bar.set_message(format!("copied {}", self.counts.copied));
            }
            None if self.last_line.elapsed() >= LINE_EVERY || self.read == self.total => {
                self.last_line = Instant::now();
                eprintln!(
                    "backfill `{}`: {}/{} events read; {}",
                    self.name,
                    self.read,
                    self.total,
                    self.summary()
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

    fn summary(&self) -> String {
        format!(
            "copied {}, already there {}, skipped by the filter {}, skipped (a newer event of the aggregate was already delivered) {}{}",
            self.counts.copied,
            self.counts.already_there,
            self.filtered_out,
            self.counts.skipped_newer_delivered,
            if self.deferred.is_empty() {
                String::new()
            } else {
                format!(", waiting (aggregate in flight) {}", self.deferred.len())
            }
        )
    }
}

fn key(c: &Candidate) -> (String, String) {
    (c.event.aggregate_type.clone(), c.event.aggregate_id.clone())
}
