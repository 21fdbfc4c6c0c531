//! Events of aggregates with dead letters. Before a queued event of such an aggregate goes
//! out, the source reads the aggregate's dead letters from its table: an event that is itself
//! already dead (streamed again after a restart) is dropped; with `hold-aggregate` the others
//! are parked as dead letters behind it; without, they go.

use uuid::Uuid;

use super::{Aggregate, ChangeStream, DeadLetter};

impl<M: Clone> ChangeStream<M> {
    /// The queued events to check against their aggregate's dead letters (those not checked
    /// since their aggregate was marked), grouped by aggregate in commit order.
    pub fn suspect_groups(&self) -> Vec<(Aggregate, Vec<i64>)> {
        let mut groups: Vec<(Aggregate, Vec<i64>)> = Vec::new();
        for position in self.ledger.suspects(&self.dead) {
            let Some(entry) = self.ledger.queued_at(position) else {
                continue;
            };
            let key = entry.aggregate();
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, positions)) => positions.push(position),
                None => groups.push((key, vec![position])),
            }
        }
        groups
    }

    /// Sorts the queued events at `positions` of aggregate `key`, whose dead letters are
    /// `dead_ids`: one already dead is settled and dropped; with `hold-aggregate` the others
    /// are returned, to be parked behind the first dead letter; without, they are checked
    /// and go.
    pub fn behind_dead(
        &mut self,
        key: &Aggregate,
        positions: Vec<i64>,
        dead_ids: &[Uuid],
    ) -> Vec<DeadLetter<M>> {
        let mut park = Vec::new();
        for p in positions {
            let Some(entry) = self.ledger.queued_mut(p) else {
                continue;
            };
            if dead_ids.contains(&entry.event.id) {
                if let Some(entry) = self.ledger.remove_queued(p) {
                    tracing::debug!(event_id = %entry.event.id, "skipping an event that is already dead-lettered");
                    self.ledger.finish(&entry);
                }
            } else if self.hold {
                let attempts = entry.event.attempts as i32;
                let reason = format!(
                    "held: event {} of aggregate {}/{} is dead-lettered (dead_letter = \"hold-aggregate\"); retry them together, in order",
                    dead_ids[0], key.0, key.1
                );
                park.push((entry.clone(), attempts, reason));
            } else {
                entry.checked = true;
            }
        }
        park
    }

    /// After parking `park` of aggregate `key`: the events `parked` says were parked are
    /// settled; the others (their dead letter was retried meanwhile) are checked again.
    pub fn settle_parked(
        &mut self,
        key: &Aggregate,
        park: &[DeadLetter<M>],
        parked: impl Fn(&Uuid) -> bool,
    ) {
        let mut held = 0;
        for (entry, _, _) in park {
            let position = entry.event.position.0;
            if parked(&entry.event.id) {
                held += 1;
                if let Some(entry) = self.ledger.remove_queued(position) {
                    self.ledger.finish(&entry);
                }
            } else if let Some(e) = self.ledger.queued_mut(position) {
                e.checked = false;
            }
        }
        tracing::warn!(
            aggregate_type = %key.0,
            held,
            "events parked as dead letters behind a dead letter of their aggregate"
        );
    }

    /// Settles and drops the queued event at `position` (a copy that must not go out).
    pub fn drop_queued(&mut self, position: i64) -> Option<Uuid> {
        let entry = self.ledger.remove_queued(position)?;
        self.ledger.finish(&entry);
        Some(entry.event.id)
    }
}
