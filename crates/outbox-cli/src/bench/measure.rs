//! What both modes share around the relay they measure: the setup (the target, the relay
//! settings with the command line's overrides, the sink), the measured run (CPU time, peak
//! RSS, spans, progress, stop on target, signal or timeout), and the report's common part.

use std::io::IsTerminal as _;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use outbox_core::{DynSink, RelayConfig, RelayReport};
use outbox_runtime::Config;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::probe::{self, NullSink, Progress, TimedSink};
use super::report::BenchReport;
use super::target::Target;
use super::{Bench, Common, SinkChoice};

/// The target, the relay settings and the sink of a run, checked before anything is written.
pub(super) struct Setup {
    pub(super) target: Target,
    pub(super) relay: RelayConfig,
    pub(super) sink: Arc<TimedSink<Box<dyn DynSink>>>,
}

impl Setup {
    /// Opens the target (refusing one with pending events) and builds the sink, timing
    /// each ack when `record_latency`.
    pub(super) async fn new(bench: &Bench<'_>, record_latency: bool) -> anyhow::Result<Self> {
        let (config, common, shutdown) = (bench.config, bench.common, bench.shutdown);
        let workers = common
            .workers
            .map_or(config.relay.workers.get(), |w| w.get());
        let target = Target::open(&config.source, workers).await?;
        let relay = relay_config(config, common, target.single_pipeline());
        require_empty(&target).await?;
        let Some(sink) = sink(config, common.sink, record_latency, shutdown).await? else {
            bail!("interrupted before the broker became reachable");
        };
        Ok(Self {
            target,
            relay,
            sink,
        })
    }

    /// Starts the relay under measurement (its spans, CPU time and peak RSS from here),
    /// counting settled deliveries into `progress` until `stop`.
    pub(super) fn start(
        &self,
        config: &Config,
        progress: &Arc<Progress>,
        stop: &CancellationToken,
    ) -> anyhow::Result<Running> {
        let traces = traces(config)?;
        probe::reset_peak_rss();
        let cpu0 = probe::process_cpu();
        let t0 = Instant::now();
        let task = tokio::spawn(self.target.clone().relay(
            self.relay.clone(),
            self.sink.clone(),
            progress.clone(),
            stop.clone(),
            traces.as_ref().map(|t| t.tracer()),
        ));
        Ok(Running {
            task,
            traces,
            cpu0,
            t0,
            progress: progress.clone(),
            stop: stop.clone(),
        })
    }

    /// The report's common part; the mode adds its producers and latencies.
    pub(super) fn report(
        &self,
        mode: &'static str,
        events: u64,
        measured: &Measured,
        interrupted: &CancellationToken,
    ) -> BenchReport {
        let Measured {
            relay,
            cpu,
            elapsed,
            delivered,
            pending_after,
        } = measured;
        BenchReport {
            mode,
            source: self.target.label(),
            sink: outbox_core::Sink::name(&*self.sink),
            batch_size: self.relay.batch_size.get(),
            workers: self.relay.workers.get(),
            events,
            delivered: *delivered,
            retried: relay.retried,
            dead_lettered: relay.dead_lettered,
            pending_after: *pending_after,
            elapsed_seconds: *elapsed,
            events_per_second: rate(*delivered, *elapsed),
            producer: None,
            latency_ms: None,
            relay_cpu_seconds: cpu.as_secs_f64(),
            relay_cpu_us_per_event: per_event_us(*cpu, *delivered),
            peak_rss_mib: probe::peak_rss_bytes().map(|b| b as f64 / (1024.0 * 1024.0)),
            interrupted: interrupted.is_cancelled(),
        }
    }
}

/// The relay under measurement.
pub(super) struct Running {
    task: JoinHandle<anyhow::Result<RelayReport>>,
    traces: Option<outbox_runtime::otlp::Tracing>,
    cpu0: Duration,
    t0: Instant,
    progress: Arc<Progress>,
    stop: CancellationToken,
}

/// What the relay did in a measured run.
pub(super) struct Measured {
    relay: RelayReport,
    cpu: Duration,
    elapsed: f64,
    delivered: u64,
    pending_after: u64,
}

impl Running {
    /// Stops the relay without measuring it (the producers failed).
    pub(super) async fn abandon(self) {
        let _ = self.task.await;
    }

    /// Waits for the target (or a signal, or `timeout`), stops the relay and measures it:
    /// its CPU time less `other_cpu` (the producers'), the time to the last settled event,
    /// and what is left of the `events` written.
    pub(super) async fn finish(
        self,
        target: &Target,
        events: u64,
        timeout: Duration,
        other_cpu: Duration,
    ) -> anyhow::Result<Measured> {
        wait_with_timeout(&self.progress, &self.stop, timeout).await;
        self.stop.cancel();
        let relay = self.task.await.context("the relay task failed")??;
        let cpu = probe::process_cpu()
            .saturating_sub(self.cpu0)
            .saturating_sub(other_cpu);
        if let Some(traces) = self.traces {
            traces.shutdown().await;
        }
        let end = self.progress.reached_at().unwrap_or_else(Instant::now);
        let elapsed = end.saturating_duration_since(self.t0).as_secs_f64();
        let delivered = self.progress.settled();
        let pending_after = match target.pending().await? {
            Some(p) => p,
            None => events.saturating_sub(delivered),
        };
        Ok(Measured {
            relay,
            cpu,
            elapsed,
            delivered,
            pending_after,
        })
    }
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

/// The relay's publish spans when `[tracing]` (or the environment) names an OTLP endpoint.
fn traces(config: &Config) -> anyhow::Result<Option<outbox_runtime::otlp::Tracing>> {
    Ok(outbox_runtime::otlp::Tracing::start(
        &config.tracing,
        &config.sink,
    )?)
}

pub(super) fn progress_bar(len: Option<u64>, what: &str) -> ProgressBar {
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
pub(super) fn track(bar: ProgressBar, progress: Arc<Progress>, done: CancellationToken) {
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

/// Stops the relay when the target is reached or on a signal; the returned token is
/// cancelled when it was a signal. `extra` also stops it (the producers failed).
pub(super) fn watch_stop(
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

pub(super) fn rate(n: u64, seconds: f64) -> f64 {
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
