//! `outbox bench steady`: producers commit at a fixed rate while the relay runs; commit ->
//! ack latency per event. The producers run on a thread of their own, so their CPU time is
//! told apart from the relay's.

use std::time::Duration;

use anyhow::Context;
use outbox_core::backend::OpenOptions;
use outbox_runtime::SourceConfig;
use tokio_util::sync::CancellationToken;

use super::events::bench_event;
use super::measure::{Setup, progress_bar, rate, track, watch_stop};
use super::probe::{self, Progress};
use super::report::{BenchReport, Latency, ProducerReport};
use super::{Bench, Common};

/// What the producer thread reports back.
struct Produced {
    events: u64,
    duration: Duration,
    cpu: Duration,
}

/// What the producers of a steady run do.
#[derive(Debug, Clone, Copy)]
pub(super) struct Load {
    /// Events per second, all producers together.
    pub(super) rate: f64,
    /// How long they produce.
    pub(super) duration: Duration,
    /// Concurrent producer connections.
    pub(super) producers: usize,
    /// Events per transaction.
    pub(super) per_transaction: usize,
}

/// Runs the steady mode: the relay idle on the empty table, then the producers' `load`.
pub(super) async fn run(bench: &Bench<'_>, load: Load) -> anyhow::Result<BenchReport> {
    let (config, common, shutdown) = (bench.config, bench.common, bench.shutdown);
    let setup = Setup::new(bench, true).await?;
    let progress = Progress::new();
    let stop = CancellationToken::new();
    let producers_failed = CancellationToken::new();
    let interrupted = watch_stop(&progress, shutdown, &stop, Some(producers_failed.clone()));
    track(
        progress_bar(None, "delivered"),
        progress.clone(),
        stop.clone(),
    );
    // The relay first, idle on the empty table, as a deployed relay would be.
    let running = setup.start(config, &progress, &stop)?;
    let produced = produce(config.source.clone(), common, load, shutdown.clone()).await;
    let produced = match produced {
        Ok(p) => p,
        Err(e) => {
            producers_failed.cancel();
            running.abandon().await;
            return Err(e);
        }
    };
    progress.set_target(produced.events);
    let measured = running
        .finish(&setup.target, produced.events, common.timeout, produced.cpu)
        .await?;
    let mut report = setup.report("steady", produced.events, &measured, &interrupted);
    report.producer = Some(ProducerReport {
        producers: load.producers,
        events_per_transaction: load.per_transaction,
        target_rate: load.rate,
        achieved_rate: rate(produced.events, produced.duration.as_secs_f64()),
        duration_seconds: produced.duration.as_secs_f64(),
        cpu_seconds: produced.cpu.as_secs_f64(),
    });
    report.latency_ms = Latency::from_micros(setup.sink.take_latencies());
    Ok(report)
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
