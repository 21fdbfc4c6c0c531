//! Running the relay: build the backend's pipelines and the sink from config, serve metrics,
//! run the retention schedule and the watchdog beside the relay, and drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::backend::{Backend, OpenOptions, Pipelines};
use outbox_core::relay::ErrorChain;
use outbox_core::{Relay, RelayReport};
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::canary;
use crate::config::{Config, Origin};
use crate::console::Console;
use crate::observe::{self, Readiness};
use crate::pipeline::{Watched, close, log_drained, staged_sink};
use crate::reload::Reloader;
pub use crate::sink::build_sink;

/// A second signal closer than this to the first is the same request delivered twice.
const SECOND_SIGNAL_AFTER: Duration = Duration::from_secs(1);

/// A token cancelled on the first SIGTERM or SIGINT; a second signal at least a second later
/// exits the process at once. Call it before anything else, so a signal during start-up still
/// drains.
pub fn cancel_on_signal() -> Result<CancellationToken, RuntimeError> {
    use tokio::signal::unix::{SignalKind, signal};
    // Registered here, synchronously, before anything else runs: a signal that arrives while
    // the relay is still starting must reach this handler, not the default "terminate".
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| RuntimeError::Signal(format!("installing the SIGTERM handler: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| RuntimeError::Signal(format!("installing the SIGINT handler: {e}")))?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut first: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            let Some(at) = first else {
                // Cancel before logging: nothing may stand between a signal and the drain.
                cancel.cancel();
                tracing::info!(
                    "shutdown requested: finishing the batch in flight (signal again to exit at once)"
                );
                first = Some(tokio::time::Instant::now());
                continue;
            };
            if at.elapsed() < SECOND_SIGNAL_AFTER {
                // The same request delivered twice: `timeout`, systemd and shells signal the
                // process and its process group within a millisecond. A second signal that
                // means "exit now" is a deliberate, later one.
                tracing::debug!("signal repeated right after the first: still draining");
            } else {
                tracing::warn!(
                    "second signal: exiting without draining (unsettled events will be published again)"
                );
                std::process::exit(130);
            }
        }
    });
    Ok(token)
}

/// Runs the relay described by `config` until `shutdown` is cancelled, then finishes the
/// batch in flight and returns what it did.
///
/// Everything the `outbox relay` command does: the metrics endpoint (`[metrics] listen`),
/// the retention schedule, the watchdog and the broker healthcheck run beside the relay.
pub async fn run(
    config: Config,
    origin: &Origin,
    shutdown: CancellationToken,
) -> Result<RelayReport, RuntimeError> {
    run_reloadable(config, origin, shutdown, None).await
}

/// [`run`], reloading the configuration with `loader` on SIGHUP and on the console's reload
/// action (see [`crate::reload`]): the database pool and the metrics listener stay, the
/// pipelines drain and start again from the new configuration.
pub async fn run_reloadable(
    config: Config,
    origin: &Origin,
    shutdown: CancellationToken,
    loader: Option<crate::reload::Loader>,
) -> Result<RelayReport, RuntimeError> {
    let mut reloader = loader
        .map(|loader| Reloader::new(loader, origin))
        .transpose()?;
    // `[payload] schemas`: every schema compiled before anything else starts; a broken one
    // stops the start, naming its file.
    let mut schemas = crate::schemas::from_config(&config.payload)?;
    if let Some(schemas) = &schemas {
        tracing::info!(dir = %schemas.dir().display(), files = %schemas.files().join(", "), "payloads validated against JSON Schema");
    }
    let readiness = Arc::new(Readiness::default());
    let console = match config.metrics.listen {
        Some(listen) => {
            observe::serve(listen, &config, readiness.clone(), shutdown.clone()).await?
        }
        None => None,
    };
    if let Some(reloader) = &reloader {
        reloader.publish_generation();
        if let Some(console) = &console {
            console.attach_reloads(reloader.handle());
        }
    }
    let workers = config.relay.workers.get();
    let connections = u32::try_from(workers).unwrap_or(u32::MAX).saturating_add(2);
    log_start(&config, origin, workers);
    let backend = config
        .source
        .open(OpenOptions { connections })
        .await
        .map_err(RuntimeError::Open)?;
    tracing::debug!(table = %backend.table(), "database open");
    if let Some(console) = &console {
        console.attach_backend(backend.clone());
    }
    let mut config = config;
    let mut report = RelayReport::default();
    loop {
        // Each configuration's pipelines stop on their own token: a reload drains them as
        // SIGTERM would, without stopping the process.
        let pipelines = shutdown.child_token();
        // A task of its own: it goes on while a reload reads and checks the new file.
        let mut running = tokio::spawn(generation(
            config.clone(),
            backend.clone(),
            schemas.clone(),
            readiness.clone(),
            console.clone(),
            pipelines.clone(),
        ));
        let (prepared, request) = loop {
            let request = tokio::select! {
                result = &mut running => return finish(report, result),
                request = next_request(&mut reloader) => request,
            };
            let Some(reloader) = reloader.as_ref() else {
                continue;
            };
            match reloader.prepare(&config, backend.as_ref()).await {
                Ok(Some(prepared)) => break (prepared, request),
                Ok(None) => reloader.unchanged(request),
                Err(e) => reloader.refused(request, e),
            }
        };
        let Some(reloader) = reloader.as_mut() else {
            return finish(report, running.await);
        };
        reloader.announce(&prepared);
        // In-flight batches finish under the configuration they started with.
        pipelines.cancel();
        report = finish(report, running.await)?;
        if shutdown.is_cancelled() {
            tracing::info!("shutdown requested during the reload: not starting the new pipelines");
            return Ok(report);
        }
        (config, schemas) = reloader.applied(request, prepared);
        readiness.forget_sinks();
        if let Some(console) = &console {
            console.follow(&config, reloader.handle().generation());
        }
    }
}

