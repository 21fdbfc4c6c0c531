//! `outbox bench`: a load generator and reporter around the real relay, in this process.
//!
//! - `backlog --events N`: writes N events with the producer library (`enqueue_batch`, 1,000 per
//!   statement), then runs the relay against the configured source and sink until the last one
//!   is settled as delivered: drain rate.
//! - `steady --rate R --duration D`: producers commit `--per-transaction` events (default 1)
//!   per transaction at R events/s for D while the relay runs: commit → ack latency per event,
//!   from the row's `created_at` to the sink's acknowledgement.
//!
//! Both report events/s, latency percentiles (steady), the relay's CPU time and the peak RSS,
//! as a table or `--json`. The relay is the library's [`Relay`] with the configured
//! `[relay]` settings; the bench only wraps the source (to count settled deliveries) and the
//! sink (to timestamp acks), see [`probe`].

mod backlog;
mod events;
mod measure;
mod probe;
mod report;
mod steady;
mod target;

use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand, ValueEnum};
use outbox_runtime::Config;
use steady::Load;
use tokio_util::sync::CancellationToken;

/// `outbox bench` arguments.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    mode: BenchMode,
}

#[derive(Debug, Subcommand)]
enum BenchMode {
    /// Pre-fill N events, then drain them with the relay and measure the drain rate.
    Backlog {
        /// Events to pre-fill (the table must hold no pending event before).
        #[arg(long, value_name = "N")]
        events: NonZeroU64,
        #[command(flatten)]
        common: Common,
    },
    /// Produce at a fixed rate while the relay runs; measure commit -> ack latency per event.
    Steady {
        /// Events per second, all producers together.
        #[arg(long, value_name = "EVENTS_PER_SECOND", value_parser = parse_rate)]
        rate: f64,
        /// How long the producers run, e.g. `30s`.
        #[arg(long, value_parser = parse_positive_duration)]
        duration: Duration,
        /// Concurrent producer connections.
        #[arg(long, default_value = "4")]
        producers: NonZeroUsize,
        /// Events each producer transaction writes (one `enqueue_batch`). A rate above what
        /// the database can commit makes the producers run flat out: the machine's ceiling.
        #[arg(long, default_value = "1", value_name = "K")]
        per_transaction: NonZeroUsize,
        #[command(flatten)]
        common: Common,
    },
}

/// Options shared by both modes.
#[derive(Debug, Args)]
struct Common {
    /// `config`: the `[sink]` of the configuration; `null`: acknowledge at once, publish
    /// nowhere (the relay's own cost).
    #[arg(long, value_enum, default_value_t = SinkChoice::Config)]
    sink: SinkChoice,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Override `relay.batch_size`.
    #[arg(long)]
    batch_size: Option<NonZeroUsize>,
    /// Override `relay.workers` (PostgreSQL and MySQL polling; SQLite and CDC run one pipeline).
    #[arg(long)]
    workers: Option<NonZeroUsize>,
    /// Distinct aggregate ids, assigned round robin (`o_0`, `o_1`, ...).
    #[arg(long, default_value = "1000")]
    aggregates: NonZeroU32,
    /// Approximate payload size in bytes (a JSON object padded to this length).
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Give every event a W3C `traceparent` header, as a producer with tracing on would: with
    /// `[tracing]` set, the relay's spans are then children of it (docs/observability.md).
    #[arg(long)]
    traceparent: bool,
    /// Give up when the relay has not delivered every event this long after the backlog was
    /// written (backlog) or the producers stopped (steady).
    #[arg(long, default_value = "10m", value_parser = parse_positive_duration)]
    timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SinkChoice {
    Config,
    Null,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of events per second"))?;
    if !rate.is_finite() || rate <= 0.0 {
        return Err(format!("must be greater than 0, got `{s}`"));
    }
    Ok(rate)
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration like `30s` or `2m`: {e}"))?;
    if d.is_zero() {
        return Err("must be greater than 0".into());
    }
    Ok(d)
}

/// Runs `outbox bench` and prints its report.
pub(crate) async fn run(
    args: BenchArgs,
    config: Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (common, report) = match args.mode {
        BenchMode::Backlog { events, common } => {
            let report =
                backlog::run(&Bench::new(&config, &common, &shutdown), events.get()).await?;
            (common, report)
        }
        BenchMode::Steady {
            rate,
            duration,
            producers,
            per_transaction,
            common,
        } => {
            let load = Load {
                rate,
                duration,
                producers: producers.get(),
                per_transaction: per_transaction.get(),
            };
            let report = steady::run(&Bench::new(&config, &common, &shutdown), load).await?;
            (common, report)
        }
    };
    if common.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    if !report.interrupted && report.delivered < report.events {
        bail!(
            "only {} of {} events were delivered within --timeout {} (retried {}, dead-lettered {}); see the relay's log lines above",
            report.delivered,
            report.events,
            humantime::format_duration(common.timeout),
            report.retried,
            report.dead_lettered
        );
    }
    Ok(())
}

/// What every mode is given: the configuration, the options, the shutdown signal.
struct Bench<'a> {
    config: &'a Config,
    common: &'a Common,
    shutdown: &'a CancellationToken,
}

impl<'a> Bench<'a> {
    fn new(config: &'a Config, common: &'a Common, shutdown: &'a CancellationToken) -> Self {
        Self {
            config,
            common,
            shutdown,
        }
    }
}

#[cfg(test)]
mod tests;
