//! The order gate in the lanes: a message later than the next position of its aggregate is
//! held (its key parked) until its predecessor arrives or the gap timeout passes.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::board::Held;
use super::{Key, Queued, Settle, Shared, put_back};
use crate::lane::{ConsumerOrder, Counters};

/// What the order gate says about a message.
pub(super) enum Gate {
    /// The next position, or an older one: handle it.
    Go,
    /// Its predecessor did not come within the gap timeout: handle it anyway.
    Gap { applied: u64 },
    /// Hold it.
    Wait { since: Instant },
}

impl<S: Settle> Shared<S> {
    /// Asks the order gate about a message at `seq` of `key`.
    pub(super) async fn gate(&self, order: &ConsumerOrder, key: &Key, seq: u64) -> Gate {
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
    pub(super) fn hold(self: &Arc<Self>, key: Key, queued: Queued<S::Handle>, since: Instant) {
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

    /// Notes that position `seq` of `key` was applied here.
    pub(super) fn applied(&self, key: &Key, seq: Option<u64>) {
        if let (Some(_), Some(seq)) = (&self.order, seq) {
            let mut board = self.board();
            let a = board.applied.entry(key.clone()).or_insert(seq);
            *a = (*a).max(seq);
        }
    }

    /// Records that position `seq` of `key` was passed without being applied (dead letter).
    pub(super) async fn passed(&self, key: &Key, seq: Option<u64>) {
        if let (Some(order), Some(seq)) = (&self.order, seq) {
            if let Err(e) = order.gate().pass(&key.0, &key.1, seq).await {
                tracing::warn!(aggregate_type = %key.0, aggregate_id = %key.1, error = %e, "cannot record a dead-lettered position; its successor waits for the gap timeout");
                return;
            }
            self.applied(key, Some(seq));
        }
    }
}
