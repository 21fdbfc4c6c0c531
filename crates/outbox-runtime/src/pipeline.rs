//! One pipeline's delivery, shared by the plain relay ([`crate::relay`]), the fan-out and
//! each subscription ([`crate::subscription`]): the sink with its payload stage, the watch
//! beside the relay, and what happens after it stopped. It sits below both, so neither
//! imports the other for it.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::backend::{BoxedSource, Pipelines};
use outbox_core::sink::BoxFuture;
use outbox_core::{DynSink, Relay, RelayReport};
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::config::Config;
use crate::console::Console;
use crate::observe::{self, Readiness};
use crate::sink::build_sink;

/// A pipeline's sink: built from `sink` (waiting for its broker, see [`build_sink`]) and
/// wrapped in its payload stage; `None` when `shutdown` came first. A subscription's errors
/// name it (`subscription`); the plain relay's payload errors name the sink's kind.
pub(crate) async fn staged_sink(
    config: &Config,
    sink: &crate::registry::SinkConfig,
    subscription: Option<&str>,
    schemas: Option<Arc<crate::schemas::Schemas>>,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<Box<dyn DynSink>>>, RuntimeError> {
    let built = build_sink(sink, shutdown)
        .await
        .map_err(|e| match subscription {
            Some(name) => RuntimeError::Sink(format!("subscription `{name}`: {e}")),
            None => e,
        })?;
    let Some(built) = built else {
        return Ok(None);
    };
    let stage = crate::payload::PayloadStage::for_sink(sink, &config.payload, schemas)
        .await
        .map_err(|e| {
            let what = match subscription {
                Some(name) => format!("subscription `{name}`"),
                None => format!("sink `{}`", sink.kind()),
            };
            RuntimeError::Sink(format!("{what}: {}", e.report()))
        })?;
    Ok(Some(Arc::new(stage.wrap(built))))
}

/// What watches one pipeline beside its relay (see [`observe::watch_labeled`]): the plain
/// relay's, the fan-out's, and each subscription's.
pub(crate) struct Watched {
    inspector: Arc<dyn outbox_core::backend::DynInspect>,
    watchdog: Option<Arc<dyn outbox_core::backend::Watchdog>>,
    readiness: Arc<Readiness>,
    /// The console, fed by the outbox's own pipeline only.
    console: Option<Arc<Console>>,
    /// The `subscription` label of a subscription's pipeline.
    subscription: Option<String>,
}

impl Watched {
    /// The watch over `pipelines`, whose sources and `closed` are returned beside it.
    pub(crate) fn new(
        pipelines: Pipelines,
        readiness: Arc<Readiness>,
        console: Option<Arc<Console>>,
        subscription: Option<String>,
    ) -> (Self, Vec<BoxedSource>, Option<BoxFuture<'static, ()>>) {
        let Pipelines {
            sources,
            inspector,
            watchdog,
            closed,
        } = pipelines;
        let watched = Self {
            inspector,
            watchdog,
            readiness,
            console,
            subscription,
        };
        (watched, sources, closed)
    }

    /// Runs `relay` over `sources` until `shutdown`, with the watchdog (over `sink` too)
    /// beside it; then cancels `shutdown`, so the pipeline's other tasks stop too, and waits
    /// for the watchdog.
    pub(crate) async fn run<S: outbox_core::Source>(
        self,
        config: &Config,
        relay: Relay<Box<dyn DynSink>>,
        sink: Arc<Box<dyn DynSink>>,
        sources: Vec<S>,
        shutdown: &CancellationToken,
    ) -> Result<RelayReport, outbox_core::RelayError> {
        let watcher = tokio::spawn(observe::watch_labeled(
            self.inspector,
            self.watchdog,
            sink,
            config.metrics.clone(),
            self.readiness,
            self.console,
            self.subscription,
            shutdown.clone(),
        ));
        let result = relay.run(sources, shutdown.clone()).await;
        shutdown.cancel();
        drop(relay);
        let _ = watcher.await;
        result
    }
}

/// After the relay stopped: flushes the publish spans, and waits (5 s at most) for the
/// pipelines' `closed`, e.g. the final standby status update, so a slot does not replay the
/// last batch.
pub(crate) async fn close(
    traces: Option<crate::otlp::Tracing>,
    closed: Option<BoxFuture<'static, ()>>,
) {
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    if let Some(closed) = closed {
        let _ = tokio::time::timeout(Duration::from_secs(5), closed).await;
    }
}

/// The last line of a relay that drained.
pub(crate) fn log_drained(report: &RelayReport) {
    tracing::info!(
        delivered = report.delivered,
        retried = report.retried,
        dead_lettered = report.dead_lettered,
        "relay stopped after draining"
    );
}
