//! `outbox relay`: run the pipeline until SIGTERM/SIGINT, then drain and exit 0.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use outbox_core::source::Inspect;
use outbox_core::{DynSink, Relay, Source};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Origin, SinkConfig, SourceConfig};
use crate::observe::{self, Readiness};

/// Builds the sink from config, waiting out an unreachable broker (with backoff) until
/// `shutdown`; a configuration mistake fails at once.
pub(crate) async fn build_sink(
    config: SinkConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Box<dyn DynSink>>> {
    let mut pause = Duration::from_millis(200);
    loop {
        let attempt: Result<Box<dyn DynSink>, outbox_core::SinkError> = match config.clone() {
            SinkConfig::Nats(c) => c.build().await.map(|s| Box::new(s) as Box<dyn DynSink>),
            SinkConfig::Http(c) => c.build().await.map(|s| Box::new(s) as Box<dyn DynSink>),
            SinkConfig::Stdout(c) => c.build().await.map(|s| Box::new(s) as Box<dyn DynSink>),
            SinkConfig::File(c) => c.build().await.map(|s| Box::new(s) as Box<dyn DynSink>),
            #[cfg(feature = "kafka")]
            SinkConfig::Kafka(c) => c.build().await.map(|s| Box::new(s) as Box<dyn DynSink>),
            #[cfg(feature = "redis")]
            SinkConfig::Redis(c) => c.build().await.map(|s| Box::new(s) as Box<dyn DynSink>),
            #[cfg(feature = "rabbitmq")]
            SinkConfig::Rabbitmq(c) => c.build().await.map(|s| Box::new(s) as Box<dyn DynSink>),
        };
        match attempt {
            Ok(sink) => return Ok(Some(sink)),
            Err(e) if e.kind() == outbox_core::SinkErrorKind::Unavailable => {
                tracing::warn!(sink = config.kind(), error = %e.report(), retry_in = ?pause, "broker unreachable; retrying");
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = shutdown.cancelled() => return Ok(None),
                }
                pause = (pause * 2).min(Duration::from_secs(10));
            }
            Err(e) => bail!("sink `{}`: {}", config.kind(), e.report()),
        }
    }
}

