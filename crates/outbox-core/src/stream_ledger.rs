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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{self, AtomicBool, AtomicI64, AtomicU64};

use time::OffsetDateTime;

use crate::source::Backlog;
use crate::spill::{Spillable, SpilledTxn};
use crate::{Event, Ordering, Position, SourceError};

/// Counters a running stream source shares with its inspector (metrics, the watchdog and
/// `status` run on other tasks).
#[derive(Debug)]
pub struct LedgerStats {
    unsettled: AtomicU64,
    retrying: AtomicU64,
    /// Unix microseconds of the oldest unsettled event; `i64::MIN` when none.
    oldest_micros: AtomicI64,
    /// True while the source holds its stream.
    pub streaming: AtomicBool,
    spilled_transactions: AtomicU64,
    spilled_events: AtomicU64,
}

impl Default for LedgerStats {
    fn default() -> Self {
        Self {
            unsettled: AtomicU64::new(0),
            retrying: AtomicU64::new(0),
            oldest_micros: AtomicI64::new(i64::MIN),
            streaming: AtomicBool::new(false),
            spilled_transactions: AtomicU64::new(0),
            spilled_events: AtomicU64::new(0),
        }
    }
}

impl LedgerStats {
    /// Copies the ledger's counts.
    pub fn publish<M: Clone>(&self, ledger: &Ledger<M>) {
        let relaxed = atomic::Ordering::Relaxed;
        let on_disk = ledger.drain.as_ref().map_or(0, SpilledTxn::remaining)
            + ledger
                .waiting
                .iter()
                .map(|(w, _)| match w {
                    Waiting::Spilled(s) => s.len(),
                    Waiting::Events(_) => 0,
                })
                .sum::<usize>();
        self.unsettled
            .store((ledger.unsettled() + on_disk) as u64, relaxed);
        let spilled = ledger.spilled();
        self.spilled_transactions
            .store(spilled.transactions, relaxed);
        self.spilled_events.store(spilled.events, relaxed);
        self.retrying.store(ledger.retrying() as u64, relaxed);
        let oldest = ledger
            .oldest()
            .map_or(i64::MIN, |t| (t.unix_timestamp_nanos() / 1_000) as i64);
        self.oldest_micros.store(oldest, relaxed);
    }

    /// What the ledger has committed from scratch files, as last published.
    pub fn spilled(&self) -> Spilled {
        let relaxed = atomic::Ordering::Relaxed;
        Spilled {
            transactions: self.spilled_transactions.load(relaxed),
            events: self.spilled_events.load(relaxed),
        }
    }

    /// Sets the backlog's pending and retrying counts and the oldest pending age at `now`
    /// from the last published counts.
    pub fn fill(&self, backlog: &mut Backlog, now: OffsetDateTime) {
        let relaxed = atomic::Ordering::Relaxed;
        backlog.pending = self.unsettled.load(relaxed);
        backlog.retrying = self.retrying.load(relaxed);
        let oldest = self.oldest_micros.load(relaxed);
        if oldest != i64::MIN {
            let age = now.unix_timestamp_nanos() as f64 / 1e9 - oldest as f64 / 1e6;
            backlog.oldest_pending_age_seconds = age.max(0.0);
        }
    }
}

