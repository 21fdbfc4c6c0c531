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

mod probe;
mod report;

use std::io::IsTerminal as _;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use outbox_core::backend::{Backend, OpenOptions};
use outbox_core::trace::PublishTracer;
use outbox_core::{DynSink, NewEvent, Relay, RelayConfig, RelayReport, Source};
use outbox_runtime::{Config, SourceConfig};
use probe::{CountedSource, NullSink, Progress, TimedSink};
use report::{BenchReport, Latency, ProducerReport};
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
            let report = backlog(&config, &common, events.get(), &shutdown).await?;
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
            let report = steady(&config, &common, load, &shutdown).await?;
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

/// The database the bench writes to and the relay reads from.
#[derive(Clone)]
struct Target {
    backend: Arc<dyn Backend>,
}

impl Target {
    /// Connects and installs (or checks) the schema, as `outbox migrate` would.
    async fn open(source: &SourceConfig, workers: usize) -> anyhow::Result<Self> {
        let connections = u32::try_from(workers).unwrap_or(u32::MAX).saturating_add(2);
        let backend = source
            .open(OpenOptions { connections })
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
        backend
            .migrate()
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
            .with_context(|| format!("preparing outbox table {}", backend.table()))?;
        Ok(Self { backend })
    }

    fn label(&self) -> String {
        self.backend.label()
    }

    /// A lease or a replication slot: a single pipeline.
    fn single_pipeline(&self) -> bool {
        self.backend.single_pipeline()
    }

    fn table(&self) -> String {
        self.backend.table()
    }

    /// Pending events by row state (`None` for a stream, whose backlog is not row state).
    async fn pending(&self) -> anyhow::Result<Option<u64>> {
        self.backend
            .pending()
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
            .with_context(|| format!("counting pending events in {}", self.table()))
    }

    /// Writes `events` in one statement where the database allows (else one transaction).
    async fn fill(&self, events: &[NewEvent]) -> anyhow::Result<()> {
        self.backend
            .producer()?
            .fill(events)
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
            .with_context(|| format!("writing the backlog into {}", self.table()))
    }

    /// Runs the relay until `stop`, counting settled deliveries into `progress`; with
    /// `tracer`, a span per publish attempt (`[tracing]`).
    async fn relay(
        self,
        relay: RelayConfig,
        sink: Arc<TimedSink<Box<dyn DynSink>>>,
        progress: Arc<Progress>,
        stop: CancellationToken,
        tracer: Option<Arc<dyn PublishTracer>>,
    ) -> anyhow::Result<RelayReport> {
        let pipelines = self
            .backend
            .start_relay(&relay)
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
        let result = drive(relay, sink, pipelines.sources, progress, stop, tracer).await;
        if let Some(closed) = pipelines.closed {
            // Let the source send its final acknowledgement (see `outbox relay`).
            let _ = tokio::time::timeout(Duration::from_secs(5), closed).await;
        }
        result
    }
}

async fn drive<S: Source>(
    relay: RelayConfig,
    sink: Arc<TimedSink<Box<dyn DynSink>>>,
    sources: Vec<S>,
    progress: Arc<Progress>,
    stop: CancellationToken,
    tracer: Option<Arc<dyn PublishTracer>>,
) -> anyhow::Result<RelayReport> {
    let sources = sources
        .into_iter()
        .map(|s| CountedSource::new(s, progress.clone()))
        .collect();
    let mut relay = Relay::new(relay, sink);
    if let Some(tracer) = tracer {
        relay = relay.with_tracer(tracer);
    }
    relay
        .run(sources, stop)
        .await
        .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
        .context("the relay stopped")
}

/// The relay settings with the command line's overrides (one pipeline where only one can run).
fn relay_config(config: &Config, common: &Common, single_pipeline: bool) -> RelayConfig {
    let mut relay = config.relay.clone();
    if let Some(b) = common.batch_size {
        relay.batch_size = b;
    }
    if let Some(w) = common.workers {
        relay.workers = w;
    }
    if single_pipeline {
        relay.workers = NonZeroUsize::MIN;
    }
    relay
}

