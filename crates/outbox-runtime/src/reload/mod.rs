//! Reloading the configuration without a restart: SIGHUP, or `POST /ui/api/reload` in the
//! console when `[ui] allow_actions = true`.
//!
//! A reload reads the file the relay was started with again, with the same checks as at
//! start (`docs/operations.md`, "Reloading the config"). An invalid file, or a change to a key
//! that needs a restart (`diff::needs_restart`), is refused: the error is logged naming the
//! key, the running configuration keeps going, and `outbox_config_reloads_total
//! {result="refused"}` counts it. A valid file's changes are logged one key a line (secrets
//! as `***`); then the relay drains its pipelines (each batch in flight finishes under the
//! configuration it started with, as on SIGTERM) and starts new ones from the new
//! configuration in the same process, on the same database pool and metrics listener. The
//! configuration's generation (1 at start, +1 per applied reload) is the gauge
//! `outbox_config_generation` and part of the console's overview.

mod diff;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use outbox_core::backend::Backend;
use outbox_core::metrics as m;
use tokio::sync::{mpsc, oneshot};

pub use diff::Change;

use crate::RuntimeError;
use crate::config::{Config, Origin};

/// Reads the configuration again, exactly as at start (file, environment, command-line
/// overrides); the error is the message start-up would give.
pub type Loader = Arc<dyn Fn() -> Result<Config, String> + Send + Sync>;

/// Installs a log filter: `Some(spec)` (`[tracing] log_level`), or `None` for the filter the
/// process started with. The binary owns the subscriber, so it supplies this.
pub type LogFilter = Box<dyn Fn(Option<&str>) -> Result<(), String> + Send + Sync>;

static LOG_FILTER: OnceLock<LogFilter> = OnceLock::new();

/// Registers the process's log filter switch (once; later calls are ignored).
pub fn install_log_filter(filter: LogFilter) {
    let _ = LOG_FILTER.set(filter);
}

/// Applies `[tracing] log_level` (or, unset, the start-up filter) when a switch is installed.
pub fn apply_log_level(level: Option<&str>) -> Result<(), String> {
    match LOG_FILTER.get() {
        Some(filter) => filter(level),
        None => Ok(()),
    }
}

/// What an applied reload changed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    /// The configuration's generation now (unchanged when nothing changed).
    pub generation: u64,
    /// The keys that changed, secrets as `***`; empty when the file says what runs.
    pub changes: Vec<Change>,
}

/// One request; `reply` is `None` for SIGHUP (the log is the answer).
pub(crate) struct Request {
    reply: Option<oneshot::Sender<Result<Outcome, String>>>,
}

impl Request {
    fn answer(self, result: Result<Outcome, String>) {
        if let Some(reply) = self.reply {
            let _ = reply.send(result);
        }
    }
}

/// Asks the running relay to reload: what the console holds.
#[derive(Debug, Clone)]
pub struct Reloads {
    tx: mpsc::Sender<Request>,
    generation: Arc<AtomicU64>,
}

impl Reloads {
    /// Reloads and waits until the new configuration runs (or the reload was refused).
    pub async fn request(&self) -> Result<Outcome, String> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request { reply: Some(reply) })
            .await
            .map_err(|_| "the relay is stopping".to_owned())?;
        answer
            .await
            .map_err(|_| "the relay stopped before the reload finished".to_owned())?
    }

    /// The configuration's generation: 1 at start, +1 per applied reload.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }
}

/// A checked new configuration, ready to replace the running one.
pub(crate) struct Prepared {
    config: Config,
    schemas: Option<Arc<crate::schemas::Schemas>>,
    changes: Vec<Change>,
    raw: BTreeMap<String, String>,
}

/// The relay's end of reloading: requests in, generations counted.
pub(crate) struct Reloader {
    loader: Loader,
    file: Option<PathBuf>,
    raw: BTreeMap<String, String>,
    rx: mpsc::Receiver<Request>,
    handle: Reloads,
}

