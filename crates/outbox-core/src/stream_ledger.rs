//! The in-memory ledger of a change-stream source (PostgreSQL logical replication, the MySQL
//! binlog): committed transactions whose stream position is not yet confirmed, the events
//! waiting to be fetched, and the events fetched but not yet settled.
//!
//! Confirmation rule: the confirmed stream position advances to the end of a transaction only
//! when that transaction and every transaction before it have all their events settled for
//! good (delivered or dead-lettered). A retried or released event keeps its transaction, and
//! every later one, unconfirmed: after a crash the stream resumes from there and republishes
//! the unconfirmed tail (duplicates, never loss). Stream positions are `u64`s that grow with
//! commit order (an LSN; a binlog file number and offset packed into one number).
//!
//! Positions of events are a source-assigned counter, increasing in commit order and never
//! reused within a source (also across reconnects), so a stale settlement can never hit a
//! new event. Each event carries the source's own metadata `M` (where it came from, its
//! transaction id) for dead-lettering.
//!
//! A transaction too large to hold ([`crate::spill`]) is committed from its scratch file
//! ([`Ledger::commit_spilled`]) and loaded in batches as room frees up ([`Ledger::refill`]). It
//! is confirmed only once every one of its events is loaded and settled. While it is loading,
//! transactions committed after it wait behind it, whole, so commit order holds; the source
//! should read nothing more from its stream meanwhile ([`Ledger::draining`]), so that memory
//! stays bounded.
//!
//! By concern: this module holds the transactions and the confirmation rule; `queue` the
//! events' way through the ledger (selection, flight, lookups, counts); `spilled` the loading
//! of transactions from scratch files; `stats` the counters published to the inspector.

use std::collections::{BTreeMap, HashMap, VecDeque};

use time::OffsetDateTime;

use crate::spill::SpilledTxn;
use crate::{Event, Position};

mod queue;
mod report;
mod spilled;
mod stats;

pub use stats::LedgerStats;

/// thread, in `fetch`): a huge transaction is read over several fetches, so the source keeps
/// answering (the MySQL source checks its lock at every fetch) while it comes in.
pub const PUMP_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// Events [`Ledger::refill`] reads from a scratch file at most per call: a few milliseconds of
/// reading on the async thread, and still ten of the relay's default batches.
pub const REFILL_BATCH: usize = 5_000;

/// One unsettled event.
#[derive(Debug, Clone)]
pub struct Entry<M> {
    /// The event as it will be (or was) published.
    pub event: Event,
    /// The source's own metadata about it.
    pub meta: M,
    /// The transaction it belongs to.
    txn: u64,
    /// Not fetched again before this time (a retry's backoff).
    pub not_before: Option<OffsetDateTime>,
    /// Its aggregate was checked against the table's dead letters since it last changed.
    pub checked: bool,
}

impl<M> Entry<M> {
    /// The ordering key.
    pub fn aggregate(&self) -> (String, String) {
        (
            self.event.aggregate_type.clone(),
            self.event.aggregate_id.clone(),
        )
    }
}

#[derive(Debug)]
struct Txn {
    end_lsn: u64,
    remaining: usize,
    /// Some of its events are still in the scratch file (`Ledger::drain`).
    loading: bool,
}

/// A committed transaction behind one that is loading from its scratch file.
#[derive(Debug)]
enum Waiting<M> {
    Events(Vec<(Event, M)>),
    Spilled(SpilledTxn<(Event, M)>),
}

/// Transactions committed from scratch files since the ledger was made, and their events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spilled {
    /// Transactions.
    pub transactions: u64,
    /// Their events.
    pub events: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct Ledger<M> {
    next_position: i64,
    /// Id of `txns[0]`.
    first_txn: u64,
    txns: VecDeque<Txn>,
    queue: BTreeMap<i64, Entry<M>>,
    in_flight: HashMap<i64, Entry<M>>,
    confirmed: u64,
    /// The last transaction's events still in its scratch file.
    drain: Option<SpilledTxn<(Event, M)>>,
    /// Transactions committed while `drain` loads, with their end positions, in commit order.
    waiting: VecDeque<(Waiting<M>, u64)>,
    spilled: Spilled,
}

