//! The events' way through the [`Ledger`]: which ones a fetch may take (by ordering and
//! backoff), moving them in flight and back, the lookups the change stream needs (by
//! position, by aggregate, dead-letter suspects), and the counts.

use std::collections::HashSet;

use time::OffsetDateTime;

use super::{Entry, Ledger, Waiting};
use crate::{Event, Ordering};

impl<M: Clone> Ledger<M> {
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