/// How long a stream source reads what its stream has ready in one go (`pump`, on the async
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

    /// Positions `fetch` may return at `now`, at most `limit`, in commit order.
    ///
    /// - `None`: any event not waiting on backoff.
    /// - `PerAggregate`: an event only when no earlier event of its aggregate is waiting.
    /// - `Total`: the events before the first one that is waiting.
    pub fn selectable(&self, limit: usize, now: OffsetDateTime, ordering: Ordering) -> Vec<i64> {
        let mut picked = Vec::new();
        let mut blocked: HashSet<(&str, &str)> = HashSet::new();
        for (position, e) in &self.queue {
            if picked.len() >= limit {
                break;
            }
            let ready = e.not_before.is_none_or(|t| t <= now);
            match ordering {
                Ordering::None => {
                    if ready {
                        picked.push(*position);
                    }
                }
                Ordering::Total => {
                    if !ready {
                        break;
                    }
                    picked.push(*position);
                }
                Ordering::PerAggregate => {
                    let key = (
                        e.event.aggregate_type.as_str(),
                        e.event.aggregate_id.as_str(),
                    );
                    if blocked.contains(&key) {
                        continue;
                    }
                    if ready {
                        picked.push(*position);
                    } else {
                        blocked.insert(key);
                    }
                }
            }
        }
        picked
    }

    /// Moves the selectable events in flight and returns them.
    pub fn take(&mut self, limit: usize, now: OffsetDateTime, ordering: Ordering) -> Vec<Event> {
        let picked = self.selectable(limit, now, ordering);
        let mut events = Vec::with_capacity(picked.len());
        for position in picked {
            if let Some(entry) = self.queue.remove(&position) {
                events.push(entry.event.clone());
                self.in_flight.insert(position, entry);
            }
        }
        events
    }

    /// The in-flight event at `position`, removed from flight.
    pub fn take_in_flight(&mut self, position: i64) -> Option<Entry<M>> {
        self.in_flight.remove(&position)
    }

    /// The in-flight event at `position`.
    pub fn in_flight(&self, position: i64) -> Option<&Entry<M>> {
        self.in_flight.get(&position)
    }

    /// Puts an event back in the queue (released, or retried after `not_before`).
    pub fn requeue(&mut self, entry: Entry<M>) {
        self.queue.insert(entry.event.position.0, entry);
    }

    /// Puts every in-flight event back untouched (a fetch without settle, a failed settle).
    pub fn release_in_flight(&mut self) {
        for (position, entry) in self.in_flight.drain() {
            self.queue.insert(position, entry);
        }
    }

    /// Queued events whose aggregate is in `dead` and was not checked since.
    pub fn suspects(&self, dead: &HashSet<(String, String)>) -> Vec<i64> {
        if dead.is_empty() {
            return Vec::new();
        }
        self.queue
            .iter()
            .filter(|(_, e)| {
                !e.checked
                    && dead
                        .contains(&(e.event.aggregate_type.clone(), e.event.aggregate_id.clone()))
            })
            .map(|(p, _)| *p)
            .collect()
    }

    /// Every event held: queued and in flight.
    pub fn entries(&self) -> impl Iterator<Item = &Entry<M>> {
        self.queue.values().chain(self.in_flight.values())
    }

    /// The queued events, in commit order.
    pub fn queued(&self) -> impl Iterator<Item = &Entry<M>> {
        self.queue.values()
    }

    /// The queued events at positions after `after`, in commit order.
    pub fn queued_after(&self, after: i64) -> impl Iterator<Item = &Entry<M>> {
        self.queue.range(after.saturating_add(1)..).map(|(_, e)| e)
    }

    /// The queued events at positions after `after`, in commit order, each with the stream
    /// position its transaction ends at.
    pub fn queued_after_mut(&mut self, after: i64) -> impl Iterator<Item = (u64, &mut Entry<M>)> {
        let (first, txns) = (self.first_txn, &self.txns);
        self.queue
            .range_mut(after.saturating_add(1)..)
            .map(move |(_, e)| {
                let end = e
                    .txn
                    .checked_sub(first)
                    .and_then(|i| txns.get(i as usize))
                    .map_or(0, |t| t.end_lsn);
                (end, e)
            })
    }

    /// The queued event at `position`.
    pub fn queued_at(&self, position: i64) -> Option<&Entry<M>> {
        self.queue.get(&position)
    }

    /// The queued event at `position`, to change.
    pub fn queued_mut(&mut self, position: i64) -> Option<&mut Entry<M>> {
        self.queue.get_mut(&position)
    }

    /// Removes the queued event at `position`.
    pub fn remove_queued(&mut self, position: i64) -> Option<Entry<M>> {
        self.queue.remove(&position)
    }

    /// Marks the queued events of `aggregate` for a new dead-letter check.
    pub fn uncheck(&mut self, aggregate: &(String, String)) {
        for e in self.queue.values_mut() {
            if e.event.aggregate_type == aggregate.0 && e.event.aggregate_id == aggregate.1 {
                e.checked = false;
            }
        }
    }

    /// Events received and not settled for good, in memory (queued, in flight, or waiting
    /// behind a spilled transaction).
    pub fn unsettled(&self) -> usize {
        let waiting: usize = self
            .waiting
            .iter()
            .map(|(w, _)| match w {
                Waiting::Events(events) => events.len(),
                Waiting::Spilled(_) => 0,
            })
            .sum();
        self.queue.len() + self.in_flight.len() + waiting
    }

    /// Queued events waiting on a retry's backoff.
    pub fn retrying(&self) -> usize {
        self.queue.values().filter(|e| e.event.attempts > 0).count()
    }

    /// Creation time of the oldest unsettled event.
    pub fn oldest(&self) -> Option<OffsetDateTime> {
        let queued = self.queue.values().next().map(|e| e.event.created_at);
        let flying = self.in_flight.values().map(|e| e.event.created_at).min();
        match (queued, flying) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest backoff deadline after `now`, to wake up for it.
    pub fn next_due(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        self.queue
            .values()
            .filter_map(|e| e.not_before)
            .filter(|t| *t > now)
            .min()
    }

    /// Committed transactions not yet confirmed.
    pub fn open_transactions(&self) -> usize {
        self.txns.len()
    }
}

