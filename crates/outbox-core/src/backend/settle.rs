//! A settled batch sorted by outcome: what every polling backend's `settle` starts from, as
//! it records a batch with one statement per outcome kind (delivered, retried, dead), and
//! each kind's list as JSON text for the databases that take a list as one JSON value.

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

    /// The delivered positions as JSON text, `[position, …]`: one bind for a database that
    /// reads a list from JSON (MySQL's `JSON_TABLE`, SQLite's `json_each`).
    pub fn delivered_json(&self) -> String {
        serde_json::Value::from(self.delivered.as_slice()).to_string()
    }

    /// The retries as JSON text, `[[position, next attempt, error], …]`, each time encoded by
    /// `at` as the database's statement reads it.
    pub fn retries_json(&self, at: impl Fn(OffsetDateTime) -> serde_json::Value) -> String {
        let retries = (self.retries.iter()).map(|&(position, not_before, error)| {
            serde_json::json!([position, at(not_before), error])
        });
        serde_json::Value::from_iter(retries).to_string()
    }

    /// The dead letters as JSON text, `[[position, reason], …]`.
    pub fn dead_json(&self) -> String {
        let dead =
            (self.dead.iter()).map(|(position, reason)| serde_json::json!([position, reason]));
        serde_json::Value::from_iter(dead).to_string()
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
        assert_eq!(batch.delivered_json(), "[1,5]");
        assert_eq!(
            batch.retries_json(|t| t.unix_timestamp().into()),
            r#"[[2,0,"e"]]"#
        );
        assert_eq!(batch.dead_json(), r#"[[4,"r"]]"#);
    }
}
