//! A batch's outcomes applied to the ledger: delivered and dead-lettered events are settled
//! for good (the confirmed position may move), retried and released ones wait again in
//! commit order.

use uuid::Uuid;

use super::{ChangeStream, DeadLetter, StreamMeta};
use crate::source::{Outcome, Settlement};

impl<M: StreamMeta> ChangeStream<M> {
    /// The batch's dead letters, each with its attempts counted: the source writes them
    /// before anything else is recorded (the only part of a settle that can fail).
    pub fn dead_letters(&self, settlements: &[Settlement]) -> Vec<DeadLetter<M>> {
        settlements
            .iter()
            .filter_map(|s| match &s.outcome {
                Outcome::DeadLetter { reason } => self.ledger.in_flight(s.position.0).map(|e| {
                    let attempts = i32::try_from(e.event.attempts + 1).unwrap_or(i32::MAX);
                    (e.clone(), attempts, reason.clone())
                }),
                _ => None,
            })
            .collect()
    }

    /// Applies the outcomes (after the dead letters are written) and puts back whatever is
    /// still in flight. Returns the ids of delivered put-back events. A dead letter with
    /// `hold-aggregate` marks its aggregate for checking, so that its later events wait.
    pub fn apply(&mut self, settlements: &[Settlement]) -> Vec<Uuid> {
        let mut put_back = Vec::new();
        for s in settlements {
            let Some(mut entry) = self.ledger.take_in_flight(s.position.0) else {
                continue; // settled already, or from before a reconnect
            };
            match &s.outcome {
                Outcome::Delivered => {
                    if entry.meta.put_back() {
                        put_back.push(entry.event.id);
                    }
                    self.ledger.finish(&entry);
                }
                Outcome::DeadLetter { .. } => {
                    if self.hold {
                        let key = entry.aggregate();
                        self.ledger.uncheck(&key);
                        self.dead.insert(key);
                    }
                    self.ledger.finish(&entry);
                }
                Outcome::Retry { not_before, .. } => {
                    entry.event.attempts += 1;
                    entry.not_before = Some(*not_before);
                    self.ledger.requeue(entry);
                }
                Outcome::Released => self.ledger.requeue(entry),
            }
        }
        self.ledger.release_in_flight();
        put_back
    }
}
