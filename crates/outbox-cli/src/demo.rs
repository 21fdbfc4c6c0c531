//! `outbox demo`: the whole pattern in one process, with nothing to install.
//!
//! A producer places orders in a SQLite database, each order and its `order.placed` event in
//! one transaction, and rolls some back on purpose. Meanwhile an in-process relay
//! ([`outbox_core::Relay`] over [`outbox_sqlite::SqlitePollSource`]) publishes the events as
//! JSON lines to stdout or a file. When the outbox is drained the demo checks the two
//! guarantees that matter and prints a summary: every committed order has exactly one
//! published event (deduplicated by event id; redeliveries are counted as duplicates), and no
//! rolled-back order has one. A violated guarantee is an error (non-zero exit).

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use outbox_core::sink::Delivery;
use outbox_core::{DynSink, Event, Inspect as _, NewEvent, Relay, RelayConfig, Sink, SinkError};
use outbox_sinks::{FileConfig, StdoutConfig};
use outbox_sqlite::{SqliteConfig, SqliteInspector, SqliteOutbox, SqlitePollSource};
use serde::Serialize;
use sqlx::SqlitePool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Flags of `outbox demo`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DemoArgs {
    /// Orders to place.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub(crate) orders: u32,
    /// Roll back every K-th order on purpose, after its event was written (0: never).
    #[arg(long, default_value_t = 10, value_name = "K")]
    pub(crate) rollback_every: u32,
    /// Write the published events (JSON lines) to FILE, replacing it, instead of stdout. The
    /// summary then goes to stdout; otherwise it goes to stderr.
    #[arg(long, value_name = "FILE")]
    pub(crate) out: Option<PathBuf>,
    /// SQLite database file (created if missing, kept). Default: a temporary file, removed
    /// at the end unless --keep.
    #[arg(long, value_name = "PATH")]
    pub(crate) database: Option<PathBuf>,
    /// Keep the temporary database, to look at it afterwards (`outbox status`).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Print every event on the terminal. Without it, a terminal shows the first few events,
    /// a progress line and the summary (a pipe or --out always gets every event).
    #[arg(long)]
    pub(crate) all: bool,
}

/// Events shown on a terminal before the demo switches to its progress line.
const SAMPLE: u64 = 5;

/// What the demo did and whether the guarantees held.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DemoSummary {
    /// The SQLite database file.
    pub(crate) database: String,
    /// Whether the database file is still there.
    pub(crate) database_kept: bool,
    /// Where the events went (`stdout` or a file path).
    pub(crate) output: String,
    /// Orders whose transaction committed.
    pub(crate) orders_committed: u64,
    /// Orders rolled back on purpose.
    pub(crate) orders_rolled_back: u64,
    /// Distinct events published (deduplicated by event id).
    pub(crate) events_published: u64,
    /// Messages written, duplicates included.
    pub(crate) deliveries: u64,
    /// Redeliveries of an already published event.
    pub(crate) duplicates: u64,
    /// Events dead-lettered by the relay.
    pub(crate) dead_lettered: u64,
    /// Median time from the producer's commit to the sink's acknowledgement, milliseconds.
    pub(crate) latency_p50_ms: f64,
    /// 99th percentile of the same, milliseconds.
    pub(crate) latency_p99_ms: f64,
    /// Wall time of the run, seconds.
    pub(crate) elapsed_seconds: f64,
    /// Committed orders without a published event.
    pub(crate) missing: u64,
    /// Published events of rolled-back orders, or of no order of this run.
    pub(crate) phantoms: u64,
    /// True when every committed order has exactly one published event and no rolled-back
    /// order has one.
    pub(crate) invariant_holds: bool,
}

/// Longest wait for the relay to drain the outbox after the last order.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Runs the demo and prints its summary; fails when a guarantee was violated.
pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<DemoSummary> {
    let run_id = Uuid::now_v7().simple().to_string()[24..].to_owned();
    let (path, temporary) = match &args.database {
        Some(p) => (p.clone(), false),
        None => (
            std::env::temp_dir().join(format!("outbox-demo-{run_id}.db")),
            true,
        ),
    };
    let result = demo(&args, &run_id, &path).await;
    let keep = !temporary || args.keep || matches!(&result, Ok(s) if !s.invariant_holds);
    if !keep {
        remove_database(&path);
    }
    let mut summary = result?;
    summary.database_kept = keep;
    print_summary(&args, &summary)?;
    if !summary.invariant_holds {
        bail!(
            "guarantee violated: {} committed order(s) without their event, {} phantom event(s); database kept at `{}`",
            summary.missing,
            summary.phantoms,
            path.display()
        );
    }
    Ok(summary)
}

