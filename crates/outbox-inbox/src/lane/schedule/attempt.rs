//! One handler attempt at a message, and what follows it: ack, a retry in place after its
//! backoff, a dead letter, or a release at shutdown; the delivery is kept alive meanwhile.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::time::Instant;

use super::order::Gate;
use super::{Incoming, Key, Queued, Settle, Shared};
use crate::lane::Counters;

impl<S: Settle> Shared<S> {
    /// One attempt at a message: ack, dead-letter, release, hold, or park it for a retry.
    pub(super) async fn process(self: &Arc<Self>, key: Key, queued: Queued<S::Handle>) {
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
