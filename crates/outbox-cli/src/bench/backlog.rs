//! `outbox bench backlog`: pre-fill N events through the producer library, then drain them
//! with the relay and measure the drain rate.

use std::time::Duration;

use outbox_core::NewEvent;
use tokio_util::sync::CancellationToken;

use super::Bench;
use super::events::bench_event;
use super::measure::{Setup, progress_bar, track, watch_stop};
use super::probe::Progress;
use super::report::BenchReport;

/// Runs the backlog mode: fill `events`, drain them.
pub(super) async fn run(bench: &Bench<'_>, events: u64) -> anyhow::Result<BenchReport> {
    let (config, common, shutdown) = (bench.config, bench.common, bench.shutdown);
    let setup = Setup::new(bench, false).await?;

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
        setup.target.fill(&chunk).await?;
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
    let running = setup.start(config, &progress, &stop)?;
    let measured = running
        .finish(&setup.target, written, common.timeout, Duration::ZERO)
        .await?;
    Ok(setup.report("backlog", written, &measured, &interrupted))
}
