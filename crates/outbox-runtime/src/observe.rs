//! Metrics endpoint (`/metrics`, `/healthz`, `/readyz`, and the web console at `/ui`: see
//! [`crate::console`]) and the watchdog: backlog gauges, events pending longer than
//! `metrics.stuck_after`, the oldest pending age not counting backoff, the transaction holding
//! the xmin horizon, and dead-letter growth.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox_core::backend::{DynInspect, Watchdog};
use outbox_core::metrics as m;
use outbox_core::{DynSink, Sink};
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::config::{Config, MetricsConfig};
use crate::console::Console;
pub use crate::readiness::Readiness;

/// The Prometheus recorder with the commit→ack histogram's buckets, not installed.
pub(crate) fn recorder() -> Result<metrics_exporter_prometheus::PrometheusRecorder, RuntimeError> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(m::COMMIT_TO_ACK_SECONDS.to_owned()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0,
            ],
        )
        .map_err(|e| RuntimeError::Metrics(format!("configuring histogram buckets: {e}")))?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(m::CANARY_LATENCY_SECONDS.to_owned()),
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ],
        )
        .map_err(|e| RuntimeError::Metrics(format!("configuring histogram buckets: {e}")))?
        .build_recorder())
}

/// Installs the Prometheus recorder and serves the endpoint on `listen` until `shutdown`,
/// with the console at `/ui` when `[ui]` has it on; returns the console, for the watchdog to
/// feed.
pub async fn serve(
    listen: SocketAddr,
    config: &Config,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
) -> Result<Option<Arc<Console>>, RuntimeError> {
    let recorder = recorder()?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| RuntimeError::Metrics(format!("installing the metrics recorder: {e}")))?;
    m::describe();
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        RuntimeError::Metrics(format!("metrics.listen: cannot listen on {listen}: {e}"))
    })?;
    let listen = listener.local_addr().unwrap_or(listen);
    let console = Console::from_config(config, listen, handle.clone(), readiness.clone());
    let mut app = router(handle, readiness);
    match &console {
        Some(console) => {
            app = app.merge(console.routes());
            tracing::info!(%listen, actions = config.ui.allow_actions, token = config.ui.token.is_some(), "serving /metrics, /healthz, /readyz and the console at http://{listen}/ui");
        }
        None => {
            if config.ui.enabled.is_none() {
                tracing::info!(%listen, "serving /metrics, /healthz and /readyz; the console (/ui) is off: metrics.listen is not a loopback address and ui.token is unset");
            } else {
                tracing::info!(%listen, "serving /metrics, /healthz and /readyz (ui.enabled = false)");
            }
        }
    }
    tokio::spawn(async move {
        let server = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await });
        if let Err(e) = server.await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    });
    Ok(console)
}

fn router(handle: PrometheusHandle, readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/metrics", get(move || std::future::ready(handle.render())))
        .route("/healthz", get(|| std::future::ready("ok\n")))
        .route(
            "/readyz",
            get(move || {
                let ready = readiness.ready();
                std::future::ready(if ready {
                    (StatusCode::OK, "ready\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not ready: database or broker unreachable\n",
                    )
                })
            }),
        )
}

/// Refreshes the backlog gauges, runs the stuck-event watchdog and the sink healthcheck
/// every `refresh_interval`, until `shutdown`.
///
/// `watchdog`: the backend's own extra checks (PostgreSQL: stuck events and the oldest open
/// transaction). `console`: gets a chart sample and the healthcheck's verdict each round.
/// `subscription`: `None` for the one pipeline of a plain relay; for one pipeline of a
/// fan-out, its name: the gauges carry `subscription="<name>"`, logs name it, and its sink's
/// verdict counts for `/readyz` under its name.
#[allow(clippy::too_many_arguments)]
pub async fn watch_labeled(
    inspector: Arc<dyn DynInspect>,
    watchdog: Option<Arc<dyn Watchdog>>,
    sink: Arc<Box<dyn DynSink>>,
    config: MetricsConfig,
    readiness: Arc<Readiness>,
    console: Option<Arc<Console>>,
    subscription: Option<String>,
    shutdown: CancellationToken,
) {
    let labels: Vec<metrics::Label> = subscription
        .iter()
        .map(|s| metrics::Label::new("subscription", s.clone()))
        .collect();
    let pipeline = subscription.clone().unwrap_or_default();
    let sub = subscription.as_deref().unwrap_or("");
    let mut tick = tokio::time::interval(config.refresh_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_dead = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match inspector.dyn_backlog().await {
            Ok(b) => {
                readiness.set_database(true);
                metrics::gauge!(m::PENDING, labels.clone()).set(b.pending as f64);
                metrics::gauge!(m::RETRYING, labels.clone()).set(b.retrying as f64);
                metrics::gauge!(m::DEAD, labels.clone()).set(b.dead as f64);
                metrics::gauge!(m::OLDEST_PENDING_AGE_SECONDS, labels.clone())
                    .set(b.oldest_pending_age_seconds);
                if b.oldest_pending_age_seconds > config.stuck_after.as_secs_f64() {
                    tracing::warn!(
                        subscription = sub,
                        oldest_pending_age_seconds = b.oldest_pending_age_seconds,
                        pending = b.pending,
                        "events are waiting longer than metrics.stuck_after; see `outbox status`"
                    );
                }
                if let Some(prev) = last_dead
                    && b.dead > prev
                {
                    tracing::warn!(
                        subscription = sub,
                        dead = b.dead,
                        new = b.dead - prev,
                        "dead letters are growing; see `outbox status`"
                    );
                }
                last_dead = Some(b.dead);
                if let Some(console) = &console {
                    console.record(&b);
                }
            }
            Err(e) => {
                readiness.set_database(false);
                tracing::warn!(error = %outbox_core::relay::ErrorChain(&e), "could not read the backlog");
            }
        }
        if let Some(watchdog) = &watchdog {
            watchdog.check(config.stuck_after).await;
        }
        let checked = sink.healthcheck().await;
        match &checked {
            Ok(()) => readiness.set_sink(&pipeline, true),
            Err(e) => {
                readiness.set_sink(&pipeline, false);
                tracing::warn!(subscription = sub, sink = sink.name(), error = %e.report(), "sink healthcheck failed");
            }
        }
        if let Some(console) = &console {
            let name = subscription.as_deref().unwrap_or(sink.name());
            console.record_sink_check(name, checked.map_err(|e| e.report()));
        }
    }
}
