//! The failures the demo injects on purpose.

use outbox_core::sink::Delivery;
use outbox_core::{Event, Sink, SinkError};
use rand::Rng;

/// Publishes a fraction of the batches twice, awaiting both: what a consumer sees when a
/// relay crashed after the broker acknowledged a batch and before it recorded the batch as
/// delivered (the next relay publishes it again). The second publish's outcome is ignored;
/// the first one's is returned.
#[derive(Debug)]
pub struct Redeliver<S> {
    inner: S,
    rate: f64,
}

impl<S> Redeliver<S> {
    /// Wraps `inner`; `rate` in `[0, 1]` is the fraction of batches published twice.
    pub fn new(inner: S, rate: f64) -> Self {
        Self {
            inner,
            rate: rate.clamp(0.0, 1.0),
        }
    }
}

impl<S: Sink> Sink for Redeliver<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn publish<'a>(&'a self, batch: &'a [Event]) -> Result<Vec<Delivery>, SinkError> {
        let deliveries = self.inner.publish(batch).await?;
        if rand::rng().random_bool(self.rate) {
            tracing::info!(
                events = batch.len(),
                "chaos: publishing this batch a second time"
            );
            let _ = self.inner.publish(batch).await;
        }
        Ok(deliveries)
    }

    async fn healthcheck(&self) -> Result<(), SinkError> {
        self.inner.healthcheck().await
    }
}

/// Whether to lose the acknowledgement of a first delivery, with probability `rate`.
pub fn lose_ack(rate: f64) -> bool {
    rand::rng().random_bool(rate.clamp(0.0, 1.0))
}
