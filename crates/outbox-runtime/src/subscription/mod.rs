//! `[sinks.NAME]` and `[[subscription]]`: one outbox fanned out to several destinations, each
//! with its own progress.
//!
//! How it works (`docs/subscriptions.md`): the outbox table's pipeline (polling or CDC) does
//! not publish to a broker. Its sink is the [`FanOut`]: for each batch it copies every event
//! into the table of each subscription whose filter matches, one statement per subscription,
//! and only then marks the outbox rows done. Each subscription's table is an ordinary outbox
//! table (`<table>_sub_<name>`, created by `outbox migrate`) with its own polling pipeline,
//! sink, retries, backoff, dead letters, metrics (`subscription="<name>"`) and `status`
//! line. So a subscription whose broker is down holds back only its own table; the others,
//! and the fan-out, go on.
//!
//! Order: the fan-out claims an aggregate's next event only after the previous one was
//! copied (the outbox pipeline's per-aggregate claim), and copies a batch in claim order, so
//! each subscription table receives an aggregate's events in commit order and its ordering
//! trigger numbers them that way. Every subscription pipeline then keeps per-aggregate order
//! like any outbox, across replicas. Copies keep the event id: a batch copied again after a
//! crash adds nothing (the id is already there).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::backend::{Backend, OpenOptions, Pipelines};
use outbox_core::relay::ErrorChain;
use outbox_core::{DynSink, Ordering, Relay, RelayReport};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::config::Config;
use crate::console::Console;
use crate::observe::{self, Readiness};

pub use crate::config::subscription::{Filter, Patterns, Resolved, SubscriptionConfig};
pub use fanout::FanOut;

mod fanout;
mod gate;

/// Checks `[sinks.*]` and `[[subscription]]` and resolves each subscription (see
/// [`Config::resolve_subscriptions`]).
pub fn resolve(config: &Config) -> Result<Vec<Resolved>, String> {
    config.resolve_subscriptions()
}

/// Runs the fan-out over the outbox's `pipelines` and one relay per subscription, until
/// `shutdown`; returns the subscriptions' combined report.
pub(crate) async fn run(
    config: Config,
    subscriptions: Vec<Resolved>,
    pipelines: Pipelines,
    schemas: Option<Arc<crate::schemas::Schemas>>,
    readiness: Arc<Readiness>,
    console: Option<Arc<Console>>,
    shutdown: CancellationToken,
) -> Result<RelayReport, RuntimeError> {
    let connections = u32::try_from(config.relay.workers.get())
        .unwrap_or(u32::MAX)
        .saturating_add(2);
    // The catalog's own small pool: read once per fan-out batch and per subscription claim.
    let outbox = config
        .source
        .open(OpenOptions { connections: 2 })
        .await
        .map_err(RuntimeError::Open)?;
    check_catalogued(&*outbox, &subscriptions).await?;
    let mut wakes = HashMap::with_capacity(subscriptions.len());
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
        let sub_pipelines = backend
            .start_relay(&config.relay)
            .await
            .map_err(RuntimeError::Source)?;
        // Each subscription's delivered rows are removed by the same schedule as the outbox's.
        crate::retention::spawn(&config.retention, backend.clone(), shutdown.clone());
        let wake = Arc::new(Notify::new());
        wakes.insert(sub.name.clone(), wake.clone());
        tracing::info!(subscription = %sub.name, table = %backend.table(), sink = sub.sink.kind(), "subscription ready");
        started.push((sub, sub_pipelines, wake));
    }
    let traces = crate::otlp::Tracing::start(&config.tracing, &config.sink)?;
    let mut tasks = tokio::task::JoinSet::new();
    for (sub, sub_pipelines, wake) in started {
        let config = config.clone();
        let shutdown = shutdown.clone();
        let readiness = readiness.clone();
        readiness.expect_sink(&sub.name);
        let tracer = traces.as_ref().map(|t| t.tracer());
        let schemas = schemas.clone();
        let outbox = outbox.clone();
        tasks.spawn(async move {
            let Pipelines {
                sources,
                inspector,
                watchdog,
                closed: _,
            } = sub_pipelines;
            let sink = match crate::sink::build_sink(&sub.sink, &shutdown).await {
                Ok(Some(sink)) => sink,
                Ok(None) => return Ok(RelayReport::default()),
                Err(e) => {
                    // A sink that can never be built stops the whole relay, as with `[sink]`.
                    shutdown.cancel();
                    return Err(RuntimeError::Sink(format!(
                        "subscription `{}`: {e}",
                        sub.name
                    )));
                }
            };
            let stage =
                match crate::payload::PayloadStage::for_sink(&sub.sink, &config.payload, schemas)
                    .await
                {
                    Ok(stage) => stage,
                    Err(e) => {
                        shutdown.cancel();
                        return Err(RuntimeError::Sink(format!(
                            "subscription `{}`: {}",
                            sub.name,
                            e.report()
                        )));
                    }
                };
            let sink = Arc::new(stage.wrap(sink));
            let watcher = tokio::spawn(observe::watch_labeled(
                inspector,
                watchdog,
                sink.clone(),
                config.metrics.clone(),
                readiness,
                None,
                Some(sub.name.clone()),
                shutdown.clone(),
            ));
            let mut relay = Relay::new(config.relay.clone(), sink)
                .with_metric_label("subscription", sub.name.clone());
            if let Some(tracer) = tracer {
                relay = relay.with_tracer(tracer);
            }
            let sources: Vec<gate::Gated> = sources
                .into_iter()
                .map(|inner| {
                    gate::Gated::new(inner, wake.clone(), outbox.clone(), sub.name.clone())
                })
                .collect();
            let result = relay.run(sources, shutdown.clone()).await;
            shutdown.cancel();
            let _ = watcher.await;
            result.map_err(|e| {
                RuntimeError::Relay(format!("subscription `{}`: {}", sub.name, ErrorChain(&e)))
            })
        });
    }
    // The fan-out publishes a claimed batch in one copy per subscription (claim order is
    // commit order within each aggregate), so it needs no waves of its own.
    let mut fanout_relay = config.relay.clone();
    fanout_relay.ordering = Ordering::None;
    let Pipelines {
        sources,
        inspector,
        watchdog,
        closed,
    } = pipelines;
    let fanout: Arc<Box<dyn DynSink>> =
        Arc::new(Box::new(FanOut::new(outbox, config.source.clone(), wakes)));
    let watcher = tokio::spawn(observe::watch_labeled(
        inspector,
        watchdog,
        fanout.clone(),
        config.metrics.clone(),
        readiness,
        console,
        None,
        shutdown.clone(),
    ));
    let relay = Relay::new(fanout_relay, fanout);
    let fanned = relay.run(sources, shutdown.clone()).await;
    shutdown.cancel();
    let mut report = RelayReport::default();
    let mut first_err = fanned
        .map_err(|e| RuntimeError::Relay(format!("fan-out: {}", ErrorChain(&e))))
        .err();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(r)) => report += r,
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(RuntimeError::Relay(format!(
                    "a subscription task failed: {e}"
                )));
            }
        }
    }
    let _ = watcher.await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    if let Some(closed) = closed {
        let _ = tokio::time::timeout(Duration::from_secs(5), closed).await;
    }
    match first_err {
        Some(e) => Err(e),
        None => {
            tracing::info!(
                delivered = report.delivered,
                retried = report.retried,
                dead_lettered = report.dead_lettered,
                "relay stopped after draining"
            );
            Ok(report)
        }
    }
}