/// A token cancelled on the first SIGTERM or SIGINT; a second signal exits at once.
pub(crate) fn cancel_on_signal() -> anyhow::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    // Registered here, synchronously, before anything else runs: a signal that arrives while
    // the relay is still starting must reach this handler, not the default "terminate".
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut first = true;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if first {
                // Cancel before logging: nothing may stand between a signal and the drain.
                cancel.cancel();
                tracing::info!(
                    "shutdown requested: finishing the batch in flight (signal again to exit at once)"
                );
                first = false;
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

/// Runs the relay.
pub(crate) async fn run(
    config: Config,
    origin: Origin,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let readiness = Arc::new(Readiness::default());
    if let Some(listen) = config.metrics.listen {
        observe::serve(listen, readiness.clone(), shutdown.clone()).await?;
    }
    let workers = config.relay.workers.get();
    match &config.source {
        SourceConfig::Postgres(pg) => {
            tracing::info!(config = %origin, database = %pg.url, table = %pg.qualified_table(), sink = config.sink.kind(), ordering = ?config.relay.ordering, workers, "starting relay");
            let pool = outbox_postgres::connect(pg, workers as u32 + 2)
                .await
                .with_context(|| format!("cannot connect to {}", pg.url))?;
            check_pg_schema(&pool, pg).await?;
            crate::retention::spawn(
                &config,
                crate::retention::Target::Postgres(pool.clone(), pg.clone()),
                shutdown.clone(),
            );
            if pg.mode == outbox_postgres::Mode::Cdc {
                // One slot, one stream: a single pipeline (docs/cdc.md).
                let source = outbox_postgres::PgCdcSource::new(
                    pool.clone(),
                    pg,
                    config.relay.ordering,
                    config.relay.dead_letter,
                )
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
                let inspector = source.inspector();
                let closed = source.closed();
                let result =
                    drive(config, vec![source], inspector, None, readiness, shutdown).await;
                // The final standby status update, so the slot does not replay the last batch.
                let _ = tokio::time::timeout(Duration::from_secs(5), closed.wait()).await;
                return result;
            }
            if let Err(e) =
                outbox_postgres::PgPollSource::analyze_if_never_analyzed(&pool, pg).await
            {
                tracing::warn!(error = %crate::chain(&e), "could not collect planner statistics; the first claims may be slow");
            }
            let sources = (0..workers)
                .map(|_| {
                    outbox_postgres::PgPollSource::new(
                        pool.clone(),
                        pg,
                        config.relay.ordering,
                        config.relay.dead_letter,
                    )
                })
                .collect();
            let inspector = outbox_postgres::PgInspector::new(pool.clone(), pg);
            let watchdog = Some(inspector.clone());
            drive(config, sources, inspector, watchdog, readiness, shutdown).await
        }
        SourceConfig::Sqlite(sq) => {
            if matches!(origin, Origin::Defaults) {
                eprintln!(
                    "outbox: no config file; using the embedded default: SQLite `{}` -> stdout",
                    sq.path.display()
                );
            }
            tracing::info!(config = %origin, database = %sq.path.display(), sink = config.sink.kind(), "starting relay");
            let pool = outbox_sqlite::connect(sq)
                .await
                .with_context(|| format!("cannot open SQLite database `{}`", sq.path.display()))?;
            outbox_sqlite::migrate(&pool, &sq.table)
                .await
                .with_context(|| format!("preparing the outbox in `{}`", sq.path.display()))?;
            crate::retention::spawn(
                &config,
                crate::retention::Target::Sqlite(pool.clone(), sq.table.clone()),
                shutdown.clone(),
            );
            // SQLite has one writer: one pipeline, guarded by a lease against a second relay.
            let sources = vec![outbox_sqlite::SqlitePollSource::new(
                pool.clone(),
                sq,
                config.relay.ordering,
                config.relay.dead_letter,
            )];
            let inspector = outbox_sqlite::SqliteInspector::new(pool, sq);
            drive(config, sources, inspector, None, readiness, shutdown).await
        }
    }
}

async fn check_pg_schema(
    pool: &sqlx::PgPool,
    pg: &outbox_postgres::PostgresConfig,
) -> anyhow::Result<()> {
    let version = outbox_postgres::schema_version(pool, &pg.qualified_table())
        .await
        .with_context(|| format!("reading the outbox schema version from {}", pg.url))?;
    match version {
        None => bail!(
            "outbox table {} is not set up in {}; run `outbox migrate` first",
            pg.qualified_table(),
            pg.url
        ),
        Some(v) if v < outbox_postgres::SCHEMA_VERSION => bail!(
            "outbox table {} has schema version {v}, this relay needs {}; run `outbox migrate`",
            pg.qualified_table(),
            outbox_postgres::SCHEMA_VERSION
        ),
        Some(_) => Ok(()),
    }
}

/// Runs the relay with its watchdog. `pg_watchdog`: the PostgreSQL polling inspector, which
/// also reports stuck events and the oldest open transaction.
async fn drive<S: Source, I: Inspect>(
    config: Config,
    sources: Vec<S>,
    inspector: I,
    pg_watchdog: Option<outbox_postgres::PgInspector>,
    readiness: Arc<Readiness>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let Some(sink) = build_sink(config.sink.clone(), &shutdown).await? else {
        tracing::info!("stopped before the broker became reachable");
        return Ok(());
    };
    let sink = Arc::new(sink);
    let watcher = tokio::spawn(observe::watch(
        inspector,
        pg_watchdog,
        sink.clone(),
        config.metrics.clone(),
        readiness,
        shutdown.clone(),
    ));
    let relay = Relay::new(config.relay.clone(), sink);
    let result = relay.run(sources, shutdown.clone()).await;
    shutdown.cancel();
    let _ = watcher.await;
    let report = result.context("relay stopped")?;
    tracing::info!(
        delivered = report.delivered,
        retried = report.retried,
        dead_lettered = report.dead_lettered,
        "relay stopped after draining"
    );
    Ok(())
}
