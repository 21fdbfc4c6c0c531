//! The source conformance suite: what every outbox source must do, checked the same way for
//! each database. A database crate implements [`Harness`] for a fresh outbox and calls
//! [`run_all`]; adding a source adds one call.
//!
//! Each check drives the real [`Relay`](outbox_core::Relay) over the real source, with a
//! [`ScriptedSink`](crate::faults::ScriptedSink) as the broker, and asserts what the broker saw
//! and what the table recorded. The checks are grouped by what they hold the source to:
//! `ordering` (per-aggregate and commit order, delivery positions), `failures` (rollbacks,
//! dead letters, retries, broker outages) and `lifecycle` (shutdown and crashed relays); `relay`
//! runs the relay under test ([`RunningRelay`], [`test_relay_config`]) and `events` writes the
//! test events and reads what the broker saw.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, bail};
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering, Source};
use uuid::Uuid;

mod events;
mod failures;
mod lifecycle;
mod ordering;
mod relay;

pub use failures::{
    broker_outage_loses_nothing_and_counts_no_attempts,
    poison_event_is_dead_lettered_and_holds_only_its_aggregate,
    poison_event_is_dead_lettered_and_skipped, rolled_back_transaction_never_reaches_the_broker,
    transient_failures_retry_then_recover_or_dead_letter,
};
pub use lifecycle::{claim_of_a_dead_relay_is_released, shutdown_drains_the_batch_in_flight};
pub use ordering::{
    committed_events_arrive_in_per_aggregate_order,
    concurrent_writers_reach_the_broker_in_commit_order,
    delivery_positions_are_contiguous_per_aggregate,
};
pub use relay::{RunningRelay, test_relay_config};

/// What the table says about one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// `pending`, `delivered` or `dead`.
    pub state: String,
    /// Failed attempts recorded.
    pub attempts: i32,
}

/// One fresh outbox in one database, as the suite needs it.
pub trait Harness: Send + Sync + 'static {
    /// The source under test.
    type Source: Source;
    /// A new source (a relay replica's pipeline) on this outbox.
    fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> impl Future<Output = anyhow::Result<Self::Source>> + Send;
    /// Writes `events` in ONE transaction and commits it (`commit = true`) or rolls it back.
    fn write(
        &self,
        events: Vec<NewEvent>,
        commit: bool,
    ) -> impl Future<Output = anyhow::Result<Vec<Uuid>>> + Send;
    /// The stored state of an event; `None` when there is no row (deleted or never written).
    fn stored(&self, id: Uuid) -> impl Future<Output = anyhow::Result<Option<StoredEvent>>> + Send;
    /// Whether several sources may relay one outbox concurrently (replicas).
    fn replicas(&self) -> usize;
    /// Whether the source numbers each aggregate's deliveries (`aggregate_seq`,
    /// `outbox_core::aggregate_seq`): the SQL sources do (polling and PostgreSQL CDC); the
    /// DynamoDB stream source does not.
    fn assigns_positions(&self) -> bool {
        true
    }
    /// The commit-order oracle of [`concurrent_writers_reach_the_broker_in_commit_order`]:
    /// in ONE transaction, writes `event` and bumps a per-aggregate business counter
    /// (`UPDATE counters SET n = n + 1 WHERE aggregate = ... RETURNING n`, creating the row
    /// at 0 when missing), the outbox row first when `outbox_first` (a producer that inserts
    /// its event before it touches the business row), else the counter first; waits `hold`
    /// between the two statements, then commits. Returns the event id and the counter value
    /// it committed: the counter's row lock makes those values 1, 2, 3, ... in commit order
    /// per aggregate, whatever the outbox's own ids or sequence say.
    fn write_counted(
        &self,
        event: NewEvent,
        outbox_first: bool,
        hold: Duration,
    ) -> impl Future<Output = anyhow::Result<(Uuid, i64)>> + Send {
        let _ = (event, outbox_first, hold);
        async { bail!("this harness does not implement write_counted (the commit-order oracle)") }
    }
    /// Whether the outbox recorded `id` as delivered, once the relay stopped. By default the
    /// stored row says `delivered` (or is gone). A source that records delivery elsewhere
    /// (CDC: the slot's confirmed position; rows stay `pending`) overrides this.
    fn recorded_delivered(&self, id: Uuid) -> impl Future<Output = anyhow::Result<bool>> + Send {
        async move {
            Ok(self
                .stored(id)
                .await?
                .is_none_or(|s| s.state == "delivered"))
        }
    }
}

/// Runs every check in turn against fresh outboxes from `new_harness`.
pub async fn run_all<H, F, Fut>(new_harness: F) -> anyhow::Result<()>
where
    H: Harness,
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<H>>,
{
    crate::run_checks!(
        "conformance",
        new_harness,
        [
            committed_events_arrive_in_per_aggregate_order,
            rolled_back_transaction_never_reaches_the_broker,
            poison_event_is_dead_lettered_and_holds_only_its_aggregate,
            poison_event_is_dead_lettered_and_skipped,
            transient_failures_retry_then_recover_or_dead_letter,
            broker_outage_loses_nothing_and_counts_no_attempts,
            shutdown_drains_the_batch_in_flight,
            claim_of_a_dead_relay_is_released,
            concurrent_writers_reach_the_broker_in_commit_order,
            delivery_positions_are_contiguous_per_aggregate,
        ]
    )
}
