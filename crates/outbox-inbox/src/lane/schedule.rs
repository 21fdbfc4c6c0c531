//! The scheduler behind [`Lanes`]: a queue per key, served by `lanes` workers.
//!
//! A key is *active* while one of its messages is in a handler, waiting for a retry, or held
//! by the order gate; only a key that is not active is *ready*, and workers take the head
//! message of the next ready key. So one key's messages are handled one at a time, in
//! delivery order (in `aggregate_seq` order when messages carry it); a failed message goes
//! back into its key's queue after its backoff, and during the backoff the key holds no
//! worker: other keys keep flowing. At most `max_in_flight` messages are held in all (a
//! semaphore permit travels with each message until it is settled), except a message that
//! may be the missing predecessor of a held key: it is taken in over the limit, or a full
//! loop would wait for the gap timeout.
//!
//! With an order gate ([`ConsumerOrder`]), before a handler runs the worker compares the
//! message's position with the last one applied for its aggregate (cached, read from the
//! gate when the message is not the next one): the next or an older one runs (an older one
//! is a duplicate for the inbox, or a deliberate redelivery from a dead-letter queue);
//! a later one is *held*: back into its queue, the key parked until a message arrives for
//! it or a recheck timer fires (10 ms, growing to 1 s), until `gap_timeout`.
//!
//! Every message the lanes hold is kept alive with the broker (`Settle::keep_alive_every`):
//! queued and held ones by a sweeper, a message in its handler or its backoff by its worker.
//!
//! By concern: `settle` (the broker's side of a delivery), `board` (the per-key queues),
//! this module (the lanes, taking deliveries in and handing ready keys to workers), `order`
//! (the order gate: holding a message for its predecessor) and `attempt` (one handler
//! attempt and what follows it: ack, retry, dead letter, release).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{ConsumerOrder, ConsumerReport, Counters, LanePolicy, MessageHandler};
use crate::InboxMessage;

mod attempt;
mod board;
mod order;
mod settle;

use board::{Board, Queued, insert_in_order, put_back};
pub(crate) use settle::{Incoming, Settle};

/// The ordering key: `(aggregate_type, aggregate_id)`.
type Key = (String, String);

type BoxedHandler =
    Arc<dyn Fn(InboxMessage) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

struct Shared<S: Settle> {
    board: Mutex<Board<S::Handle>>,
    wake: Notify,
    settle: Arc<S>,
    handler: BoxedHandler,
    counters: Counters,
    policy: LanePolicy,
    order: Option<ConsumerOrder>,
    shutdown: CancellationToken,
}

/// The running lanes of one consumer loop.
pub(crate) struct Lanes<S: Settle> {
    shared: Arc<Shared<S>>,
    slots: Arc<Semaphore>,
    workers: Vec<JoinHandle<()>>,
}