impl<M: Clone> Ledger<M> {
    /// An empty ledger whose stream is confirmed up to `confirmed`.
    pub fn new(confirmed: u64) -> Self {
        Self {
            next_position: 1,
            first_txn: 0,
            txns: VecDeque::new(),
            queue: BTreeMap::new(),
            in_flight: HashMap::new(),
            confirmed,
            drain: None,
            waiting: VecDeque::new(),
            spilled: Spilled::default(),
        }
    }

    /// Forgets everything unconfirmed (the stream restarts from `confirmed` and sends it
    /// again); positions keep increasing.
    pub fn reset(&mut self, confirmed: u64) {
        self.first_txn += self.txns.len() as u64;
        self.txns.clear();
        self.queue.clear();
        self.in_flight.clear();
        self.drain = None;
        self.waiting.clear();
        self.confirmed = confirmed;
    }

    /// The stream position that may be confirmed (all before it is settled for good).
    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    /// Records a committed transaction; returns the new confirmed LSN if it moved (a
    /// transaction without events confirms at once when nothing precedes it). While a spilled
    /// transaction loads, it waits behind it.
    pub fn commit(&mut self, events: Vec<(Event, M)>, end_lsn: u64) -> Option<u64> {
        if self.drain.is_some() {
            self.waiting.push_back((Waiting::Events(events), end_lsn));
            return None;
        }
        self.txns.push_back(Txn {
            end_lsn,
            remaining: 0,
            loading: false,
        });
        self.enqueue(events);
        self.advance()
    }

    /// Adds `events` to the last transaction.
    fn enqueue(&mut self, events: Vec<(Event, M)>) {
        let Some(last) = self.txns.back_mut() else {
            return;
        };
        last.remaining += events.len();
        let txn = self.first_txn + self.txns.len() as u64 - 1;
        for (mut event, meta) in events {
            let position = self.next_position;
            self.next_position += 1;
            event.position = Position(position);
            self.queue.insert(
                position,
                Entry {
                    event,
                    meta,
                    txn,
                    not_before: None,
                    checked: false,
                },
            );
        }
    }

    /// Confirms the server's position when nothing is outstanding; returns it if it moved.
    pub fn idle_confirm(&mut self, wal_end: u64) -> Option<u64> {
        if self.txns.is_empty() && wal_end > self.confirmed {
            self.confirmed = wal_end;
            Some(wal_end)
        } else {
            None
        }
    }

    fn advance(&mut self) -> Option<u64> {
        let before = self.confirmed;
        while self
            .txns
            .front()
            .is_some_and(|t| t.remaining == 0 && !t.loading)
        {
            if let Some(t) = self.txns.pop_front() {
                self.confirmed = self.confirmed.max(t.end_lsn);
                self.first_txn += 1;
            }
        }
        (self.confirmed != before).then_some(self.confirmed)
    }

    /// True while a transaction committed from its scratch file is not loaded whole: the
    /// source must not read its stream (the next transaction would overtake it).
    pub fn draining(&self) -> bool {
        self.drain.is_some()
    }

    /// What was committed from scratch files so far.
    pub fn spilled(&self) -> Spilled {
        self.spilled
    }

    /// Marks an event settled for good (delivered, dead-lettered, or found already dead);
    /// returns the new confirmed LSN if it moved.
    pub fn finish(&mut self, entry: &Entry<M>) -> Option<u64> {
        if let Some(i) = entry.txn.checked_sub(self.first_txn)
            && let Some(t) = self.txns.get_mut(i as usize)
        {
            t.remaining = t.remaining.saturating_sub(1);
        }
        self.advance()
    }
}

#[cfg(test)]
pub(crate) mod tests;