impl<M: Clone + Spillable> Ledger<M> {
    /// Records a committed transaction whose events are in a scratch file; they are loaded
    /// by [`Ledger::refill`] (after those of an earlier one still loading). The source should
    /// read no more of its stream until [`Ledger::draining`] is false.
    pub fn commit_spilled(&mut self, events: SpilledTxn<(Event, M)>, end_lsn: u64) {
        self.spilled.transactions += 1;
        self.spilled.events += events.len() as u64;
        if self.drain.is_some() {
            self.waiting.push_back((Waiting::Spilled(events), end_lsn));
            return;
        }
        self.start_loading(events, end_lsn);
    }

    fn start_loading(&mut self, events: SpilledTxn<(Event, M)>, end_lsn: u64) {
        tracing::info!(
            events = events.len(),
            file_bytes = events.file_bytes(),
            "a large transaction committed; loading it from its scratch file in batches"
        );
        self.txns.push_back(Txn {
            end_lsn,
            remaining: 0,
            loading: true,
        });
        self.drain = Some(events);
    }

    /// Loads events of the spilled transaction, if any, until `max_unsettled` are held, at
    /// most [`REFILL_BATCH`] per call (the file is read on the caller's thread).
    pub fn refill(&mut self, max_unsettled: usize) -> Result<(), SourceError> {
        let room = max_unsettled
            .saturating_sub(self.unsettled())
            .min(REFILL_BATCH);
        let Some(drain) = self.drain.as_mut() else {
            return Ok(());
        };
        let batch = drain.next_batch(room).map_err(|e| {
            SourceError::unavailable("reading a large transaction back from its scratch file")
                .with_source(e)
        })?;
        let done = drain.remaining() == 0;
        self.enqueue(batch);
        if done {
            self.drain = None;
            if let Some(last) = self.txns.back_mut() {
                last.loading = false;
            }
            // What committed meanwhile, up to the next spilled transaction.
            while let Some((next, end_lsn)) = self.waiting.pop_front() {
                match next {
                    Waiting::Events(events) => {
                        self.commit(events, end_lsn);
                    }
                    Waiting::Spilled(events) => {
                        self.start_loading(events, end_lsn);
                        break;
                    }
                }
            }
            self.advance();
        }
        Ok(())
    }

