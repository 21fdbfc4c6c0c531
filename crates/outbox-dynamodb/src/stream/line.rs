//! Per-aggregate order by `seq`: an event goes in line only after its predecessor was handed
//! out, by this relay or by any (the positions in the lease table); a missing predecessor is
//! waited for up to `gap_timeout`.

use outbox_core::{Event, Ordering, SourceError};
use time::OffsetDateTime;
use tokio::time::Instant;

use super::{DynamoStreamSource, Meta, POSITION_REFRESH, Waiting, aggregate};

impl DynamoStreamSource {
    /// An event read from the stream: in line when its predecessor is out, else waiting.
    pub(super) async fn ingest(
        &mut self,
        event: Event,
        meta: Meta,
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let key = aggregate(&event);
        if self.hold
            && self.dead.as_ref().is_some_and(|d| d.contains(&key))
            && !self.leases.held(&key).await?
        {
            // Its dead letters were purged: the aggregate flows again.
            if let Some(dead) = self.dead.as_mut() {
                dead.remove(&key);
            }
        }
        if self.hold && self.dead.as_ref().is_some_and(|d| d.contains(&key)) {
            if self.leases.is_dead(event.id).await? {
                self.mark_settled(&meta.shard, &meta.seqnum);
                return Ok(());
            }
            let reason = format!(
                "held: an earlier event of aggregate {}/{} is dead-lettered (dead_letter = \"hold-aggregate\"); retry them together, in order",
                key.0, key.1
            );
            self.leases
                .dead(&event, Some(meta.seq), 0, &reason, now)
                .await?;
            self.unrecorded
                .entry(key.clone())
                .and_modify(|s| *s = (*s).max(meta.seq))
                .or_insert(meta.seq);
            self.last.insert(key, meta.seq);
            self.mark_settled(&meta.shard, &meta.seqnum);
            return Ok(());
        }
        if self.ordering == Ordering::None {
            self.put_in_line(event, meta);
            return Ok(());
        }
        if !self.last.contains_key(&key) {
            let found = self.leases.positions(std::slice::from_ref(&key)).await?;
            self.last
                .insert(key.clone(), found.get(&key).copied().unwrap_or(0));
        }
        let last = self.last.get(&key).copied().unwrap_or(0);
        if meta.seq <= last {
            // Handed out already (the tail after a restart, read again).
            tracing::debug!(event_id = %event.id, seq = meta.seq, "skipping an event already handed out");
            self.mark_settled(&meta.shard, &meta.seqnum);
            return Ok(());
        }
        self.waiting.entry(key.clone()).or_default().insert(
            meta.seq,
            Waiting {
                event,
                meta,
                since: Instant::now(),
            },
        );
        self.release_waiting(&key);
        Ok(())
    }

    /// Puts in line the waiting events of `key` whose predecessor is out.
    pub(super) fn release_waiting(&mut self, key: &(String, String)) {
        let Some(queue) = self.waiting.get_mut(key) else {
            return;
        };
        let mut last = self.last.get(key).copied().unwrap_or(0);
        let mut ready = Vec::new();
        while let Some(entry) = queue.first_entry() {
            let seq = *entry.key();
            if seq <= last {
                let w = entry.remove();
                ready.push((w, false));
            } else if seq == last + 1 {
                last = seq;
                ready.push((entry.remove(), true));
            } else if entry.get().since.elapsed() >= self.gap_timeout {
                tracing::error!(
                    aggregate_type = %key.0,
                    aggregate_id = %key.1,
                    missing_after = last,
                    seq,
                    waited = ?self.gap_timeout,
                    "an event's predecessor never appeared in the stream; publishing it anyway (the gap may be events lost to the 24-hour retention, or a producer that does not draw seq from the aggregate's version)"
                );
                last = seq;
                ready.push((entry.remove(), true));
            } else {
                break;
            }
        }
        if queue.is_empty() {
            self.waiting.remove(key);
        }
        self.last.insert(key.clone(), last);
        for (w, in_line) in ready {
            if in_line {
                self.put_in_line(w.event, w.meta);
            } else {
                self.mark_settled(&w.meta.shard, &w.meta.seqnum);
            }
        }
    }

    pub(super) fn put_in_line(&mut self, event: Event, meta: Meta) {
        self.counter += 1;
        self.ledger.commit(vec![(event, meta)], self.counter);
    }

    /// Reads again the positions of aggregates whose events wait (another relay may have
    /// handed the predecessor out), and lets the waits past `gap_timeout` go.
    pub(super) async fn refresh_waiting(&mut self) -> Result<(), SourceError> {
        if self.waiting.is_empty() || Instant::now() < self.next_position_refresh {
            return Ok(());
        }
        self.next_position_refresh = Instant::now() + POSITION_REFRESH;
        let keys: Vec<(String, String)> = self.waiting.keys().cloned().collect();
        let found = self.leases.positions(&keys).await?;
        for key in keys {
            if let Some(p) = found.get(&key) {
                let last = self.last.entry(key.clone()).or_insert(0);
                *last = (*last).max(*p);
            }
            self.release_waiting(&key);
        }
        Ok(())
    }
}
