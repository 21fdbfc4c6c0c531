//! The change-stream source's machinery, shared by every database that streams its outbox
//! from a log (PostgreSQL logical replication, the MySQL/MariaDB binlog).
//!
//! A database supplies a log reader ([`LogReader`]: open a session, read the next item, apply
//! it to the ledger at its commit) and its SQL (dead letters, put-back rows, the saved
//! position). This module owns what is the same whatever the log:
//!
//! - [`ChangeStream`]: the in-memory ledger ([`crate::stream_ledger`]), the aggregates checked
//!   against their dead letters before their events go out, and the failure a wait saw.
//! - `claim.rs`: the single streamer and its standbys ([`StreamClaim`]).
//! - `reader.rs`: reading the log: what is ready ([`pump`]), up to the head seen at the start
//!   ([`catch_up`]), and waiting for a commit ([`wait_for_events`]).
//! - `settle.rs`: a batch's outcomes applied to the ledger.
//! - `dead.rs`: events of aggregates with dead letters: dropped when already dead, parked
//!   behind the dead letter with `hold-aggregate`.
//!
//! Position keeping is the ledger's confirmation rule; `aggregate_seq` numbering is
//! [`crate::aggregate_seq::StreamPositions`].

mod claim;
mod dead;
mod reader;
mod settle;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::Arc;

pub use claim::{STANDBY_RETRY, StreamClaim};
pub use reader::{LogReader, catch_up, pump, wait_for_events};

use crate::stream_ledger::{Entry, Ledger, LedgerStats};
use crate::{DeadLetterPolicy, Ordering, SourceError};

/// Events kept in memory (received, not yet settled for good) before a source stops reading
/// its log; the server then waits (TCP backpressure). An open transaction is always read to
/// its commit (its events exist only then): past `source.spill_after_*` it goes to a scratch
/// file, and after its commit it is loaded from there in batches up to this bound.
pub const MAX_BUFFERED: usize = 50_000;

/// An aggregate: `(aggregate_type, aggregate_id)`.
pub type Aggregate = (String, String);

/// An event to dead-letter: its entry, its attempts, the reason.
pub type DeadLetter<M> = (Entry<M>, i32, String);

/// What the machinery needs to know about an event's source metadata.
pub trait StreamMeta: Clone {
    /// A dead letter put back in line (`outbox dead retry`, `replay`), not delivered since.
    fn put_back(&self) -> bool;
}

/// The state every change-stream source keeps, whatever its log.
#[derive(Debug)]
pub struct ChangeStream<M> {
    /// Received, unconfirmed transactions and their events.
    pub ledger: Ledger<M>,
    /// The relay's ordering.
    pub ordering: Ordering,
    /// `dead_letter = "hold-aggregate"` with an ordering: events wait behind a dead letter.
    pub hold: bool,
    /// Aggregates known to have dead letters, or dead letters put back in line and not
    /// delivered since (checked against the table before use).
    pub dead: HashSet<Aggregate>,
    /// A stream failure seen in `wait_for_events`, returned by the next `fetch`.
    pub failure: Option<SourceError>,
    /// After (re)starting: the log's head at the start. Until the stream has passed it,
    /// `fetch` waits for it ([`catch_up`]), so the first batch holds what was committed
    /// before the start.
    pub catch_up: Option<u64>,
    /// The single streamer and its standbys.
    pub claim: StreamClaim,
    /// Counters shared with the source's inspector.
    pub stats: Arc<LedgerStats>,
}

impl<M: Clone> ChangeStream<M> {
    /// A stream with an empty ledger, not yet open.
    pub fn new(ordering: Ordering, dead_letter: DeadLetterPolicy) -> Self {
        Self {
            ledger: Ledger::new(0),
            ordering,
            hold: dead_letter == DeadLetterPolicy::HoldAggregate && ordering != Ordering::None,
            dead: HashSet::new(),
            failure: None,
            catch_up: None,
            claim: StreamClaim::default(),
            stats: Arc::new(LedgerStats::default()),
        }
    }

    /// Copies the ledger's counts for the inspector.
    pub fn publish_stats(&self) {
        self.stats.publish(&self.ledger);
    }

    /// Marks whether this source holds the stream (for the inspector).
    pub fn set_streaming(&self, streaming: bool) {
        self.stats
            .streaming
            .store(streaming, std::sync::atomic::Ordering::Relaxed);
    }

    /// Clears the catch-up barrier once the stream reached `position`.
    pub fn reached(&mut self, position: u64) {
        if self.catch_up.is_some_and(|barrier| position >= barrier) {
            self.catch_up = None;
        }
    }
}