/// One order the producer handled.
struct Order {
    event_id: Uuid,
    /// When the commit returned; `None` for a rolled-back order.
    committed_at: Option<Instant>,
}

async fn demo(args: &DemoArgs, run_id: &str, path: &Path) -> anyhow::Result<DemoSummary> {
    let started = Instant::now();
    let config = SqliteConfig::new(path);
    let db_name = || format!("SQLite database `{}`", path.display());
    let relay_pool = outbox_sqlite::connect(&config)
        .await
        .with_context(|| format!("cannot open {}", db_name()))?;
    outbox_sqlite::migrate(&relay_pool, &config.table)
        .await
        .with_context(|| format!("preparing the outbox in {}", db_name()))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
             id          TEXT    PRIMARY KEY,
             customer    TEXT    NOT NULL,
             total_cents INTEGER NOT NULL,
             placed_at   INTEGER NOT NULL
         )",
    )
    .execute(&relay_pool)
    .await
    .with_context(|| format!("creating the orders table in {}", db_name()))?;
    // The application has its own connections, like a separate process would.
    let app_pool = outbox_sqlite::connect(&config)
        .await
        .with_context(|| format!("cannot open {}", db_name()))?;

    let expected = u64::from(args.orders - rolled_back_count(args));
    let bar = progress_bar(args, expected);
    let sample = sampling(args).then(|| std::sync::atomic::AtomicU64::new(SAMPLE));
    let sink = Arc::new(Recorder {
        inner: build_sink(args).await?,
        seen: Mutex::new(HashMap::new()),
        bar: bar.clone(),
        sample,
    });
    let relay_config = RelayConfig {
        workers: std::num::NonZeroUsize::MIN,
        ..RelayConfig::default()
    };
    let source = SqlitePollSource::new(
        relay_pool.clone(),
        &config,
        relay_config.ordering,
        relay_config.dead_letter,
    );
    let shutdown = CancellationToken::new();
    let relay = {
        let relay = Relay::new(relay_config, Arc::clone(&sink));
        let token = shutdown.clone();
        tokio::spawn(async move { relay.run(vec![source], token).await })
    };

    let produced = produce(&app_pool, args, run_id).await;
    let drained = match &produced {
        Ok(_) => {
            let inspector = SqliteInspector::new(relay_pool.clone(), &config);
            wait_drained(&inspector, &shutdown).await
        }
        Err(_) => Ok(()),
    };
    shutdown.cancel();
    let report = relay
        .await
        .context("the relay task panicked")?
        .context("the relay stopped")?;
    bar.finish_and_clear();
    let orders = produced?;
    drained?;
    app_pool.close().await;
    relay_pool.close().await;

    let seen = sink.seen.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(check(
        &orders,
        &seen,
        run_id,
        report.dead_lettered,
        args,
        path,
        started,
    ))
}

fn rolled_back_count(args: &DemoArgs) -> u32 {
    args.orders.checked_div(args.rollback_every).unwrap_or(0)
}

/// Places the orders, one transaction each: the order row and its event, committed or (every
/// K-th) rolled back after both were written.
async fn produce(pool: &SqlitePool, args: &DemoArgs, run_id: &str) -> anyhow::Result<Vec<Order>> {
    let outbox = SqliteOutbox::default();
    let mut orders = Vec::with_capacity(args.orders as usize);
    for no in 1..=args.orders {
        let id = format!("o_{run_id}_{no:06}");
        let customer = format!("c_{:03}", no % 97);
        let total_cents = 500 + i64::from(no % 89) * 125;
        let event = NewEvent::json(
            "Order",
            &id,
            "order.placed",
            &serde_json::json!({
                "order_id": id,
                "order_no": no,
                "customer": customer,
                "total_cents": total_cents,
            }),
        )?;
        // IMMEDIATE: take SQLite's write lock up front (waiting busy_timeout for the relay's
        // short settle transactions) rather than fail on a lock upgrade.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO orders (id, customer, total_cents, placed_at) VALUES (?1, ?2, ?3, ?4)",
        )
        .bind(&id)
        .bind(&customer)
        .bind(total_cents)
        .bind(time::OffsetDateTime::now_utc().unix_timestamp())
        .execute(&mut *tx)
        .await
        .with_context(|| format!("placing order {id}"))?;
        let event_id = outbox
            .enqueue(&mut *tx, &event)
            .await
            .with_context(|| format!("writing the event of order {id}"))?;
        let committed_at = if args.rollback_every != 0 && no % args.rollback_every == 0 {
            tx.rollback().await?;
            None
        } else {
            tx.commit()
                .await
                .with_context(|| format!("committing order {id}"))?;
            Some(Instant::now())
        };
        orders.push(Order {
            event_id,
            committed_at,
        });
    }
    Ok(orders)
}

