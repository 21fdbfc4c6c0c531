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

use std::collections::BTreeMap;
use std::sync::Arc;

use outbox_core::backend::{Backend, OpenOptions, Pipelines};
use outbox_core::relay::ErrorChain;
use outbox_core::{DynSink, Ordering, Relay, RelayReport};
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::config::Config;
use crate::console::Console;
use crate::observe::Readiness;
use crate::pipeline::Watched;

pub use crate::config::subscription::{Filter, Patterns, Resolved, SubscriptionConfig};
pub use fanout::FanOut;

mod fanout;
mod gate;
mod pipeline;

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
    // The catalog's own small pool: read once per fan-out batch and per subscription claim.
    let outbox = config
        .source
        .open(OpenOptions { connections: 2 })
        .await
        .map_err(RuntimeError::Open)?;
    check_catalogued(&*outbox, &subscriptions).await?;
    let started = pipeline::start_all(&config, subscriptions, &shutdown).await?;
    let wakes = started
        .iter()
        .map(|s| (s.sub.name.clone(), s.wake.clone()))
        .collect();
    let traces = crate::otlp::Tracing::start(&config.tracing, &config.sink)?;
    let mut tasks = tokio::task::JoinSet::new();
    for sub in started {
        readiness.expect_sink(&sub.sub.name);
        tasks.spawn(sub.deliver(pipeline::Shared {
            config: config.clone(),
            schemas: schemas.clone(),
            readiness: readiness.clone(),
            tracer: traces.as_ref().map(|t| t.tracer()),
            outbox: outbox.clone(),
            shutdown: shutdown.clone(),
        }));
    }
    let (watched, sources, closed) = Watched::new(pipelines, readiness, console, None);
    let fanout: Arc<Box<dyn DynSink>> =
        Arc::new(Box::new(FanOut::new(outbox, config.source.clone(), wakes)));
    // The fan-out publishes a claimed batch in one copy per subscription (claim order is
    // commit order within each aggregate), so it needs no waves of its own.
    let mut fanout_relay = config.relay.clone();
    fanout_relay.ordering = Ordering::None;
    let relay = Relay::new(fanout_relay, fanout.clone());
    let fanned = watched
        .run(&config, relay, fanout, sources, &shutdown)
        .await;
    let fanned = fanned.map_err(|e| RuntimeError::Relay(format!("fan-out: {}", ErrorChain(&e))));
    let result = join(tasks, fanned.err()).await;
    crate::pipeline::close(traces, closed).await;
    result.inspect(crate::pipeline::log_drained)
}

/// The subscriptions' combined report once every task ended, or the first error: the
/// fan-out's (`first_err`), else the first subscription's.
async fn join(
    mut tasks: tokio::task::JoinSet<Result<RelayReport, RuntimeError>>,
    mut first_err: Option<RuntimeError>,
) -> Result<RelayReport, RuntimeError> {
    let mut report = RelayReport::default();
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
    match first_err {
        Some(e) => Err(e),
        None => Ok(report),
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