    /// `wait_for_events` while [`Ledger::draining`]: it reads no stream but loads what fits
    /// and, when nothing is selectable (all in flight or backing off), waits until `deadline`.
    pub async fn wait_draining(
        &mut self,
        max_unsettled: usize,
        ordering: Ordering,
        deadline: tokio::time::Instant,
    ) -> Result<(), SourceError> {
        self.refill(max_unsettled)?;
        if self
            .selectable(1, OffsetDateTime::now_utc(), ordering)
            .is_empty()
        {
            tokio::time::sleep_until(deadline).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ev(agg: &str) -> (Event, ()) {
        (
            Event {
                id: uuid::Uuid::now_v7(),
                position: Position(0),
                aggregate_type: "T".into(),
                aggregate_id: agg.into(),
                event_type: "e".into(),
                payload: bytes::Bytes::new(),
                headers: vec![],
                created_at: OffsetDateTime::UNIX_EPOCH,
                attempts: 0,
            },
            (),
        )
    }

    fn settle_delivered(l: &mut Ledger<()>, position: i64) -> Option<u64> {
        let e = l.take_in_flight(position).expect("in flight");
        l.finish(&e)
    }

    #[test]
    fn the_slot_is_confirmed_only_over_a_fully_settled_prefix_of_transactions() {
        let now = OffsetDateTime::now_utc();
        let mut l = Ledger::<()>::new(100);
        assert_eq!(l.commit(vec![ev("a"), ev("b")], 200), None);
        assert_eq!(l.commit(vec![ev("c")], 300), None);
        assert_eq!(
            l.commit(vec![], 400),
            None,
            "an empty transaction waits behind others"
        );
        let batch = l.take(10, now, Ordering::PerAggregate);
        assert_eq!(
            batch.iter().map(|e| e.position.0).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        // The second transaction is settled first: nothing moves.
        assert_eq!(settle_delivered(&mut l, 3), None);
        assert_eq!(settle_delivered(&mut l, 1), None);
        // Event 2 is retried: the first transaction stays open, so does everything after it.
        let mut two = l.take_in_flight(2).expect("in flight");
        two.event.attempts += 1;
        two.not_before = Some(now + Duration::from_secs(60));
        l.requeue(two);
        assert_eq!(l.confirmed(), 100);
        assert!(l.take(10, now, Ordering::PerAggregate).is_empty());
        let later = now + Duration::from_secs(61);
        assert_eq!(l.take(10, later, Ordering::PerAggregate).len(), 1);
        assert_eq!(settle_delivered(&mut l, 2), Some(400));
        assert_eq!(l.open_transactions(), 0);
        assert_eq!(l.idle_confirm(450), Some(450));
        assert_eq!(l.idle_confirm(420), None);
    }

    #[test]
    fn an_event_waiting_on_backoff_holds_its_aggregate_or_everything_with_total_order() {
        let now = OffsetDateTime::now_utc();
        let mut l = Ledger::<()>::new(0);
        l.commit(vec![ev("a"), ev("b"), ev("a"), ev("c")], 10);
        let first = l.take(1, now, Ordering::PerAggregate);
        let mut a1 = l.take_in_flight(first[0].position.0).expect("in flight");
        a1.not_before = Some(now + Duration::from_secs(5));
        a1.event.attempts = 1;
        l.requeue(a1);
        assert_eq!(l.selectable(10, now, Ordering::PerAggregate), vec![2, 4]);
        assert_eq!(l.selectable(10, now, Ordering::Total), Vec::<i64>::new());
        assert_eq!(l.selectable(10, now, Ordering::None), vec![2, 3, 4]);
        assert_eq!(l.retrying(), 1);
        assert_eq!(l.next_due(now), Some(now + Duration::from_secs(5)));
    }

    fn spilled(events: Vec<(Event, ())>) -> SpilledTxn<(Event, ())> {
        let settings = std::sync::Arc::new(crate::spill::SpillSettings {
            after_events: 3,
            ..Default::default()
        });
        let mut buffer = crate::spill::TxnBuffer::new(settings, None);
        for e in events {
            buffer.push(e).expect("push");
        }
        match buffer.take().expect("take") {
            crate::spill::Buffered::Spilled(s) => s,
            crate::spill::Buffered::Memory(_) => panic!("not spilled"),
        }
    }

    #[test]
    fn a_spilled_transaction_loads_in_bounded_batches_and_confirms_only_once_all_settled() {
        let now = OffsetDateTime::now_utc();
        let mut l = Ledger::<()>::new(0);
        l.commit(vec![ev("a")], 10);
        let big: Vec<_> = (0..10).map(|i| ev(&format!("b{i}"))).collect();
        let ids: Vec<_> = big.iter().map(|(e, _)| e.id).collect();
        l.commit_spilled(spilled(big), 20);
        assert!(l.draining());
        assert_eq!(
            l.spilled(),
            Spilled {
                transactions: 1,
                events: 10
            }
        );
        let mut seen = Vec::new();
        while l.unsettled() > 0 || l.draining() {
            l.refill(4).expect("refill");
            assert!(l.unsettled() <= 4, "bounded: {}", l.unsettled());
            for e in l.take(2, now, Ordering::Total) {
                seen.push(e.id);
                settle_delivered(&mut l, e.position.0);
            }
            if l.draining() {
                assert_eq!(l.confirmed(), 10, "not confirmed while loading");
            }
        }
        assert_eq!(
            seen[1..],
            ids[..],
            "commit order, then the spilled one in order"
        );
        assert_eq!(l.confirmed(), 20);
        assert_eq!(l.open_transactions(), 0);
    }

    #[test]
    fn transactions_committed_while_one_loads_wait_behind_it_in_commit_order() {
        let now = OffsetDateTime::now_utc();
        let mut l = Ledger::<()>::new(0);
        let batch =
            |n: usize, tag: &str| -> Vec<_> { (0..n).map(|i| ev(&format!("{tag}{i}"))).collect() };
        let ids = |events: &[(Event, ())]| events.iter().map(|(e, _)| e.id).collect::<Vec<_>>();
        let (a, b, c, d) = (batch(7, "a"), batch(2, "b"), batch(5, "c"), batch(1, "d"));
        let expected: Vec<_> = [ids(&a), ids(&b), ids(&c), ids(&d)].concat();
        l.commit_spilled(spilled(a), 10);
        assert_eq!(l.commit(b, 20), None);
        l.commit_spilled(spilled(c), 30);
        l.commit(d, 40);
        assert_eq!(l.unsettled(), 3, "the waiting events in memory count");
        let mut seen = Vec::new();
        while l.unsettled() > 0 || l.draining() {
            l.refill(4).expect("refill");
            for e in l.take(3, now, Ordering::Total) {
                seen.push(e.id);
                settle_delivered(&mut l, e.position.0);
            }
        }
        assert_eq!(seen, expected);
        assert_eq!(l.confirmed(), 40);
        assert_eq!(
            l.spilled(),
            Spilled {
                transactions: 2,
                events: 12
            }
        );
    }

    #[test]
    fn a_reset_drops_a_spilled_transaction_being_loaded() {
        let mut l = Ledger::<()>::new(0);
        l.commit_spilled(spilled((0..5).map(|_| ev("a")).collect()), 10);
        l.refill(2).expect("refill");
        l.reset(0);
        assert!(!l.draining());
        assert_eq!(l.unsettled(), 0);
        assert_eq!(l.confirmed(), 0);
    }

    #[test]
    fn a_reset_forgets_the_unconfirmed_tail_but_never_reuses_positions() {
        let now = OffsetDateTime::now_utc();
        let mut l = Ledger::<()>::new(0);
        l.commit(vec![ev("a"), ev("b")], 10);
        let _ = l.take(1, now, Ordering::None);
        l.reset(5);
        assert_eq!(l.unsettled(), 0);
        assert_eq!(l.confirmed(), 5);
        assert!(
            l.take_in_flight(1).is_none(),
            "a stale settlement finds nothing"
        );
        l.commit(vec![ev("a")], 10);
        assert_eq!(l.take(1, now, Ordering::None)[0].position, Position(3));
    }
}
