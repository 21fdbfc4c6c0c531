//! Running the relay under test: the relay config the checks use ([`test_relay_config`]), a
//! relay on a background task ([`RunningRelay`]), and [`start_relay`], which starts one over
//! fresh sources of a [`Harness`].

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use outbox_core::policy::Backoff;
use outbox_core::{DeadLetterPolicy, Ordering, Relay, RelayConfig, RelayReport, Source};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Harness;
use crate::faults::ScriptedSink;

/// How long a check waits for the broker to see what it expects, and for a relay to stop.
pub(super) const WAIT: Duration = Duration::from_secs(30);

/// A relay config for tests: small batches (so batches interleave), fast backoff.
pub fn test_relay_config(
    ordering: Ordering,
    dead_letter: DeadLetterPolicy,
    max_attempts: u32,
) -> RelayConfig {
    RelayConfig {
        ordering,
        dead_letter,
        batch_size: NonZeroUsize::new(16).expect("nonzero"),
        max_attempts: NonZeroU32::new(max_attempts).expect("nonzero"),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
        },
        poll_interval: Duration::from_millis(2),
        idle_interval: Duration::from_millis(20),
        publish_timeout: Duration::from_secs(5),
        source_timeout: Duration::from_secs(60),
        workers: NonZeroUsize::new(1).expect("nonzero"),
    }
}

/// A relay running in the background over `sources`.
pub struct RunningRelay {
    pub(super) shutdown: CancellationToken,
    pub(super) handle: JoinHandle<Result<RelayReport, outbox_core::RelayError>>,
}

impl RunningRelay {
    /// Starts `Relay::run` on a task.
    pub fn start<S: Source>(config: RelayConfig, sink: Arc<ScriptedSink>, sources: Vec<S>) -> Self {
        let shutdown = CancellationToken::new();
        let relay = Relay::new(config, sink);
        let token = shutdown.clone();
        let handle = tokio::spawn(async move { relay.run(sources, token).await });
        Self { shutdown, handle }
    }

    /// Asks the relay to stop, waits for it to drain, and returns its report.
    pub async fn stop(self) -> anyhow::Result<RelayReport> {
        self.shutdown.cancel();
        let report = tokio::time::timeout(WAIT, self.handle)
            .await
            .context("relay did not stop")??;
        Ok(report?)
    }
}

/// Starts the relay over `replicas` fresh sources of `h` with per-aggregate ordering,
/// `dead_letter` and `max_attempts` ([`test_relay_config`]), publishing to `sink`.
pub(super) async fn start_relay<H: Harness>(
    h: &H,
    sink: &Arc<ScriptedSink>,
    replicas: usize,
    dead_letter: DeadLetterPolicy,
    max_attempts: u32,
) -> anyhow::Result<RunningRelay> {
    let sources = sources(h, replicas, Ordering::PerAggregate, dead_letter).await?;
    Ok(RunningRelay::start(
        test_relay_config(Ordering::PerAggregate, dead_letter, max_attempts),
        sink.clone(),
        sources,
    ))
}

async fn sources<H: Harness>(
    h: &H,
    n: usize,
    ordering: Ordering,
    dead_letter: DeadLetterPolicy,
) -> anyhow::Result<Vec<H::Source>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(h.source(ordering, dead_letter).await?);
    }
    Ok(out)
}