impl<S: Settle> Lanes<S> {
    /// Starts `policy.lanes` workers calling `handler`, with the order gate `order` if any.
    /// They release what they hold once `shutdown` is cancelled.
    pub(crate) fn start<H: MessageHandler>(
        policy: &LanePolicy,
        order: Option<ConsumerOrder>,
        settle: Arc<S>,
        handler: H,
        shutdown: &CancellationToken,
    ) -> Self {
        let handler: BoxedHandler = Arc::new(move |m| {
            let call = crate::trace::call(&handler, m);
            Box::pin(async move { call.await.map_err(|e| e.to_string()) })
        });
        let shared = Arc::new(Shared {
            board: Mutex::new(Board {
                queues: HashMap::new(),
                ready: VecDeque::new(),
                applied: HashMap::new(),
                held: HashMap::new(),
                closed: false,
            }),
            wake: Notify::new(),
            settle,
            handler,
            counters: Counters::default(),
            policy: policy.clone(),
            order,
            shutdown: shutdown.clone(),
        });
        let mut workers: Vec<JoinHandle<()>> = (0..policy.lanes.get())
            .map(|_| {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    while let Some((key, queued)) = shared.next().await {
                        shared.process(key, queued).await;
                    }
                })
            })
            .collect();
        if let Some(every) = shared.settle.keep_alive_every() {
            let shared = Arc::clone(&shared);
            workers.push(tokio::spawn(async move { shared.sweep(every).await }));
        }
        Self {
            shared,
            slots: Arc::new(Semaphore::new(policy.max_in_flight.get())),
            workers,
        }
    }

    /// Queues a delivery among the others of its key, waiting while `max_in_flight`
    /// messages are held (unless it may unblock a held key). Returns `false` (and releases
    /// the delivery) when `shutdown` is cancelled first.
    pub(crate) async fn dispatch(
        &self,
        incoming: Incoming<S::Handle>,
        shutdown: &CancellationToken,
    ) -> bool {
        let key = (
            incoming.message.aggregate_type.clone(),
            incoming.message.aggregate_id.clone(),
        );
        let slot = match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(slot) => Some(Some(slot)),
            Err(_)
                if self
                    .shared
                    .may_unblock(&key, incoming.message.aggregate_seq) =>
            {
                Some(None)
            }
            Err(_) => tokio::select! {
                biased; // after shutdown, never take a delivery in
                () = shutdown.cancelled() => None,
                slot = Arc::clone(&self.slots).acquire_owned() => slot.ok().map(Some),
            },
        };
        let Some(slot) = slot.filter(|_| !shutdown.is_cancelled()) else {
            self.shared.settle.release(incoming.handle).await;
            Counters::bump(&self.shared.counters.released);
            return false;
        };
        let queued = Queued {
            attempts: incoming.earlier_attempts,
            incoming,
            _slot: slot,
        };
        let mut guard = self.shared.board();
        let board = &mut *guard;
        match board.queues.entry(key) {
            Entry::Occupied(mut queue) => {
                insert_in_order(queue.get_mut(), queued);
                let key = queue.key().clone();
                if board.unpark(&key, None) {
                    self.shared.wake.notify_one();
                }
            }
            Entry::Vacant(vacant) => {
                board.ready.push_back(vacant.key().clone());
                vacant.insert(VecDeque::from([queued]));
                self.shared.wake.notify_one();
            }
        }
        true
    }

    /// Dispatches a parsed delivery, or dead-letters one that could not be parsed (`Err`
    /// with the reason). `false` when `shutdown` came first.
    pub(crate) async fn offer(
        &self,
        handle: S::Handle,
        parsed: Result<InboxMessage, String>,
        earlier_attempts: u32,
        shutdown: &CancellationToken,
    ) -> bool {
        match parsed {
            Ok(message) => {
                let incoming = Incoming {
                    handle,
                    message,
                    earlier_attempts,
                };
                self.dispatch(incoming, shutdown).await
            }
            Err(reason) => {
                self.reject(handle, &reason).await;
                true
            }
        }
    }

    /// Dead-letters a delivery that can never be processed (it does not follow the
    /// contract), without a handler attempt.
    pub(crate) async fn reject(&self, handle: S::Handle, reason: &str) {
        tracing::error!(
            reason,
            "dead-lettering a message that does not follow the contract"
        );
        match self.shared.settle.dead_letter(handle, None, reason).await {
            Ok(()) => Counters::bump(&self.shared.counters.dead_lettered),
            Err(e) => tracing::warn!(error = %e, "dead-lettering failed; it will be redelivered"),
        }
    }

    /// Takes no more deliveries, waits until every held message was settled (acked,
    /// dead-lettered, or released at shutdown), and returns the report.
    pub(crate) async fn finish(self) -> ConsumerReport {
        self.shared.board().closed = true;
        self.shared.wake.notify_waiters();
        for worker in self.workers {
            if let Err(e) = worker.await {
                tracing::error!(error = %e, "a consumer lane failed");
            }
        }
        self.shared.counters.report()
    }
}

impl<S: Settle> Shared<S> {
    fn board(&self) -> MutexGuard<'_, Board<S::Handle>> {
        self.board.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a message of `key` at `seq` may be the missing predecessor of that key's
    /// held head.
    fn may_unblock(&self, key: &Key, seq: Option<u64>) -> bool {
        let board = self.board();
        let Some(seq) = seq else { return false };
        board.held.contains_key(key)
            && board
                .queues
                .get(key)
                .and_then(|q| q.front())
                .and_then(Queued::seq)
                .is_some_and(|head| seq < head)
    }

    /// The head message of the next ready key (the key becomes active), or `None` once the
    /// lanes are closed and hold nothing.
    async fn next(&self) -> Option<(Key, Queued<S::Handle>)> {
        loop {
            let notified = self.wake.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let mut board = self.board();
                while let Some(key) = board.ready.pop_front() {
                    if let Some(queued) = board.queues.get_mut(&key).and_then(VecDeque::pop_front) {
                        return Some((key, queued));
                    }
                }
                if board.closed && board.queues.is_empty() {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Keeps every queued (and held) message alive, every `every`, until the lanes end.
    async fn sweep(&self, every: Duration) {
        loop {
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let pings: Vec<BoxFuture<'static, ()>> = {
                let board = self.board();
                if board.closed && board.queues.is_empty() {
                    return;
                }
                board
                    .queues
                    .values()
                    .flatten()
                    .filter_map(|q| self.settle.keep_alive_owned(&q.incoming.handle))
                    .collect()
            };
            futures::future::join_all(pings).await;
        }
    }

    /// The active key's message was settled: its next message (if any) becomes ready.
    fn settled(&self, key: Key) {
        let mut board = self.board();
        board.held.remove(&key);
        if board.queues.get(&key).is_some_and(|q| !q.is_empty()) {
            board.ready.push_back(key);
            self.wake.notify_one();
        } else {
            board.queues.remove(&key);
            board.applied.remove(&key);
            if board.closed && board.queues.is_empty() {
                self.wake.notify_waiters();
            }
        }
    }

    /// A message back from its backoff: at the head of its key's queue (behind only a
    /// lower position that arrived meanwhile), ready again.
    fn retry(&self, key: Key, queued: Queued<S::Handle>) {
        let mut board = self.board();
        put_back(board.queues.entry(key.clone()).or_default(), queued);
        board.held.remove(&key);
        board.ready.push_back(key);
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests;
