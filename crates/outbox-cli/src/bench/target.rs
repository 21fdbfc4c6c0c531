//! The database under test: opened and migrated as `outbox migrate` would, filled with the
//! backlog, and read by the relay whose settled deliveries the bench counts.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use outbox_core::backend::{Backend, OpenOptions};
use outbox_core::trace::PublishTracer;
use outbox_core::{DynSink, NewEvent, Relay, RelayConfig, RelayReport, Source};
use outbox_runtime::SourceConfig;
use tokio_util::sync::CancellationToken;

use super::probe::{CountedSource, Progress, TimedSink};

/// The database the bench writes to and the relay reads from.
#[derive(Clone)]
pub(super) struct Target {
    backend: Arc<dyn Backend>,
}

impl Target {
    /// Connects and installs (or checks) the schema, as `outbox migrate` would.
    pub(super) async fn open(source: &SourceConfig, workers: usize) -> anyhow::Result<Self> {
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

    pub(super) fn label(&self) -> String {
        self.backend.label()
    }

    /// A lease or a replication slot: a single pipeline.
    pub(super) fn single_pipeline(&self) -> bool {
        self.backend.single_pipeline()
    }

    pub(super) fn table(&self) -> String {
        self.backend.table()
    }

    /// Pending events by row state (`None` for a stream, whose backlog is not row state).
    pub(super) async fn pending(&self) -> anyhow::Result<Option<u64>> {
        self.backend
            .pending()
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
            .with_context(|| format!("counting pending events in {}", self.table()))
    }

    /// Writes `events` in one statement where the database allows (else one transaction).
    pub(super) async fn fill(&self, events: &[NewEvent]) -> anyhow::Result<()> {
        self.backend
            .producer()?
            .fill(events)
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
            .with_context(|| format!("writing the backlog into {}", self.table()))
    }

    /// Runs the relay until `stop`, counting settled deliveries into `progress`; with
    /// `tracer`, a span per publish attempt (`[tracing]`).
    pub(super) async fn relay(
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
