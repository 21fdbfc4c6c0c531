//! Relay lifecycle checks: a relay told to stop drains the batch in flight, and the claim of
//! a relay that died is released to another.

use std::sync::Arc;
use std::time::Duration;

use anyhow::ensure;
use outbox_core::{DeadLetterPolicy, Ordering, Source as _};
use uuid::Uuid;

use super::Harness;
use super::events::event;
use super::relay::{WAIT, start_relay};
use crate::faults::ScriptedSink;

/// A relay told to stop finishes the batch it is publishing (acks awaited, outcomes
/// recorded) before it returns; nothing is left published-but-unrecorded.
pub async fn shutdown_drains_the_batch_in_flight<H: Harness>(h: &H) -> anyhow::Result<()> {
    let sink = Arc::new(ScriptedSink::new());
    sink.pause();
    let ids = h
        .write(
            (0..5).map(|i| event(&format!("drain-{i}"), i)).collect(),
            true,
        )
        .await?;
    let relay = start_relay(h, &sink, 1, DeadLetterPolicy::HoldAggregate, 2).await?;
    sink.wait_for_calls(1, WAIT).await?;
    relay.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    ensure!(
        !relay.handle.is_finished(),
        "relay returned while a publish was in flight"
    );
    sink.resume();
    relay.stop().await?;
    let published: std::collections::HashSet<Uuid> =
        sink.published().iter().map(|e| e.id).collect();
    for id in &ids {
        let delivered = h.recorded_delivered(*id).await?;
        ensure!(
            delivered == published.contains(id),
            "event {id}: published={} but recorded delivered={delivered} (stored {:?})",
            published.contains(id),
            h.stored(*id).await?
        );
    }
    ensure!(
        !published.is_empty(),
        "the in-flight batch was not published"
    );
    Ok(())
}

/// A batch claimed by a relay that dies before settling is claimed again and published.
pub async fn claim_of_a_dead_relay_is_released<H: Harness>(h: &H) -> anyhow::Result<()> {
    let ids = h
        .write((0..3).map(|i| event("crash", i)).collect(), true)
        .await?;
    let mut doomed = h
        .source(Ordering::PerAggregate, DeadLetterPolicy::HoldAggregate)
        .await?;
    let claimed = doomed.fetch(10, time::OffsetDateTime::now_utc()).await?;
    ensure!(
        claimed.events.len() == 3,
        "first relay claimed {} events",
        claimed.events.len()
    );
    drop(doomed); // dies without settling
    let sink = Arc::new(ScriptedSink::new());
    let relay = start_relay(h, &sink, 1, DeadLetterPolicy::HoldAggregate, 2).await?;
    let published = sink.wait_for_published(3, WAIT).await?;
    relay.stop().await?;
    let got: Vec<Uuid> = published.iter().map(|e| e.id).collect();
    ensure!(
        got == ids,
        "after the crash the broker saw {got:?}, expected {ids:?} in order"
    );
    Ok(())
}
