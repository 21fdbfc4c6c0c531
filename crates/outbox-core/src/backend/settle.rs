//! A settled batch sorted by outcome: what every polling backend's `settle` starts from, as
//! it records a batch with one statement per outcome kind (delivered, retried, dead).

use time::OffsetDateTime;

use crate::source::{Outcome, Settlement};

/// A batch's settlements sorted by outcome, each kind in batch order. Released events are
/// left out: they stay exactly as they were.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SettledBatch<'a> {
    /// The positions of the delivered events.
    pub delivered: Vec<i64>,
    /// The events to try again: position, earliest next attempt, what went wrong.
    pub retries: Vec<(i64, OffsetDateTime, &'a str)>,
    /// The dead letters: position, reason.
    pub dead: Vec<(i64, &'a str)>,
}

impl<'a> SettledBatch<'a> {
    /// Sorts `settlements` by outcome.
    pub fn sort(settlements: &'a [Settlement]) -> Self {
        let mut batch = Self::default();
        for s in settlements {
            let position = s.position.0;
            match &s.outcome {
                Outcome::Delivered => batch.delivered.push(position),
                Outcome::Retry { not_before, error } => {
                    batch.retries.push((position, *not_before, error));
                }
                Outcome::DeadLetter { reason } => batch.dead.push((position, reason)),
                Outcome::Released => {}
            }
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Position;

    #[test]
    fn each_outcome_kind_keeps_batch_order_and_released_events_are_left_out() {
        let at = OffsetDateTime::UNIX_EPOCH;
        let settle = |p, outcome| Settlement {
            position: Position(p),
            outcome,
        };
        let settlements = [
            settle(1, Outcome::Delivered),
            settle(
                2,
                Outcome::Retry {
                    not_before: at,
                    error: "e".into(),
                },
            ),
            settle(3, Outcome::Released),
            settle(4, Outcome::DeadLetter { reason: "r".into() }),
            settle(5, Outcome::Delivered),
        ];
        let batch = SettledBatch::sort(&settlements);
        assert_eq!(batch.delivered, vec![1, 5]);
        assert_eq!(batch.retries, vec![(2, at, "e")]);
        assert_eq!(batch.dead, vec![(4, "r")]);
    }
}
