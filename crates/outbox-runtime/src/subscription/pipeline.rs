//! One subscription's own pipeline: its table opened and its relay pipelines started before
//! anything is delivered ([`start_all`]), then, in a task of its own, its sink, watchdog and
//! relay over its gated sources ([`Started::deliver`]).

use std::sync::Arc;

use outbox_core::backend::{Backend, OpenOptions, Pipelines};
use outbox_core::relay::ErrorChain;
use outbox_core::trace::PublishTracer;
use outbox_core::{Relay, RelayReport};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Resolved, gate};
use crate::RuntimeError;
use crate::config::Config;
use crate::observe::Readiness;
use crate::pipeline::{Watched, staged_sink};

/// A subscription whose table is open and whose pipelines are started.
pub(super) struct Started {
    pub(super) sub: Resolved,
    pipelines: Pipelines,
    /// Woken by the fan-out after each copy into the subscription's table.
    pub(super) wake: Arc<Notify>,
}

/// What every subscription's task shares with the fan-out.
pub(super) struct Shared {
    pub(super) config: Config,
    pub(super) schemas: Option<Arc<crate::schemas::Schemas>>,
    pub(super) readiness: Arc<Readiness>,
    pub(super) tracer: Option<Arc<dyn PublishTracer>>,
    /// The outbox's own backend, whose catalog gates each claim.
    pub(super) outbox: Arc<dyn Backend>,
    pub(super) shutdown: CancellationToken,
}

/// Opens every subscription's table and starts its pipelines (and its retention schedule):
/// all of them, or an error before any delivers.
pub(super) async fn start_all(
    config: &Config,
    subscriptions: Vec<Resolved>,
    shutdown: &CancellationToken,
) -> Result<Vec<Started>, RuntimeError> {
    let connections = u32::try_from(config.relay.workers.get())
        .unwrap_or(u32::MAX)
        .saturating_add(2);
    let mut started = Vec::with_capacity(subscriptions.len());
    for sub in subscriptions {
        let backend = sub
            .source
            .open(OpenOptions { connections })
            .await
            .map_err(RuntimeError::Open)?;
        backend
            .forward()
            .map_err(|e| RuntimeError::Config(crate::ConfigError::new(e.to_string())))?;
        let pipelines = backend
            .start_relay(&config.relay)
            .await
            .map_err(RuntimeError::Source)?;
        // Each subscription's delivered rows are removed by the same schedule as the outbox's.
        crate::retention::spawn(&config.retention, backend.clone(), shutdown.clone());
        tracing::info!(subscription = %sub.name, table = %backend.table(), sink = sub.sink.kind(), "subscription ready");
        started.push(Started {
            sub,
            pipelines,
            wake: Arc::new(Notify::new()),
        });
    }
    Ok(started)
}

impl Started {
    /// Delivers the subscription's table to its sink until `shutdown`. A sink that can never
    /// be built stops the whole relay, as with `[sink]`; so does the end of this pipeline.
    pub(super) async fn deliver(self, shared: Shared) -> Result<RelayReport, RuntimeError> {
        let Shared {
            config,
            schemas,
            readiness,
            tracer,
            outbox,
            shutdown,
        } = shared;
        let Self {
            sub,
            pipelines,
            wake,
        } = self;
        let sink = staged_sink(&config, &sub.sink, Some(&sub.name), schemas, &shutdown)
            .await
            .inspect_err(|_| shutdown.cancel())?;
        let Some(sink) = sink else {
            return Ok(RelayReport::default());
        };
        let mut relay = Relay::new(config.relay.clone(), sink.clone())
            .with_metric_label("subscription", sub.name.clone());
        if let Some(tracer) = tracer {
            relay = relay.with_tracer(tracer);
        }
        let label = Some(sub.name.clone());
        let (watched, sources, _) = Watched::new(pipelines, readiness, None, label);
        let sources: Vec<gate::Gated> = sources
            .into_iter()
            .map(|inner| gate::Gated::new(inner, wake.clone(), outbox.clone(), sub.name.clone()))
            .collect();
        let result = watched.run(&config, relay, sink, sources, &shutdown).await;
        result.map_err(|e| {
            RuntimeError::Relay(format!("subscription `{}`: {}", sub.name, ErrorChain(&e)))
        })
    }
}