/// The next reload request, or never without a reloader.
async fn next_request(reloader: &mut Option<Reloader>) -> crate::reload::Request {
    match reloader {
        Some(reloader) => reloader.next().await,
        None => std::future::pending().await,
    }
}

/// The relay's report once its last pipelines stopped.
fn finish(
    report: RelayReport,
    last: Result<Result<RelayReport, RuntimeError>, tokio::task::JoinError>,
) -> Result<RelayReport, RuntimeError> {
    let mut report = report;
    report +=
        last.map_err(|e| RuntimeError::Relay(format!("the pipelines' task failed: {e}")))??;
    Ok(report)
}

/// The start line, before the database answers: operators (and the crash tests) see at once
/// that the process is up and its signal handlers are installed.
fn log_start(config: &Config, origin: &Origin, workers: usize) {
    if matches!(origin, Origin::Defaults) {
        eprintln!(
            "outbox: no config file; using the embedded default: {} -> {}",
            config.source.describe(),
            config.sink.kind()
        );
    }
    if config.subscriptions.is_empty() {
        tracing::info!(config = %origin, source = config.source.kind(), database = %config.source.describe(), sink = config.sink.kind(), ordering = ?config.relay.ordering, workers, "starting relay");
    } else {
        let subscriptions: Vec<String> = config
            .subscriptions
            .iter()
            .map(|s| format!("{} -> {}", s.name, s.sink))
            .collect();
        tracing::info!(config = %origin, source = config.source.kind(), database = %config.source.describe(), subscriptions = %subscriptions.join(", "), ordering = ?config.relay.ordering, workers, "starting relay with a fan-out");
    }
}

/// One configuration's pipelines, retention schedule and canary, until `shutdown`.
async fn generation(
    config: Config,
    backend: Arc<dyn Backend>,
    schemas: Option<Arc<crate::schemas::Schemas>>,
    readiness: Arc<Readiness>,
    console: Option<Arc<Console>>,
    shutdown: CancellationToken,
) -> Result<RelayReport, RuntimeError> {
    if config.subscriptions.is_empty() {
        crate::catalog::refuse_plain_relay_beside_a_fan_out(&*backend)
            .await
            .map_err(|e| RuntimeError::Config(crate::ConfigError::new(e)))?;
    }
    let pipelines = backend
        .start_relay(&config.relay)
        .await
        .map_err(RuntimeError::Source)?;
    crate::retention::spawn(&config.retention, backend.clone(), shutdown.clone());
    let subscriptions = crate::subscription::resolve(&config).map_err(crate::ConfigError::new)?;
    if config.canary.every.is_some() {
        let targets = if subscriptions.is_empty() {
            vec![canary::Target {
                subscription: None,
                sink: config.sink.clone(),
            }]
        } else {
            subscriptions
                .iter()
                .filter(|s| s.filter.asks_for_probes())
                .map(|s| canary::Target {
                    subscription: Some(s.name.clone()),
                    sink: s.sink.clone(),
                })
                .collect()
        };
        let status = canary::SharedStatus::default();
        if let Some(console) = &console {
            console.attach_canary(status.clone());
        }
        tokio::spawn(canary::run(
            config.canary.clone(),
            backend.clone(),
            targets,
            status,
            shutdown.clone(),
        ));
    }
    if !subscriptions.is_empty() {
        return crate::subscription::run(
            config,
            subscriptions,
            pipelines,
            schemas,
            readiness,
            console,
            shutdown,
        )
        .await;
    }
    drive(
        config, backend, pipelines, schemas, readiness, console, shutdown,
    )
    .await
}

/// Runs the relay over `pipelines` with the watchdog beside it.
async fn drive(
    config: Config,
    _backend: Arc<dyn Backend>,
    pipelines: Pipelines,
    schemas: Option<Arc<crate::schemas::Schemas>>,
    readiness: Arc<Readiness>,
    console: Option<Arc<Console>>,
    shutdown: CancellationToken,
) -> Result<RelayReport, RuntimeError> {
    let (watched, sources, closed) = Watched::new(pipelines, readiness, console, None);
    // `outbox crash-test`'s own test: a relay that breaks order on purpose.
    #[cfg(feature = "fault-injection")]
    let sources = crate::fault_injection::reverse_batches(sources);
    let Some(sink) = staged_sink(&config, &config.sink, None, schemas, &shutdown).await? else {
        tracing::info!("stopped before the broker became reachable");
        return Ok(RelayReport::default());
    };
    // `[tracing]`: a span per publish attempt; without an endpoint, no tracer at all.
    let traces = crate::otlp::Tracing::start(&config.tracing, &config.sink)?;
    let mut relay = Relay::new(config.relay.clone(), sink.clone());
    if let Some(traces) = &traces {
        relay = relay.with_tracer(traces.tracer());
    }
    let result = watched.run(&config, relay, sink, sources, &shutdown).await;
    close(traces, closed).await;
    let report = result.map_err(|e| RuntimeError::Relay(ErrorChain(&e).to_string()))?;
    log_drained(&report);
    Ok(report)
}
