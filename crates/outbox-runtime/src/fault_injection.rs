//! Ordering broken on purpose (cargo feature `fault-injection`, never in a default build):
//! the relay of a binary built with it publishes each claimed batch in **reverse order**, so
//! `outbox crash-test` has a relay to catch.
//!
//! The fault sits between the source and the relay, not in the sink: with ordering on, the
//! relay hands the sink one event per aggregate at a time (a *wave*), so a sink that
//! reversed what it is given would break nothing. Reversing the batch before the relay splits
//! it into waves sends each aggregate's later events first. Nothing is lost: every event is
//! still published and settled.

use outbox_core::backend::BoxedSource;
use outbox_core::source::{Fetched, Settlement, Source, SourceError};
use time::OffsetDateTime;

/// Wraps every source so that its batches come out reversed; logs a warning that says so.
pub(crate) fn reverse_batches(sources: Vec<BoxedSource>) -> Vec<BoxedSource> {
    tracing::warn!(
        "this relay was built with the `fault-injection` feature: it publishes every batch in reverse order, breaking per-aggregate order on purpose; never run it in production"
    );
    sources
        .into_iter()
        .map(|inner| BoxedSource::new(Reversed { inner }))
        .collect()
}

/// A source whose batches come out in reverse order.
struct Reversed {
    inner: BoxedSource,
}

impl Source for Reversed {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        let mut fetched = self.inner.fetch(limit, now).await?;
        fetched.events.reverse();
        Ok(fetched)
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        self.inner.settle(settlements, now).await
    }

    async fn wait_for_events(&mut self, max: std::time::Duration) {
        self.inner.wait_for_events(max).await;
    }
}
