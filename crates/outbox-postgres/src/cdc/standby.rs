//! Publishing only what a synchronous standby has (`source.wait_for_standby`,
//! docs/cdc.md, "Failover").
//!
//! A logical walsender sends a transaction as soon as it is flushed on the primary, without
//! waiting for the synchronous standbys (before PostgreSQL 17's `synchronized_standby_slots`).
//! If the primary dies in that window and a standby is promoted, consumers were told about a
//! change the surviving database never had: a phantom. The gate holds committed transactions
//! until the synchronous standbys report them flushed (`pg_stat_replication`), then lets them
//! into the ledger in commit order. Nothing held is confirmed to the slot.

use std::collections::VecDeque;
use std::time::Duration;

use outbox_core::SourceError;
use sqlx::PgPool;
use tokio::time::Instant;

use crate::config::WaitForStandby;

/// How often the standbys' position is read while something waits for it.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(1);

/// The lowest position flushed by every synchronous standby, how many there are, and how many
/// of them this user may see the position of (`pg_monitor` or superuser).
const FLUSHED: &str = "SELECT count(*), count(flush_lsn), \
     (min(flush_lsn) - '0/0'::pg_lsn)::bigint \
     FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')";

/// See the module docs. `T` is what is held: a committed transaction as the source has it.
#[derive(Debug)]
pub(crate) struct StandbyGate<T> {
    active: bool,
    flushed: u64,
    held: VecDeque<(u64, usize, T)>,
    held_events: usize,
    last_poll: Option<Instant>,
}

impl<T> StandbyGate<T> {
    /// A gate that holds (`active`) or lets everything through.
    pub(crate) fn new(active: bool) -> Self {
        Self {
            active,
            flushed: 0,
            held: VecDeque::new(),
            held_events: 0,
            last_poll: None,
        }
    }

    /// Whether the gate holds transactions at all.
    pub(crate) fn active(&self) -> bool {
        self.active
    }

    /// Whether a transaction ending at `end_lsn` may go on now (nothing before it is held,
    /// and the standbys have it).
    pub(crate) fn passes(&self, end_lsn: u64) -> bool {
        !self.active || (self.held.is_empty() && end_lsn <= self.flushed)
    }

    /// Holds a transaction of `events` events ending at `end_lsn`, behind the ones held.
    pub(crate) fn hold(&mut self, end_lsn: u64, events: usize, item: T) {
        self.held_events += events;
        self.held.push_back((end_lsn, events, item));
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Events held.
    pub(crate) fn held_events(&self) -> usize {
        self.held_events
    }

    /// Reads the standbys' flushed position (at most every [`POLL_EVERY`]) while something
    /// is held.
    pub(crate) async fn poll(&mut self, pool: &PgPool) -> Result<(), SourceError> {
        if self.held.is_empty() || self.last_poll.is_some_and(|t| t.elapsed() < POLL_EVERY) {
            return Ok(());
        }
        self.last_poll = Some(Instant::now());
        let (standbys, visible, flushed): (i64, i64, Option<i64>) = crate::sql::query_as(FLUSHED)
            .fetch_one(pool)
            .await
            .map_err(|e| {
                SourceError::new(
                    crate::error::classify(&e),
                    "reading the synchronous standbys' position (pg_stat_replication)",
                )
                .with_source(e)
            })?;
        if standbys > visible {
            return Err(SourceError::fatal(
                "source.wait_for_standby: the relay's database user cannot see the synchronous standbys' positions in pg_stat_replication; GRANT pg_monitor TO it (docs/cdc.md#failover)",
            ));
        }
        if let Some(lsn) = flushed {
            self.flushed = self.flushed.max(lsn.max(0) as u64);
        }
        Ok(())
    }

    /// The held transactions the standbys now have, in commit order.
    pub(crate) fn release(&mut self) -> Vec<T> {
        let mut out = Vec::new();
        while self
            .held
            .front()
            .is_some_and(|(end, _, _)| *end <= self.flushed)
        {
            if let Some((_, events, item)) = self.held.pop_front() {
                self.held_events -= events;
                out.push(item);
            }
        }
        out
    }

    /// Forgets everything held (the stream restarts and sends it again).
    pub(crate) fn clear(&mut self) {
        self.held.clear();
        self.held_events = 0;
    }
}

/// Whether the gate is on for this server: `on`, or `auto` with `synchronous_standby_names`
/// set.
pub(crate) async fn required(pool: &PgPool, mode: WaitForStandby) -> Result<bool, SourceError> {
    match mode {
        WaitForStandby::On => Ok(true),
        WaitForStandby::Off => Ok(false),
        WaitForStandby::Auto => {
            let names: String =
                crate::sql::query_scalar("SELECT current_setting('synchronous_standby_names')")
                    .fetch_one(pool)
                    .await
                    .map_err(|e| {
                        SourceError::new(
                            crate::error::classify(&e),
                            "reading synchronous_standby_names",
                        )
                        .with_source(e)
                    })?;
            Ok(!names.trim().is_empty())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_transactions_leave_in_commit_order_once_the_standbys_have_them() {
        let mut gate = StandbyGate::new(true);
        assert!(!gate.passes(10), "nothing is known to be on a standby yet");
        gate.hold(10, 2, "a");
        gate.hold(20, 1, "b");
        gate.hold(30, 3, "c");
        assert_eq!(gate.held_events(), 6);
        gate.flushed = 25;
        assert!(!gate.passes(5), "behind what is held");
        assert_eq!(gate.release(), vec!["a", "b"]);
        assert_eq!(gate.held_events(), 3);
        gate.flushed = 30;
        assert_eq!(gate.release(), vec!["c"]);
        assert!(gate.is_empty());
        assert!(gate.passes(30) && !gate.passes(31));
    }

    #[test]
    fn an_inactive_gate_holds_nothing() {
        let gate: StandbyGate<()> = StandbyGate::new(false);
        assert!(gate.passes(u64::MAX));
    }
}