/// Refuses to start a subscription of the file that `outbox migrate` has not recorded: the
/// fan-out copies only into catalogued subscriptions, so its pipeline would wait for
/// nothing. Logs the catalogued ones this file lacks (copied into, not delivered here).
async fn check_catalogued(
    outbox: &dyn Backend,
    subscriptions: &[Resolved],
) -> Result<(), RuntimeError> {
    let catalogued = crate::catalog::read(outbox)
        .await
        .map_err(|e| RuntimeError::Relay(format!("reading the subscription catalog: {e}")))?;
    if let Some(missing) = subscriptions
        .iter()
        .find(|s| !catalogued.iter().any(|c| c.name == s.name))
    {
        return Err(RuntimeError::Config(crate::ConfigError::new(format!(
            "subscription `{}` is in this file but not in the subscription catalog of {}; run `outbox migrate` with this file first",
            missing.name,
            outbox.table()
        ))));
    }
    for c in catalogued {
        if !subscriptions.iter().any(|s| s.name == c.name) {
            tracing::warn!(subscription = %c.name, sink = %c.sink, "catalogued subscription not in this file (no [sinks.{}] entry for it here): this relay copies its events and delivers none", c.sink);
        }
    }
    Ok(())
}

/// The configuration of one subscription's own pipeline: its table as `[source]`, its sink
/// as `[sink]`, no subscriptions. What `--subscription NAME` gives every operator command.
pub fn for_subscription(config: &Config, name: &str) -> Result<Config, String> {
    let resolved = resolve(config)?;
    let Some(sub) = resolved.into_iter().find(|s| s.name == name) else {
        let names: Vec<&str> = config
            .subscriptions
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        return Err(format!(
            "--subscription: no subscription named `{name}` (configured: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        ));
    };
    let mut one = config.clone();
    one.source = sub.source;
    one.sink = sub.sink;
    one.sinks = BTreeMap::new();
    one.subscriptions = Vec::new();
    Ok(one)
}
