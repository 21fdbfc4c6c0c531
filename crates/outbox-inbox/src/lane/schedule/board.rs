//! The board: every key's queue of held messages, in delivery position order, and the keys
//! ready to be served.

use std::collections::{HashMap, VecDeque};

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::{Incoming, Key};

/// A message held by the lanes.
pub(super) struct Queued<D> {
    pub(super) incoming: Incoming<D>,
    /// Attempts so far, the broker's earlier deliveries included.
    pub(super) attempts: u32,
    /// `None` for a message taken in over `max_in_flight` (a held key's predecessor).
    pub(super) _slot: Option<OwnedSemaphorePermit>,
}

impl<D> Queued<D> {
    pub(super) fn seq(&self) -> Option<u64> {
        self.incoming.message.aggregate_seq
    }
}

/// Puts `queued` into its key's queue: by `aggregate_seq` (after any equal one), a message
/// without one at the back.
pub(super) fn insert_in_order<D>(queue: &mut VecDeque<Queued<D>>, queued: Queued<D>) {
    let at = queued.seq().map_or(queue.len(), |s| {
        queue
            .iter()
            .position(|q| q.seq().is_some_and(|t| t > s))
            .unwrap_or(queue.len())
    });
    queue.insert(at, queued);
}

/// Puts a message that was at the head of its key's queue (retried, or held) back there:
/// ahead of everything but a lower position that arrived meanwhile.
pub(super) fn put_back<D>(queue: &mut VecDeque<Queued<D>>, queued: Queued<D>) {
    let at = queued.seq().map_or(0, |s| {
        queue
            .iter()
            .position(|q| q.seq().is_none_or(|t| t >= s))
            .unwrap_or(queue.len())
    });
    queue.insert(at, queued);
}

/// A key whose head message waits for its predecessor.
pub(super) struct Held {
    /// When it started waiting (the gap timeout counts from here).
    pub(super) since: Instant,
    /// Waiting for a message or a recheck (not in `ready`, not with a worker).
    pub(super) parked: bool,
    /// Tells a stale recheck timer from the current one.
    pub(super) generation: u64,
}

/// The queues of every key with messages held, and the keys ready to be served.
pub(super) struct Board<D> {
    pub(super) queues: HashMap<Key, VecDeque<Queued<D>>>,
    pub(super) ready: VecDeque<Key>,
    /// Last applied position per active key, as known here (order gate).
    pub(super) applied: HashMap<Key, u64>,
    pub(super) held: HashMap<Key, Held>,
    pub(super) closed: bool,
}

impl<D> Board<D> {
    /// Makes a parked key ready (a message arrived for it, or its recheck is due).
    pub(super) fn unpark(&mut self, key: &Key, generation: Option<u64>) -> bool {
        match self.held.get_mut(key) {
            Some(h) if h.parked && generation.is_none_or(|g| g == h.generation) => {
                h.parked = false;
                self.ready.push_back(key.clone());
                true
            }
            _ => false,
        }
    }
}