impl Reloader {
    /// Starts listening for SIGHUP. `origin`: the file whose text tells secret changes apart.
    pub(crate) fn new(loader: Loader, origin: &Origin) -> Result<Self, RuntimeError> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup())
            .map_err(|e| RuntimeError::Signal(format!("installing the SIGHUP handler: {e}")))?;
        let (tx, rx) = mpsc::channel(8);
        let signals = tx.clone();
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the configuration");
                if signals.send(Request { reply: None }).await.is_err() {
                    return;
                }
            }
        });
        let file = match origin {
            Origin::File(path) => Some(path.clone()),
            Origin::Defaults | Origin::Code => None,
        };
        let raw = file.as_deref().map(diff::raw_keys).unwrap_or_default();
        Ok(Self {
            loader,
            file,
            raw,
            rx,
            handle: Reloads {
                tx,
                generation: Arc::new(AtomicU64::new(1)),
            },
        })
    }

    /// Shows the first generation, once the metrics recorder is installed.
    pub(crate) fn publish_generation(&self) {
        metrics::gauge!(m::CONFIG_GENERATION).set(self.handle.generation() as f64);
    }

    /// What the console holds to ask for a reload.
    pub(crate) fn handle(&self) -> Reloads {
        self.handle.clone()
    }

    /// The next request (never, once every sender is gone).
    pub(crate) async fn next(&mut self) -> Request {
        match self.rx.recv().await {
            Some(request) => request,
            None => std::future::pending().await,
        }
    }

    /// Reads and checks the file again against `current`: `Ok(None)` when nothing changed,
    /// `Err` (naming the key) when it cannot be applied.
    pub(crate) async fn prepare(
        &self,
        current: &Config,
        outbox: &dyn Backend,
    ) -> Result<Option<Prepared>, String> {
        let config = (self.loader)()?;
        let raw = self.file.as_deref().map(diff::raw_keys).unwrap_or_default();
        let changes =
            diff::changes(current, &config, &self.raw, &raw).map_err(|e| e.to_string())?;
        if changes.is_empty() {
            return Ok(None);
        }
        let blocked: Vec<&str> = changes
            .iter()
            .filter(|c| diff::needs_restart(&c.key))
            .map(|c| c.key.as_str())
            .collect();
        if !blocked.is_empty() {
            return Err(format!(
                "{}: needs a restart (the database, its pool, the listener and the console are set up once); nothing was changed",
                blocked.join(", ")
            ));
        }
        let schemas = crate::schemas::from_config(&config.payload).map_err(|e| e.to_string())?;
        check_catalogued(current, &config, outbox).await?;
        Ok(Some(Prepared {
            config,
            schemas,
            changes,
            raw,
        }))
    }

    /// Answers a reload that found nothing to change.
    pub(crate) fn unchanged(&self, request: Request) {
        tracing::info!("configuration reloaded: nothing changed");
        metrics::counter!(m::CONFIG_RELOADS, "result" => "ok").increment(1);
        request.answer(Ok(Outcome {
            generation: self.handle.generation(),
            changes: Vec::new(),
        }));
    }

    /// Answers a refused reload; the running configuration stays.
    pub(crate) fn refused(&self, request: Request, error: String) {
        tracing::error!(error = %error, "configuration reload refused; the running configuration stays");
        metrics::counter!(m::CONFIG_RELOADS, "result" => "refused").increment(1);
        request.answer(Err(error));
    }

    /// Logs what `prepared` changes, before the running pipelines drain.
    pub(crate) fn announce(&self, prepared: &Prepared) {
        for change in &prepared.changes {
            tracing::info!(key = %change.key, "config change: {change}");
        }
    }

    /// The new configuration takes over: applies its log level, counts the generation, answers,
    /// and hands the configuration (with its compiled schemas) to the relay.
    pub(crate) fn applied(
        &mut self,
        request: Request,
        prepared: Prepared,
    ) -> (Config, Option<Arc<crate::schemas::Schemas>>) {
        if let Err(e) = apply_log_level(prepared.config.tracing.log_level.as_deref()) {
            // Checked by `validate`; a switch that still fails keeps the old level.
            tracing::warn!(error = %e, "tracing.log_level: the log filter was not changed");
        }
        let generation = self.handle.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.raw = prepared.raw;
        metrics::counter!(m::CONFIG_RELOADS, "result" => "ok").increment(1);
        metrics::gauge!(m::CONFIG_GENERATION).set(generation as f64);
        tracing::info!(
            generation,
            changes = prepared.changes.len(),
            "configuration reloaded: the new pipelines run"
        );
        request.answer(Ok(Outcome {
            generation,
            changes: prepared.changes,
        }));
        (prepared.config, prepared.schemas)
    }
}

/// Each subscription the new configuration adds must be in the outbox's subscription catalog
/// (`outbox migrate` with the new file records it and creates its table): checked before
/// anything stops, so a missing one refuses the reload instead of stopping the relay (the
/// new pipelines would refuse to start without it).
async fn check_catalogued(
    current: &Config,
    new: &Config,
    outbox: &dyn Backend,
) -> Result<(), String> {
    if new.subscriptions.is_empty() {
        crate::catalog::refuse_plain_relay_beside_a_fan_out(outbox).await?;
    }
    for sub in new.resolve_subscriptions()? {
        if current.subscriptions.iter().any(|s| s.name == sub.name) {
            continue;
        }
        crate::catalog::find(outbox, &sub.name).await.map_err(|e| {
            format!(
                "subscription[{}]: not in the subscription catalog ({e}); run `outbox migrate` with the new file first",
                sub.name
            )
        })?;
    }
    Ok(())
}
