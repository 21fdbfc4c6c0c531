//! The fan-out: the outbox pipeline's sink, which copies each claimed batch into the tables of
//! the subscriptions **in the catalog** (`<table>_subscriptions`), read again for every batch
//! after the batch was claimed.
//!
//! Why after the claim: `outbox migrate` commits a subscription's catalog row at some time
//! T. An event committed after T is claimed after T (a claim sees only committed rows, and
//! a CDC stream hands out only committed transactions), so the catalog read that follows
//! its claim starts after T and sees the row: the event is copied into the new
//! subscription's table by every replica, whatever file it was started with.

use std::collections::HashMap;
use std::sync::Arc;

use outbox_core::backend::{Backend, OpenOptions};
use outbox_core::relay::ErrorChain;
use outbox_core::sink::Delivery;
use outbox_core::{Event, Sink, SinkError};
use tokio::sync::{Mutex, Notify};

use crate::config::subscription::Filter;
use crate::registry::SourceConfig;

/// The fan-out: a sink that copies each event into the tables of the catalogued
/// subscriptions that take it, and wakes the pipelines this process runs for them.
pub struct FanOut {
    outbox: Arc<dyn Backend>,
    source: SourceConfig,
    wakes: HashMap<String, Arc<Notify>>,
    routes: Mutex<HashMap<String, Arc<Route>>>,
}

/// One catalogued subscription as the fan-out copies into it.
struct Route {
    name: String,
    /// The catalog's filter text this route was built from (rebuilt when it changes).
    filter_json: String,
    filter: Filter,
    backend: Arc<dyn Backend>,
    wake: Option<Arc<Notify>>,
}

impl std::fmt::Debug for FanOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FanOut")
            .field("outbox", &self.outbox.table())
            .field("pipelines", &self.wakes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl FanOut {
    /// A fan-out over the outbox `outbox` (whose catalog it reads) opening subscription
    /// tables of `source`; `wakes` are the pipelines of this process, by subscription.
    pub(crate) fn new(
        outbox: Arc<dyn Backend>,
        source: SourceConfig,
        wakes: HashMap<String, Arc<Notify>>,
    ) -> Self {
        Self {
            outbox,
            source,
            wakes,
            routes: Mutex::new(HashMap::new()),
        }
    }

    /// The catalog's subscriptions now: one query, then the cached routes (a subscription
    /// new to this process opens its table's pool once).
    async fn routes(&self) -> Result<Vec<Arc<Route>>, SinkError> {
        let catalog = self
            .outbox
            .catalog()
            .map_err(|e| SinkError::rejected(e.to_string()))?;
        let entries = catalog
            .list()
            .await
            .map_err(|e| SinkError::unavailable(format!("fan-out: {}", ErrorChain(&e))))?;
        let mut cache = self.routes.lock().await;
        cache.retain(|name, _| entries.iter().any(|e| &e.name == name));
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            if let Some(route) = cache.get(&entry.name)
                && route.filter_json == entry.filter
            {
                out.push(route.clone());
                continue;
            }
            let route = Arc::new(self.open(entry.name, entry.filter).await?);
            cache.insert(route.name.clone(), route.clone());
            out.push(route);
        }
        Ok(out)
    }

    async fn open(&self, name: String, filter_json: String) -> Result<Route, SinkError> {
        let filter = Filter::from_json(&filter_json)
            .map_err(|e| SinkError::unavailable(format!("subscription `{name}`: {e}")))?;
        let source = self
            .source
            .for_subscription(&name)
            .map_err(|e| SinkError::rejected(format!("subscription `{name}`: {e}")))?;
        let backend = source
            .open(OpenOptions { connections: 2 })
            .await
            .map_err(|e| {
                SinkError::unavailable(format!("subscription `{name}`: {}", ErrorChain(&e)))
            })?;
        backend
            .forward()
            .map_err(|e| SinkError::rejected(format!("subscription `{name}`: {e}")))?;
        let wake = self.wakes.get(&name).cloned();
        if wake.is_none() {
            tracing::warn!(subscription = %name, table = %backend.table(), "subscription is in the catalog but not in this relay's file: copying its events into its table, delivering none (a relay whose file has it delivers them)");
        }
        Ok(Route {
            name,
            filter_json,
            filter,
            backend,
            wake,
        })
    }
}

/// The events of `batch` that `route` takes, without the outbox's `aggregate_seq`.
fn select(route: &Route, batch: &[Event]) -> Vec<Event> {
    batch
        .iter()
        .filter(|e| route.filter.matches(e))
        .map(|e| {
            let mut copy = e.clone();
            // The outbox pipeline numbered the event among all of its aggregate's events; the
            // subscription numbers it among those it takes (gap-free for its consumers), so
            // the copy must not carry the first number.
            copy.headers
                .retain(|(name, _)| name != outbox_core::message::header::AGGREGATE_SEQ);
            copy
        })
        .collect()
}

impl Sink for FanOut {
    fn name(&self) -> &'static str {
        "fanout"
    }

    async fn publish<'a>(&'a self, batch: &'a [Event]) -> Result<Vec<Delivery>, SinkError> {
        let routes = self.routes().await?;
        let copies = routes.iter().map(|route| async move {
            let selected = select(route, batch);
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
            if let Some(wake) = &route.wake {
                wake.notify_one();
            }
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