/// The sink to measure against, wrapped to timestamp acks.
async fn sink(
    config: &Config,
    choice: SinkChoice,
    record_latency: bool,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Arc<TimedSink<Box<dyn DynSink>>>>> {
    let inner: Box<dyn DynSink> = match choice {
        SinkChoice::Null => Box::new(NullSink),
        SinkChoice::Config => {
            if config.sink.kind() == "stdout" {
                bail!(
                    "the configured sink is `stdout`, which would print every event into the report; pass `--sink null` or configure a broker in [sink]"
                );
            }
            match outbox_runtime::relay::build_sink(&config.sink, shutdown).await? {
                Some(s) => s,
                None => return Ok(None),
            }
        }
    };
    // What the relay does to payloads first (schemas, encryption, claim-check), whatever the
    // sink: `--sink null` then measures that cost alone.
    let schemas = outbox_runtime::schemas::from_config(&config.payload)?;
    let stage =
        outbox_runtime::payload::PayloadStage::for_sink(&config.sink, &config.payload, schemas)
            .await
            .map_err(|e| anyhow::anyhow!("payload options: {}", e.report()))?;
    let inner = stage.wrap(inner);
    Ok(Some(Arc::new(TimedSink::new(inner, record_latency))))
}

/// Event `i` of a run: aggregate `o_{i % aggregates}`, a JSON payload of about `bytes` bytes.
fn event(i: u64, aggregates: u32, bytes: usize) -> NewEvent {
    let aggregate = format!("o_{}", i % u64::from(aggregates));
    let head = format!(r#"{{"order_id":"{aggregate}","n":{i},"pad":""#);
    let pad = bytes.saturating_sub(head.len() + 2);
    let mut payload = String::with_capacity(head.len() + pad + 2);
    payload.push_str(&head);
    payload.extend(std::iter::repeat_n('x', pad));
    payload.push_str("\"}");
    NewEvent::new("Order", aggregate, "order.placed", payload.into_bytes())
}

/// `event` with a `traceparent` naming a sampled producer span of its own: ids spread like
/// random ones (a ratio sampler reads the trace id's bits), derived from `i`.
fn with_traceparent(event: NewEvent, i: u64) -> NewEvent {
    // splitmix64: distinct inputs, well-spread outputs, never all zeros for these.
    let mix = |x: u64| {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (high, low) = (mix(2 * i), mix(2 * i + 1));
    let parent = outbox_core::trace::TraceParent {
        trace_id: (u128::from(high) << 64 | u128::from(low) | 1).to_be_bytes(),
        span_id: (mix(i) | 1).to_be_bytes(),
        flags: 1,
    };
    event.with_header(outbox_core::trace::TRACEPARENT, parent.to_string())
}

/// Event `i` of a run, with a `traceparent` when asked.
fn bench_event(i: u64, aggregates: u32, bytes: usize, traceparent: bool) -> NewEvent {
    let e = event(i, aggregates, bytes);
    if traceparent {
        with_traceparent(e, i)
    } else {
        e
    }
}

/// The relay's publish spans when `[tracing]` (or the environment) names an OTLP endpoint.
fn traces(config: &Config) -> anyhow::Result<Option<outbox_runtime::otlp::Tracing>> {
    Ok(outbox_runtime::otlp::Tracing::start(
        &config.tracing,
        &config.sink,
    )?)
}

fn progress_bar(len: Option<u64>, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
    let template =
        format!("{{spinner}} {what} {{pos}}/{{len}} {{wide_bar}} {{per_sec}} {{elapsed}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// Refuses a table that already holds pending events: they would be counted as the run's.
async fn require_empty(target: &Target) -> anyhow::Result<()> {
    if let Some(pending) = target.pending().await?
        && pending > 0
    {
        bail!(
            "outbox table {} already holds {pending} pending events; `outbox bench` needs an empty backlog: point it at a scratch database (or let a relay drain it first)",
            target.table()
        );
    }
    Ok(())
}

/// Moves the bar along with the settled count until `done`.
fn track(bar: ProgressBar, progress: Arc<Progress>, done: CancellationToken) {
    tokio::spawn(async move {
        loop {
            bar.set_position(progress.settled());
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                () = done.cancelled() => break,
            }
        }
        bar.set_position(progress.settled());
        bar.finish_and_clear();
    });
}

async fn backlog(
    config: &Config,
    common: &Common,
    events: u64,
    shutdown: &CancellationToken,
) -> anyhow::Result<BenchReport> {
    let workers = common
        .workers
        .map_or(config.relay.workers.get(), |w| w.get());
    let target = Target::open(&config.source, workers).await?;
    let relay = relay_config(config, common, target.single_pipeline());
    require_empty(&target).await?;
    let Some(sink) = sink(config, common.sink, false, shutdown).await? else {
        bail!("interrupted before the broker became reachable");
    };

    // The backlog, through the producer library.
    const CHUNK: u64 = 1000;
    let bar = progress_bar(Some(events), "writing backlog");
    let mut written = 0;
    while written < events && !shutdown.is_cancelled() {
        let n = CHUNK.min(events - written);
        let chunk: Vec<NewEvent> = (written..written + n)
            .map(|i| {
                bench_event(
                    i,
                    common.aggregates.get(),
                    common.payload_bytes,
                    common.traceparent,
                )
            })
            .collect();
        target.fill(&chunk).await?;
        written += n;
        bar.set_position(written);
    }
    bar.finish_and_clear();

    let progress = Progress::new();
    progress.set_target(written);
    let stop = CancellationToken::new();
    let interrupted = watch_stop(&progress, shutdown, &stop, None);
    track(
        progress_bar(Some(written), "delivered"),
        progress.clone(),
        stop.clone(),
    );

    let traces = traces(config)?;
    probe::reset_peak_rss();
    let cpu0 = probe::process_cpu();
    let t0 = Instant::now();
    let relay_task = tokio::spawn(target.clone().relay(
        relay.clone(),
        sink.clone(),
        progress.clone(),
        stop.clone(),
        traces.as_ref().map(|t| t.tracer()),
    ));
    wait_with_timeout(&progress, &stop, common.timeout).await;
    stop.cancel();
    let result = relay_task.await.context("the relay task failed")??;
    let cpu = probe::process_cpu().saturating_sub(cpu0);
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    let end = progress.reached_at().unwrap_or_else(Instant::now);
    let elapsed = end.saturating_duration_since(t0).as_secs_f64();

    let delivered = progress.settled();
    let pending_after = match target.pending().await? {
        Some(p) => p,
        None => written.saturating_sub(delivered),
    };
    Ok(BenchReport {
        mode: "backlog",
        source: target.label(),
        sink: outbox_core::Sink::name(&*sink),
        batch_size: relay.batch_size.get(),
        workers: relay.workers.get(),
        events: written,
        delivered,
        retried: result.retried,
        dead_lettered: result.dead_lettered,
        pending_after,
        elapsed_seconds: elapsed,
        events_per_second: rate(delivered, elapsed),
        producer: None,
        latency_ms: None,
        relay_cpu_seconds: cpu.as_secs_f64(),
        relay_cpu_us_per_event: per_event_us(cpu, delivered),
        peak_rss_mib: probe::peak_rss_bytes().map(|b| b as f64 / (1024.0 * 1024.0)),
        interrupted: interrupted.is_cancelled(),
    })
}

/// Stops the relay when the target is reached or on a signal; the returned token is
/// cancelled when it was a signal. `extra` also stops it (the producers failed).
fn watch_stop(
    progress: &Arc<Progress>,
    shutdown: &CancellationToken,
    stop: &CancellationToken,
    extra: Option<CancellationToken>,
) -> CancellationToken {
    let interrupted = CancellationToken::new();
    let (progress, shutdown, stop, flag) = (
        progress.clone(),
        shutdown.clone(),
        stop.clone(),
        interrupted.clone(),
    );
    let extra = extra.unwrap_or_default();
    tokio::spawn(async move {
        tokio::select! {
            () = progress.reached().cancelled() => {}
            () = shutdown.cancelled() => flag.cancel(),
            () = extra.cancelled() => {}
            () = stop.cancelled() => {}
        }
        stop.cancel();
    });
    interrupted
}

/// Waits for the relay to stop (target reached or signal) or for `timeout`.
async fn wait_with_timeout(progress: &Progress, stop: &CancellationToken, timeout: Duration) {
    tokio::select! {
        () = progress.reached().cancelled() => {}
        () = stop.cancelled() => {}
        () = tokio::time::sleep(timeout) => {}
    }
}

fn rate(n: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n as f64 / seconds
    } else {
        0.0
    }
}

fn per_event_us(cpu: Duration, events: u64) -> f64 {
    if events == 0 {
        0.0
    } else {
        cpu.as_secs_f64() * 1e6 / events as f64
    }
}

/// What the producer thread reports back.
struct Produced {
    events: u64,
    duration: Duration,
    cpu: Duration,
}

/// What the producers of a steady run do.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// Events per second, all producers together.
    rate: f64,
    /// How long they produce.
    duration: Duration,
    /// Concurrent producer connections.
    producers: usize,
    /// Events per transaction.
    per_transaction: usize,
}

async fn steady(
    config: &Config,
    common: &Common,
    load: Load,
    shutdown: &CancellationToken,
) -> anyhow::Result<BenchReport> {
    let workers = common
        .workers
        .map_or(config.relay.workers.get(), |w| w.get());
    let target = Target::open(&config.source, workers).await?;
    let relay = relay_config(config, common, target.single_pipeline());
    require_empty(&target).await?;
    let Some(sink) = sink(config, common.sink, true, shutdown).await? else {
        bail!("interrupted before the broker became reachable");
    };

    let progress = Progress::new();
    let stop = CancellationToken::new();
    let producers_failed = CancellationToken::new();
    let interrupted = watch_stop(&progress, shutdown, &stop, Some(producers_failed.clone()));
    track(
        progress_bar(None, "delivered"),
        progress.clone(),
        stop.clone(),
    );

    let traces = traces(config)?;
    probe::reset_peak_rss();
    let cpu0 = probe::process_cpu();
    // The relay first, idle on the empty table, as a deployed relay would be.
    let relay_task = tokio::spawn(target.clone().relay(
        relay.clone(),
        sink.clone(),
        progress.clone(),
        stop.clone(),
        traces.as_ref().map(|t| t.tracer()),
    ));
    let t0 = Instant::now();
    let produced = produce(config.source.clone(), common, load, shutdown.clone()).await;
    let produced = match produced {
        Ok(p) => p,
        Err(e) => {
            producers_failed.cancel();
            let _ = relay_task.await;
            return Err(e);
        }
    };
    progress.set_target(produced.events);
    wait_with_timeout(&progress, &stop, common.timeout).await;
    stop.cancel();
    let result = relay_task.await.context("the relay task failed")??;
    let cpu = probe::process_cpu()
        .saturating_sub(cpu0)
        .saturating_sub(produced.cpu);
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    let end = progress.reached_at().unwrap_or_else(Instant::now);
    let elapsed = end.saturating_duration_since(t0).as_secs_f64();
    let delivered = progress.settled();
    let pending_after = match target.pending().await? {
        Some(p) => p,
        None => produced.events.saturating_sub(delivered),
    };
    Ok(BenchReport {
        mode: "steady",
        source: target.label(),
        sink: outbox_core::Sink::name(&*sink),
        batch_size: relay.batch_size.get(),
        workers: relay.workers.get(),
        events: produced.events,
        delivered,
        retried: result.retried,
        dead_lettered: result.dead_lettered,
        pending_after,
        elapsed_seconds: elapsed,
        events_per_second: rate(delivered, elapsed),
        producer: Some(ProducerReport {
            producers: load.producers,
            events_per_transaction: load.per_transaction,
            target_rate: load.rate,
            achieved_rate: rate(produced.events, produced.duration.as_secs_f64()),
            duration_seconds: produced.duration.as_secs_f64(),
            cpu_seconds: produced.cpu.as_secs_f64(),
        }),
        latency_ms: Latency::from_micros(sink.take_latencies()),
        relay_cpu_seconds: cpu.as_secs_f64(),
        relay_cpu_us_per_event: per_event_us(cpu, delivered),
        peak_rss_mib: probe::peak_rss_bytes().map(|b| b as f64 / (1024.0 * 1024.0)),
        interrupted: interrupted.is_cancelled(),
    })
}

/// Runs the producers on a thread of their own (a single-threaded runtime with its own pool),
/// so their CPU time can be told apart from the relay's: `producers` tasks, each committing
/// one event per transaction on a fixed schedule, `rate / producers` per second each.
async fn produce(
    source: SourceConfig,
    common: &Common,
    load: Load,
    shutdown: CancellationToken,
) -> anyhow::Result<Produced> {
    let (aggregates, bytes, traced) = (
        common.aggregates.get(),
        common.payload_bytes,
        common.traceparent,
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-producers".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the producers' runtime")
                .and_then(|rt| {
                    rt.block_on(producer_loop(
                        source, aggregates, bytes, traced, load, shutdown,
                    ))
                })
                .map(|(events, duration)| Produced {
                    events,
                    duration,
                    cpu: probe::thread_cpu(),
                });
            let _ = tx.send(result);
        })
        .context("starting the producer thread")?;
    rx.await.context("the producer thread died")?
}