/// Waits until no event is pending (every one is delivered or dead-lettered), or the relay
/// stopped on its own (it cancels `relay_stopped` on a fatal error).
async fn wait_drained(
    inspector: &SqliteInspector,
    relay_stopped: &CancellationToken,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + DRAIN_LIMIT;
    while !relay_stopped.is_cancelled() {
        let backlog = inspector
            .backlog()
            .await
            .context("reading the outbox backlog")?;
        if backlog.pending == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the relay did not drain the outbox within {DRAIN_LIMIT:?}: {} events still pending",
                backlog.pending
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// What the sink acknowledged for one event id.
struct Seen {
    aggregate_id: String,
    first_at: Instant,
    count: u64,
}

/// Wraps the real sink and records every acknowledged event, for the check.
struct Recorder {
    inner: Box<dyn DynSink>,
    seen: Mutex<HashMap<Uuid, Seen>>,
    bar: ProgressBar,
    /// On a terminal without --all: how many more events the real sink prints; the rest are
    /// acknowledged without printing (the summary still checks every one).
    sample: Option<std::sync::atomic::AtomicU64>,
}

impl Sink for Recorder {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn publish(&self, batch: &[Event]) -> Result<Vec<Delivery>, SinkError> {
        let deliveries = match &self.sample {
            None => self.inner.publish(batch).await?,
            Some(left) => {
                use std::sync::atomic::Ordering::Relaxed;
                let shown = left
                    .fetch_update(Relaxed, Relaxed, |n| {
                        Some(n.saturating_sub(batch.len() as u64))
                    })
                    .unwrap_or(0)
                    .min(batch.len() as u64) as usize;
                let mut d = self.inner.publish(&batch[..shown]).await?;
                if shown > 0 && left.load(Relaxed) == 0 {
                    eprintln!("... (the rest is counted, not printed: --all prints every event)");
                    // The sample is out: the progress line can have the terminal now.
                    self.bar.set_draw_target(ProgressDrawTarget::stderr());
                }
                d.extend(std::iter::repeat_with(|| Ok(())).take(batch.len() - shown));
                d
            }
        };
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for (event, delivery) in batch.iter().zip(&deliveries) {
            if delivery.is_err() {
                continue;
            }
            let entry = seen.entry(event.id).or_insert_with(|| {
                self.bar.inc(1);
                Seen {
                    aggregate_id: event.aggregate_id.clone(),
                    first_at: now,
                    count: 0,
                }
            });
            entry.count += 1;
        }
        Ok(deliveries)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.inner.healthcheck().await
    }
}

async fn build_sink(args: &DemoArgs) -> anyhow::Result<Box<dyn DynSink>> {
    Ok(match &args.out {
        None => Box::new(StdoutConfig::default().build().await?),
        Some(path) => {
            // Start from an empty file: the output is this run's events only.
            std::fs::File::create(path)
                .with_context(|| format!("cannot create `{}`", path.display()))?;
            let config = FileConfig {
                path: path.clone(),
                // A throwaway file: no fsync per batch.
                sync: false,
                ..FileConfig::default()
            };
            Box::new(config.build().await?)
        }
    })
}

/// Whether the terminal gets a sample of the events instead of all of them.
fn sampling(args: &DemoArgs) -> bool {
    args.out.is_none() && !args.all && std::io::stdout().is_terminal()
}

fn progress_bar(args: &DemoArgs, expected: u64) -> ProgressBar {
    // Every event on the terminal and a bar on the same terminal would garble each other.
    let events_on_terminal = args.out.is_none() && std::io::stdout().is_terminal();
    if events_on_terminal && !sampling(args) {
        return ProgressBar::hidden();
    }
    // While the sample is printed the bar stays hidden (the sink shows it afterwards).
    let target = if sampling(args) {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(expected), target);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} published {pos}/{len} events {wide_bar} {elapsed}")
    {
        bar.set_style(style);
    }
    bar
}

/// Compares what was committed with what was published.
fn check(
    orders: &[Order],
    seen: &HashMap<Uuid, Seen>,
    run_id: &str,
    dead_lettered: u64,
    args: &DemoArgs,
    path: &Path,
    started: Instant,
) -> DemoSummary {
    let prefix = format!("o_{run_id}_");
    let mine: HashMap<&Uuid, &Seen> = seen
        .iter()
        .filter(|(_, s)| s.aggregate_id.starts_with(&prefix))
        .collect();
    let mut missing = 0u64;
    let mut phantoms = 0u64;
    let mut latencies_ms = Vec::with_capacity(orders.len());
    for order in orders {
        match (order.committed_at, mine.get(&order.event_id)) {
            (Some(committed_at), Some(s)) => latencies_ms.push(
                s.first_at
                    .saturating_duration_since(committed_at)
                    .as_secs_f64()
                    * 1000.0,
            ),
            (Some(_), None) => missing += 1,
            (None, Some(_)) => phantoms += 1,
            (None, None) => {}
        }
    }
    // Events of this run's aggregates that belong to no order of it (cannot happen).
    let known: HashMap<&Uuid, ()> = orders.iter().map(|o| (&o.event_id, ())).collect();
    phantoms += mine.keys().filter(|id| !known.contains_key(*id)).count() as u64;
    // An order with an event under a second id would also break "exactly one".
    let mut per_order: HashMap<&str, u64> = HashMap::new();
    for s in mine.values() {
        *per_order.entry(s.aggregate_id.as_str()).or_default() += 1;
    }
    let extra_events: u64 = per_order.values().map(|n| n.saturating_sub(1)).sum();
    latencies_ms.sort_by(f64::total_cmp);
    let deliveries: u64 = mine.values().map(|s| s.count).sum();
    let committed = orders.iter().filter(|o| o.committed_at.is_some()).count() as u64;
    DemoSummary {
        database: path.display().to_string(),
        database_kept: true,
        output: args
            .out
            .as_ref()
            .map_or_else(|| "stdout".to_owned(), |p| p.display().to_string()),
        orders_committed: committed,
        orders_rolled_back: orders.len() as u64 - committed,
        events_published: mine.len() as u64,
        deliveries,
        duplicates: deliveries - mine.len() as u64,
        dead_lettered,
        latency_p50_ms: percentile(&latencies_ms, 50.0),
        latency_p99_ms: percentile(&latencies_ms, 99.0),
        elapsed_seconds: started.elapsed().as_secs_f64(),
        missing,
        phantoms: phantoms + extra_events,
        invariant_holds: missing == 0 && phantoms + extra_events == 0,
    }
}

/// Nearest-rank percentile of sorted values; 0 when there are none.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn print_summary(args: &DemoArgs, s: &DemoSummary) -> anyhow::Result<()> {
    let text = if args.json {
        serde_json::to_string_pretty(s)?
    } else {
        let verdict = if s.invariant_holds {
            "OK".to_owned()
        } else {
            format!("VIOLATED ({} missing, {} phantom)", s.missing, s.phantoms)
        };
        let rollback = match args.rollback_every {
            0 => String::new(),
            k => format!(" (on purpose: every {k}th)"),
        };
        let kept = if s.database_kept { "kept" } else { "removed" };
        format!(
            "outbox demo: {orders} orders in {secs:.2}s; SQLite `{db}` ({kept}) -> {out}\n\
             \x20 orders committed        {committed}\n\
             \x20 orders rolled back      {rolled}{rollback}\n\
             \x20 events published        {published} ({deliveries} deliveries, {dups} duplicates)\n\
             \x20 dead-lettered           {dead}\n\
             \x20 commit -> publish       p50 {p50:.1} ms, p99 {p99:.1} ms\n\
             \x20 invariant               {verdict}: every committed order has exactly one published event (deduplicated by id), no rolled-back order has one",
            orders = s.orders_committed + s.orders_rolled_back,
            secs = s.elapsed_seconds,
            db = s.database,
            out = s.output,
            committed = s.orders_committed,
            rolled = s.orders_rolled_back,
            published = s.events_published,
            deliveries = s.deliveries,
            dups = s.duplicates,
            dead = s.dead_lettered,
            p50 = s.latency_p50_ms,
            p99 = s.latency_p99_ms,
        )
    };
    // Events on stdout keep stdout for themselves; the summary then goes to stderr.
    if args.out.is_some() {
        println!("{text}");
    } else {
        eprintln!("{text}");
    }
    Ok(())
}

/// Removes the database file and SQLite's WAL and shared-memory files beside it.
fn remove_database(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        if let Err(e) = std::fs::remove_file(&p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %Path::new(&p).display(), error = %e, "could not remove the demo database");
        }
    }
}

#[cfg(test)]
mod tests;
