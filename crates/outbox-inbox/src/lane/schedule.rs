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

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{BoxError, ConsumerOrder, ConsumerReport, Counters, LanePolicy, MessageHandler};
use crate::InboxMessage;

/// What a broker does with a delivery once the lanes decided its fate. Implemented once per
/// broker; `Handle` is whatever the broker needs to ack it (the raw message, an entry id...).
pub(crate) trait Settle: Send + Sync + 'static {
    /// One delivery as the broker knows it.
    type Handle: Send + Sync + 'static;

    /// Acknowledges a delivery whose handler committed. An error is logged: the message
    /// comes back and the inbox reports a duplicate.
    fn ack(&self, handle: Self::Handle) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Hands a delivery to the broker's dead-letter mechanism with `reason`, then
    /// acknowledges it. An error leaves it unacknowledged (redelivered, not lost).
    fn dead_letter(
        &self,
        handle: Self::Handle,
        message: Option<&InboxMessage>,
        reason: &str,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;

    /// Gives a delivery back unhandled (shutdown), for redelivery.
    fn release(&self, handle: Self::Handle) -> impl Future<Output = ()> + Send;

    /// How often a held delivery must be kept alive; `None`: never.
    fn keep_alive_every(&self) -> Option<Duration> {
        None
    }

    /// Tells the broker a delivery is still being worked on.
    fn keep_alive(&self, _handle: &Self::Handle) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// The same as [`keep_alive`](Self::keep_alive) as a future that owns what it needs, so
    /// the sweeper can run it without holding the queues; `None` when there is nothing to do.
    fn keep_alive_owned(&self, _handle: &Self::Handle) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// One delivery on its way to the lanes.
pub(crate) struct Incoming<D> {
    /// The broker's handle.
    pub(crate) handle: D,
    /// The parsed message.
    pub(crate) message: InboxMessage,
    /// Deliveries of this message before this one, when the broker counts them.
    pub(crate) earlier_attempts: u32,
}

/// The ordering key: `(aggregate_type, aggregate_id)`.
type Key = (String, String);

type BoxedHandler =
    Arc<dyn Fn(InboxMessage) -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// A message held by the lanes.
struct Queued<D> {
    incoming: Incoming<D>,
    /// Attempts so far, the broker's earlier deliveries included.
    attempts: u32,
    /// `None` for a message taken in over `max_in_flight` (a held key's predecessor).
    _slot: Option<OwnedSemaphorePermit>,
}

impl<D> Queued<D> {
    fn seq(&self) -> Option<u64> {
        self.incoming.message.aggregate_seq
    }
}

/// Puts `queued` into its key's queue: by `aggregate_seq` (after any equal one), a message
/// without one at the back.
fn insert_in_order<D>(queue: &mut VecDeque<Queued<D>>, queued: Queued<D>) {
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
fn put_back<D>(queue: &mut VecDeque<Queued<D>>, queued: Queued<D>) {
    let at = queued.seq().map_or(0, |s| {
        queue
            .iter()
            .position(|q| q.seq().is_none_or(|t| t >= s))
            .unwrap_or(queue.len())
    });
    queue.insert(at, queued);
}

/// A key whose head message waits for its predecessor.
struct Held {
    /// When it started waiting (the gap timeout counts from here).
    since: Instant,
    /// Waiting for a message or a recheck (not in `ready`, not with a worker).
    parked: bool,
    /// Tells a stale recheck timer from the current one.
    generation: u64,
}

/// The queues of every key with messages held, and the keys ready to be served.
struct Board<D> {
    queues: HashMap<Key, VecDeque<Queued<D>>>,
    ready: VecDeque<Key>,
    /// Last applied position per active key, as known here (order gate).
    applied: HashMap<Key, u64>,
    held: HashMap<Key, Held>,
    closed: bool,
}

impl<D> Board<D> {
    /// Makes a parked key ready (a message arrived for it, or its recheck is due).
    fn unpark(&mut self, key: &Key, generation: Option<u64>) -> bool {
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

/// What the order gate says about a message.
enum Gate {
    /// The next position, or an older one: handle it.
    Go,
    /// Its predecessor did not come within the gap timeout: handle it anyway.
    Gap { applied: u64 },
    /// Hold it.
    Wait { since: Instant },
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

    /// Asks the order gate about a message at `seq` of `key`.
    async fn gate(&self, order: &ConsumerOrder, key: &Key, seq: u64) -> Gate {
        let cached = self.board().applied.get(key).copied();
        let applied = if cached.is_some_and(|a| seq <= a.saturating_add(1)) {
            cached
        } else {
            match order.gate().applied(&key.0, &key.1).await {
                Ok(n) => {
                    let mut board = self.board();
                    let a = board.applied.entry(key.clone()).or_insert(n);
                    *a = (*a).max(n);
                    Some(*a)
                }
                Err(e) => {
                    tracing::warn!(aggregate_type = %key.0, aggregate_id = %key.1, error = %e, "cannot read the applied position; holding the message");
                    cached
                }
            }
        };
        let now = Instant::now();
        let mut board = self.board();
        if applied.is_some_and(|a| seq <= a.saturating_add(1)) {
            board.held.remove(key);
            return Gate::Go;
        }
        let held = board.held.entry(key.clone()).or_insert(Held {
            since: now,
            parked: false,
            generation: 0,
        });
        if now.duration_since(held.since) >= order.timeout() {
            board.held.remove(key);
            return Gate::Gap {
                applied: applied.unwrap_or(0),
            };
        }
        Gate::Wait { since: held.since }
    }

    /// Puts a held message back and parks its key until a message arrives for it or the
    /// recheck (10 ms, growing with the wait to 1 s) is due.
    fn hold(self: &Arc<Self>, key: Key, queued: Queued<S::Handle>, since: Instant) {
        let generation = {
            let mut board = self.board();
            put_back(board.queues.entry(key.clone()).or_default(), queued);
            let Some(held) = board.held.get_mut(&key) else {
                board.ready.push_back(key);
                self.wake.notify_one();
                return;
            };
            held.parked = true;
            held.generation += 1;
            held.generation
        };
        Counters::bump(&self.counters.held);
        let delay = (since.elapsed() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let me = Arc::clone(self);
        tokio::spawn(async move {
            tokio::select! {
                () = me.shutdown.cancelled() => {}
                () = tokio::time::sleep(delay) => {}
            }
            if me.board().unpark(&key, Some(generation)) {
                me.wake.notify_one();
            }
        });
    }

    /// One attempt at a message: ack, dead-letter, release, hold, or park it for a retry.
    async fn process(self: &Arc<Self>, key: Key, queued: Queued<S::Handle>) {
        if self.shutdown.is_cancelled() {
            self.release(key, queued.incoming.handle).await;
            return;
        }
        let seq = queued.seq();
        if let (Some(order), Some(seq)) = (&self.order, seq) {
            match self.gate(order, &key, seq).await {
                Gate::Go => {}
                Gate::Gap { applied } => {
                    Counters::bump(&self.counters.gaps);
                    tracing::warn!(
                        aggregate_type = %key.0,
                        aggregate_id = %key.1,
                        applied,
                        aggregate_seq = seq,
                        gap_timeout = ?order.timeout(),
                        "handling an event whose predecessor did not arrive within the gap timeout"
                    );
                }
                Gate::Wait { since } => {
                    if self.board().closed {
                        // No more deliveries come to this loop: give it back for another
                        // consumer (or the next start) instead of waiting out the gap.
                        self.release(key, queued.incoming.handle).await;
                    } else {
                        self.hold(key, queued, since);
                    }
                    return;
                }
            }
        }
        let Queued {
            incoming,
            attempts,
            _slot,
        } = queued;
        let Incoming {
            handle,
            message,
            earlier_attempts,
        } = incoming;
        let id = message.id;
        let attempt = attempts.saturating_add(1);
        let max = self.policy.max_attempts.get();
        let error = if attempt > max {
            format!("delivered {earlier_attempts} times before without success")
        } else {
            let call = AssertUnwindSafe((self.handler)(message.clone())).catch_unwind();
            match self.alive_while(&handle, call).await {
                Ok(Ok(())) => {
                    match self.settle.ack(handle).await {
                        Ok(()) => Counters::bump(&self.counters.acked),
                        // Committed but not acked: it comes back, then it is a duplicate.
                        Err(e) => {
                            tracing::warn!(%id, error = %e, "ack failed; the message will be redelivered");
                        }
                    }
                    self.applied(&key, seq);
                    self.settled(key);
                    return;
                }
                Ok(Err(e)) => e,
                Err(_) => "the handler panicked".to_owned(),
            }
        };
        if attempt >= max {
            let reason = format!("handler failed {attempt} times; last error: {error}");
            tracing::error!(%id, attempt, %reason, "dead-lettering");
            match self
                .settle
                .dead_letter(handle, Some(&message), &reason)
                .await
            {
                Ok(()) => {
                    Counters::bump(&self.counters.dead_lettered);
                    self.passed(&key, seq).await;
                }
                Err(e) => {
                    tracing::warn!(%id, error = %e, "dead-lettering failed; the message will be redelivered");
                }
            }
            self.settled(key);
            return;
        }
        Counters::bump(&self.counters.retried);
        let delay = self.policy.backoff(attempt);
        tracing::warn!(%id, attempt, ?delay, %error, "handler failed; retrying in place");
        let me = Arc::clone(self);
        tokio::spawn(async move {
            if me.wait(&handle, delay).await {
                let incoming = Incoming {
                    handle,
                    message,
                    earlier_attempts,
                };
                let queued = Queued {
                    incoming,
                    attempts: attempt,
                    _slot,
                };
                me.retry(key, queued);
            } else {
                me.release(key, handle).await;
            }
        });
    }

    /// Runs `work` (a handler call), keeping the delivery alive meanwhile.
    async fn alive_while<T>(&self, handle: &S::Handle, work: impl Future<Output = T>) -> T {
        let Some(every) = self.settle.keep_alive_every() else {
            return work.await;
        };
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = tokio::time::sleep(every) => self.settle.keep_alive(handle).await,
            }
        }
    }

    /// Notes that position `seq` of `key` was applied here.
    fn applied(&self, key: &Key, seq: Option<u64>) {
        if let (Some(_), Some(seq)) = (&self.order, seq) {
            let mut board = self.board();
            let a = board.applied.entry(key.clone()).or_insert(seq);
            *a = (*a).max(seq);
        }
    }

    /// Records that position `seq` of `key` was passed without being applied (dead letter).
    async fn passed(&self, key: &Key, seq: Option<u64>) {
        if let (Some(order), Some(seq)) = (&self.order, seq) {
            if let Err(e) = order.gate().pass(&key.0, &key.1, seq).await {
                tracing::warn!(aggregate_type = %key.0, aggregate_id = %key.1, error = %e, "cannot record a dead-lettered position; its successor waits for the gap timeout");
                return;
            }
            self.applied(key, Some(seq));
        }
    }

    async fn release(&self, key: Key, handle: S::Handle) {
        self.settle.release(handle).await;
        Counters::bump(&self.counters.released);
        self.settled(key);
    }

    /// Waits `delay`, keeping the delivery alive; `false` when shutdown came first.
    async fn wait(&self, handle: &S::Handle, delay: Duration) -> bool {
        let step = self.settle.keep_alive_every().unwrap_or(delay);
        let deadline = Instant::now() + delay;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            let next = deadline.min(now + step);
            tokio::select! {
                () = self.shutdown.cancelled() => return false,
                () = tokio::time::sleep_until(next) => {}
            }
            if next < deadline {
                self.settle.keep_alive(handle).await;
            }
        }
    }
}

#[cfg(test)]
mod tests;
