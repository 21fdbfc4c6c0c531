//! A subscription pipeline's source, behind the catalog: before each claim it reads the
//! subscription's state (`outbox subscription pause|resume|remove`), so a paused or removed
//! subscription claims and publishes nothing while the fan-out keeps copying into its table
//! (paused) or stops (removed). It is also woken as soon as the fan-out copied a batch.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::backend::{Backend, BoxedSource};
use outbox_core::catalog::SubscriptionState;
use outbox_core::source::{Fetched, Settlement};
use outbox_core::{Source, SourceError};
use tokio::sync::Notify;

/// What the catalog says about one subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Active,
    Paused,
    Removed,
}

/// A subscription's source, gated by its catalog state and woken by the fan-out.
pub(crate) struct Gated {
    inner: BoxedSource,
    wake: Arc<Notify>,
    outbox: Arc<dyn Backend>,
    name: String,
    /// The last state seen, to log changes once.
    seen: Option<Standing>,
}

impl Gated {
    /// A gate for subscription `name` of the outbox `outbox`.
    pub(crate) fn new(
        inner: BoxedSource,
        wake: Arc<Notify>,
        outbox: Arc<dyn Backend>,
        name: String,
    ) -> Self {
        Self {
            inner,
            wake,
            outbox,
            name,
            seen: None,
        }
    }

    /// One primary-key-ordered read of the catalog (a handful of rows).
    async fn standing(&mut self) -> Result<Standing, SourceError> {
        let catalog = self
            .outbox
            .catalog()
            .map_err(|e| SourceError::fatal(e.to_string()))?;
        let entries = catalog.list().await?;
        let now = match entries.iter().find(|e| e.name == self.name) {
            Some(e) if e.state == SubscriptionState::Active => Standing::Active,
            Some(_) => Standing::Paused,
            None => Standing::Removed,
        };
        if self.seen != Some(now) {
            match now {
                Standing::Active if self.seen.is_some() => {
                    tracing::info!(subscription = %self.name, "subscription resumed: delivering");
                }
                Standing::Active => {}
                Standing::Paused => {
                    tracing::info!(subscription = %self.name, "subscription paused in the catalog: its events are still copied, none is delivered until `outbox subscription resume`");
                }
                Standing::Removed => {
                    tracing::warn!(subscription = %self.name, "subscription is not in the catalog (removed, or never recorded): its pipeline claims nothing");
                }
            }
            self.seen = Some(now);
        }
        Ok(now)
    }
}

impl Source for Gated {
    async fn fetch(
        &mut self,
        limit: usize,
        now: time::OffsetDateTime,
    ) -> Result<Fetched, SourceError> {
        if self.standing().await? != Standing::Active {
            return Ok(Fetched::default());
        }
        self.inner.fetch(limit, now).await
    }
    fn settle(
        &mut self,
        settlements: &[Settlement],
        now: time::OffsetDateTime,
    ) -> impl std::future::Future<Output = Result<(), SourceError>> + Send {
        self.inner.settle(settlements, now)
    }
    async fn wait_for_events(&mut self, max: Duration) {
        tokio::select! {
            () = self.inner.wait_for_events(max) => {}
            () = self.wake.notified() => {}
        }
    }
}