async fn producer_loop(
    source: SourceConfig,
    aggregates: u32,
    bytes: usize,
    traced: bool,
    load: Load,
    shutdown: CancellationToken,
) -> anyhow::Result<(u64, Duration)> {
    let Load {
        rate,
        duration,
        producers,
        per_transaction,
    } = load;
    let writer = source
        .open(OpenOptions {
            connections: u32::try_from(producers).unwrap_or(u32::MAX),
        })
        .await
        .map_err(|e| anyhow::anyhow!("producers: {}", crate::chain(&e)))?;
    writer.producer()?;
    let period = Duration::from_secs_f64((producers * per_transaction) as f64 / rate);
    let start = tokio::time::Instant::now();
    let deadline = start + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..producers {
        let (writer, shutdown) = (writer.clone(), shutdown.clone());
        tasks.spawn(async move {
            // Staggered, so the producers do not commit in lockstep.
            let first = start + period.mul_f64(p as f64 / producers as f64);
            let mut ticks = tokio::time::interval_at(first, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut n: u64 = 0;
            loop {
                tokio::select! {
                    // The wall clock, not the tick's schedule: a producer that fell behind stops at
                    // the deadline instead of catching up past it.
                    _ = ticks.tick() => if tokio::time::Instant::now() >= deadline { break },
                    () = shutdown.cancelled() => break,
                }
                let events: Vec<_> = (0..per_transaction as u64)
                    .map(|i| {
                        let i = (n + i) * producers as u64 + p as u64;
                        bench_event(i, aggregates, bytes, traced)
                    })
                    .collect();
                writer
                    .producer()?
                    .commit(&events)
                    .await
                    .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
                n += per_transaction as u64;
            }
            anyhow::Ok(n)
        });
    }
    let mut total = 0;
    while let Some(joined) = tasks.join_next().await {
        total += joined
            .context("a producer task panicked")?
            .context("a producer failed")?;
    }
    Ok((total, start.elapsed()))
}

#[cfg(test)]
mod tests;
