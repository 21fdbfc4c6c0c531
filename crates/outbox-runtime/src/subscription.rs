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

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::backend::{Backend, BoxedSource, OpenOptions, Pipelines};
use outbox_core::relay::ErrorChain;
use outbox_core::sink::Delivery;
use outbox_core::{
    Destination, DynSink, Event, Ordering, Relay, RelayReport, Sink, SinkError, Source,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::config::{Config, SinkConfig, SourceConfig};
use crate::console::Console;
use crate::observe::{self, Readiness};

/// One `[[subscription]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionConfig {
    /// Its name: lowercase letters, digits and `_`, at most 20 bytes. Names its table
    /// (`<table>_sub_<name>`), its metrics label and its `--subscription` selector.
    pub name: String,
    /// The `[sinks.NAME]` it publishes to.
    pub sink: String,
    /// Only events whose `event_type` matches one of these globs (`*`, `?`); unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<Patterns>,
    /// Only events whose `aggregate_type` matches one of these globs; unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_type: Option<Patterns>,
    /// Replaces the sink's destination template for this subscription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
}

/// One glob or a list of globs.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Patterns {
    /// `event_type = "order.*"`.
    One(String),
    /// `event_type = ["order.placed", "order.paid"]`.
    Many(Vec<String>),
}

impl Patterns {
    fn list(&self) -> Vec<String> {
        match self {
            Self::One(p) => vec![p.clone()],
            Self::Many(ps) => ps.clone(),
        }
    }
}

/// The longest subscription name (its table name must stay an identifier).
const MAX_NAME: usize = 20;

/// Which events a subscription takes.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    event_type: Option<Vec<String>>,
    aggregate_type: Option<Vec<String>>,
}

impl Filter {
    /// Whether `event` passes. Canary probes pass only a filter that asks for them
    /// ([`Filter::asks_for_probes`]).
    pub fn matches(&self, event: &Event) -> bool {
        if event.aggregate_type == outbox_core::canary::AGGREGATE_TYPE && !self.asks_for_probes() {
            return false;
        }
        let any = |patterns: &Option<Vec<String>>, text: &str| match patterns {
            None => true,
            Some(ps) => ps.iter().any(|p| glob(p.as_bytes(), text.as_bytes())),
        };
        any(&self.event_type, &event.event_type) && any(&self.aggregate_type, &event.aggregate_type)
    }
}

impl Filter {
    /// Whether the subscription takes canary probes: its `aggregate_type` names
    /// `outbox.canary` exactly.
    pub fn asks_for_probes(&self) -> bool {
        outbox_core::canary::asked_for(self.aggregate_type.as_deref())
    }
}

/// `*` matches any run of bytes, `?` one byte, anything else itself.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// One subscription, resolved: its filter, its sink (destination applied) and its table.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The subscription's name.
    pub name: String,
    /// Which events it takes.
    pub filter: Filter,
    /// Its sink, with the subscription's destination.
    pub sink: SinkConfig,
    /// Its table, as a source.
    pub source: SourceConfig,
}

/// Checks `[sinks.*]` and `[[subscription]]` and resolves each subscription; errors name
/// the key (`subscription[1].sink: ...`).
pub fn resolve(config: &Config) -> Result<Vec<Resolved>, String> {
    for (name, sink) in &config.sinks {
        sink.validate()
            .map_err(|e| format!("sinks.{name}: {}", e.strip_prefix("sink.").unwrap_or(&e)))?;
    }
    if config.subscriptions.is_empty() {
        if let Some(name) = config.sinks.keys().next() {
            return Err(format!(
                "sinks.{name}: named sinks are used by [[subscription]] entries, and there are none; add one (name, sink = \"{name}\") or use [sink]"
            ));
        }
        return Ok(Vec::new());
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(config.subscriptions.len());
    for (i, sub) in config.subscriptions.iter().enumerate() {
        let key = format!("subscription[{i}]");
        let name = &sub.name;
        if name.is_empty()
            || name.len() > MAX_NAME
            || !name.starts_with(|c: char| c.is_ascii_lowercase())
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(format!(
                "{key}.name: `{name}` must start with a lowercase letter and use lowercase letters, digits and `_` only, at most {MAX_NAME} bytes"
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(format!(
                "{key}.name: `{name}` is used by two subscriptions; names must be unique"
            ));
        }
        let Some(sink) = config.sinks.get(&sub.sink) else {
            let known: Vec<&str> = config.sinks.keys().map(String::as_str).collect();
            return Err(format!(
                "{key}.sink: no [sinks.{}] (named sinks: {})",
                sub.sink,
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        };
        let mut sink = sink.clone();
        if let Some(template) = &sub.destination {
            let d = Destination::parse(template).map_err(|e| format!("{key}.destination: {e}"))?;
            sink.set_destination(d)
                .map_err(|e| format!("{key}.destination: {e}"))?;
        }
        let patterns = |field: &str, p: &Option<Patterns>| -> Result<Option<Vec<String>>, String> {
            let Some(p) = p else { return Ok(None) };
            let list = p.list();
            if list.is_empty() {
                return Err(format!(
                    "{key}.{field}: an empty list matches no event; leave {field} out to take every event"
                ));
            }
            if let Some(bad) = list.iter().find(|p| p.trim().is_empty()) {
                return Err(format!(
                    "{key}.{field}: `{bad}` matches no event (an empty pattern)"
                ));
            }
            Ok(Some(list))
        };
        let filter = Filter {
            event_type: patterns("event_type", &sub.event_type)?,
            aggregate_type: patterns("aggregate_type", &sub.aggregate_type)?,
        };
        let source = config
            .source
            .for_subscription(name)
            .map_err(|e| format!("{key}.name: {e}"))?;
        out.push(Resolved {
            name: name.clone(),
            filter,
            sink,
            source,
        });
    }
    Ok(out)
}

/// The fan-out: a sink that copies each event into the tables of the subscriptions that take
/// it, and wakes their pipelines.
pub struct FanOut {
    routes: Vec<Route>,
}

struct Route {
    name: String,
    filter: Filter,
    backend: Arc<dyn Backend>,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOut")
            .field(
                "subscriptions",
                &self.routes.iter().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Sink for FanOut {
    fn name(&self) -> &'static str {
        "fanout"
    }

    async fn publish<'a>(&'a self, batch: &'a [Event]) -> Result<Vec<Delivery>, SinkError> {
        let copies = self.routes.iter().map(|route| async move {
            let selected: Vec<Event> = batch
                .iter()
                .filter(|e| route.filter.matches(e))
                .map(|e| {
                    let mut copy = e.clone();
                    // The outbox pipeline numbered the event among all of its aggregate's
                    // events; the subscription numbers it among those it takes (gap-free for
                    // its consumers), so the copy must not carry the first number.
                    copy.headers
                        .retain(|(name, _)| name != outbox_core::message::header::AGGREGATE_SEQ);
                    copy
                })
                .collect();
            if selected.is_empty() {
                return Ok(());
            }
            let forward = route
                .backend
                .forward()
                .map_err(|e| SinkError::rejected(format!("subscription `{}`: {e}", route.name)))?;
            forward.copy_in(&selected).await.map_err(|e| {
                SinkError::unavailable(format!(
                    "copying {} event(s) to subscription `{}` ({}): {}",
                    selected.len(),
                    route.name,
                    route.backend.table(),
                    ErrorChain(&e)
                ))
            })?;
            route.wake.notify_one();
            Ok(())
        });
        // All-or-nothing for the batch: a copy that failed leaves every event pending, and
        // copying again skips what the others already hold.
        for result in futures::future::join_all(copies).await {
            result?;
        }
        Ok(vec![Ok(()); batch.len()])
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// A subscription's source, woken as soon as the fan-out copied events into its table.
struct Woken {
    inner: BoxedSource,
    wake: Arc<Notify>,
}

impl Source for Woken {
    fn fetch(
        &mut self,
        limit: usize,
        now: time::OffsetDateTime,
    ) -> impl std::future::Future<
        Output = Result<outbox_core::source::Fetched, outbox_core::SourceError>,
    > + Send {
        self.inner.fetch(limit, now)
    }
    fn settle(
        &mut self,
        settlements: &[outbox_core::source::Settlement],
        now: time::OffsetDateTime,
    ) -> impl std::future::Future<Output = Result<(), outbox_core::SourceError>> + Send {
        self.inner.settle(settlements, now)
    }
    async fn wait_for_events(&mut self, max: Duration) {
        tokio::select! {
            () = self.inner.wait_for_events(max) => {}
            () = self.wake.notified() => {}
        }
    }
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
    let mut routes = Vec::with_capacity(subscriptions.len());
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
        routes.push(Route {
            name: sub.name.clone(),
            filter: sub.filter.clone(),
            backend: backend.clone(),
            wake: wake.clone(),
        });
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
        tasks.spawn(async move {
            let Pipelines {
                sources,
                inspector,
                watchdog,
                closed: _,
            } = sub_pipelines;
            let sink = match crate::relay::build_sink(&sub.sink, &shutdown).await {
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
            let sources: Vec<Woken> = sources
                .into_iter()
                .map(|inner| Woken {
                    inner,
                    wake: wake.clone(),
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
    let fanout: Arc<Box<dyn DynSink>> = Arc::new(Box::new(FanOut { routes }));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_shell_patterns() {
        let g = |p: &str, t: &str| glob(p.as_bytes(), t.as_bytes());
        assert!(g("order.*", "order.placed"));
        assert!(g("order.*", "order."));
        assert!(!g("order.*", "orders.placed"));
        assert!(g("*.paid", "invoice.paid"));
        assert!(!g("*.paid", "invoice.paid.late"));
        assert!(g("a*b*c", "aXXbYYc"));
        assert!(!g("a*b*c", "aXXbYY"));
        assert!(g("?rder", "order"));
        assert!(!g("?rder", "rder"));
        assert!(g("*", ""));
        assert!(g("exact", "exact"));
        assert!(!g("exact", "exactly"));
    }

    fn event_of(aggregate_type: &str) -> Event {
        Event {
            id: uuid::Uuid::new_v4(),
            position: outbox_core::Position(1),
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: "a".into(),
            event_type: "t".into(),
            payload: Default::default(),
            headers: Vec::new(),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            attempts: 0,
        }
    }

    #[test]
    fn canary_probes_reach_only_subscriptions_that_name_them() {
        let probe = event_of(outbox_core::canary::AGGREGATE_TYPE);
        let all = Filter::default();
        assert!(all.matches(&event_of("Order")));
        assert!(!all.matches(&probe), "no filter: every event but probes");
        let star = Filter {
            event_type: None,
            aggregate_type: Some(vec!["*".into()]),
        };
        assert!(!star.matches(&probe), "`*` does not ask for probes");
        let asks = Filter {
            event_type: None,
            aggregate_type: Some(vec!["Order".into(), "outbox.canary".into()]),
        };
        assert!(asks.asks_for_probes());
        assert!(asks.matches(&probe));
        assert!(asks.matches(&event_of("Order")));
    }
}
