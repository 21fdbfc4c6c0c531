//! Dead letters of a streamed outbox: writing them, parking events behind them
//! (`hold-aggregate`), and the order of dead letters put back in line (`dead retry`):
//! an event that streamed before its aggregate's put-back rows is streamed again after them.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use outbox_core::SourceError;
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

use super::super::ledger::{Entry, Origin};
use super::super::queries::{KEEP_SEQ, TRANSACTION_VISIBLE};
use super::{PgCdcSource, VISIBILITY_TIMEOUT};
use crate::error::source_error;
use crate::event_arrays::EventArrays;
use crate::sql::stmt;

impl PgCdcSource {
    /// Settles queued events of aggregates that have dead letters: an event that is itself
    /// already dead (re-streamed after a restart) is dropped; with `hold-aggregate`, the
    /// others are parked as dead letters behind it. An aggregate whose dead letters were
    /// retried or purged is released.
    pub(super) async fn resolve_dead(&mut self, now: OffsetDateTime) -> Result<(), SourceError> {
        let groups = self.cs.suspect_groups();
        if groups.is_empty() {
            return Ok(());
        }
        let xids: Vec<i64> = groups
            .iter()
            .flat_map(|(_, positions)| positions)
            .filter_map(|p| self.cs.ledger.queued_at(*p).map(|e| i64::from(e.meta.xid)))
            .collect();
        self.wait_visible(xids).await?;
        for (key, positions) in groups {
            let dead: Vec<(Uuid, i64)> =
                crate::sql::query_as(stmt(&self.queries.dead_of_aggregate))
                    .bind(&key.0)
                    .bind(&key.1)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.db_err("reading the dead letters of an aggregate", e))?;
            if dead.is_empty() {
                self.resolve_put_back(key, positions, true).await?;
                continue;
            }
            let dead_ids: Vec<Uuid> = dead.iter().map(|(id, _)| *id).collect();
            // A row ahead of every dead letter of its aggregate (a retried one, say) is not
            // held by them: it goes as if the aggregate had none, and the aggregate stays
            // checked.
            let lowest = dead.iter().map(|(_, seq)| *seq).min().unwrap_or(i64::MAX);
            let (ahead, positions): (Vec<i64>, Vec<i64>) = positions.into_iter().partition(|p| {
                self.cs.ledger.queued_mut(*p).is_some_and(|e| {
                    !dead_ids.contains(&e.event.id) && e.meta.seq().is_some_and(|s| s < lowest)
                })
            });
            if !ahead.is_empty() {
                self.resolve_put_back(key.clone(), ahead, false).await?;
            }
            let park = self.cs.behind_dead(&key, positions, &dead_ids);
            if !park.is_empty() {
                let parked = self.park(&key, &park, now).await?;
                self.cs.settle_parked(&key, &park, |id| parked.contains(id));
            }
        }
        self.report_confirmed();
        Ok(())
    }

    /// The queued events at `positions` of an aggregate with no dead letter left (they were
    /// retried or purged). A retried dead letter is re-inserted and streams from where
    /// `dead retry` committed, keeping its seq (migration 0005); an event of the aggregate
    /// with a higher seq that streamed before it (the slot's unconfirmed tail, after a
    /// restart) must not overtake it, so it is streamed again, after it. An older copy of a
    /// put-back row is dropped: the put-back copy streams later.
    pub(super) async fn resolve_put_back(
        &mut self,
        key: (String, String),
        positions: Vec<i64>,
        may_release: bool,
    ) -> Result<(), SourceError> {
        let put_back: Vec<(Uuid, i64)> = if self.cs.hold {
            crate::sql::query_as(stmt(&self.queries.put_back_of_aggregate))
                .bind(&key.0)
                .bind(&key.1)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_err("reading the retried events of an aggregate", e))?
        } else {
            Vec::new()
        };
        // Where the stream holds each put-back copy already (its ledger position); one
        // delivered but not yet unmarked counts as handed over.
        let held: HashMap<Uuid, i64> = self
            .cs
            .ledger
            .entries()
            .filter(|e| e.meta.put_back())
            .map(|e| (e.event.id, e.event.position.0))
            .collect();
        let ahead = |id: &Uuid, at: i64| {
            self.unmarked.contains(id) || held.get(id).is_some_and(|p| *p < at)
        };
        let mut stale = Vec::new();
        let mut overtaking = Vec::new();
        for p in positions {
            let Some(e) = self.cs.ledger.queued_mut(p) else {
                continue;
            };
            if !e.meta.put_back() && put_back.iter().any(|(id, _)| *id == e.event.id) {
                stale.push(p);
                continue;
            }
            let waits = e.meta.seq().is_some_and(|seq| {
                put_back
                    .iter()
                    .any(|(id, s)| *s < seq && *id != e.event.id && !ahead(id, p))
            });
            if waits && !self.restreamed.contains(&e.event.id) {
                overtaking.push(p);
            } else {
                e.checked = true;
            }
        }
        for p in stale {
            if let Some(entry) = self.cs.ledger.remove_queued(p) {
                tracing::debug!(event_id = %entry.event.id, "skipping an older copy of a retried dead letter; the retried copy streams later");
                self.cs.ledger.finish(&entry);
            }
        }
        if !overtaking.is_empty() {
            self.restream(&overtaking).await?;
        }
        // Checked again until every put-back row is handed over: events of the aggregate
        // still to come from the tail must wait too.
        if may_release
            && put_back
                .iter()
                .all(|(id, _)| self.unmarked.contains(id) || held.contains_key(id))
        {
            self.cs.dead.remove(&key);
        }
        Ok(())
    }

    /// Streams the queued events at `positions` again, after everything committed so far,
    /// by re-inserting their rows unchanged (`queries/outbox_cdc_restream.sql`), and settles
    /// them here. An event whose row is gone is published as it is.
    pub(super) async fn restream(&mut self, positions: &[i64]) -> Result<(), SourceError> {
        let ids: Vec<Uuid> = positions
            .iter()
            .filter_map(|p| self.cs.ledger.queued_mut(*p).map(|e| e.event.id))
            .collect();
        let err = |e| source_error("streaming events again", &self.table, e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        crate::sql::query(KEEP_SEQ)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let again: Vec<Uuid> = crate::sql::query_scalar(stmt(&self.queries.restream))
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        for p in positions {
            let Some(entry) = self.cs.ledger.queued_mut(*p) else {
                continue;
            };
            let id = entry.event.id;
            self.restreamed.insert(id);
            if !again.contains(&id) {
                entry.checked = true;
                continue;
            }
            if let Some(entry) = self.cs.ledger.remove_queued(*p) {
                tracing::info!(event_id = %id, "streaming an event again after the retried dead letters of its aggregate");
                self.cs.ledger.finish(&entry);
            }
        }
        Ok(())
    }

    /// Clears the put-back mark of delivered rows (see `resolve_put_back`); on failure they
    /// stay in `unmarked` and the next settle tries again.
    pub(super) async fn unmark_delivered(&mut self) {
        if self.unmarked.is_empty() {
            return;
        }
        let ids: Vec<Uuid> = self.unmarked.iter().copied().collect();
        match crate::sql::query(stmt(&self.queries.put_back_delivered))
            .bind(&ids)
            .execute(&self.pool)
            .await
        {
            Ok(_) => self.unmarked.clear(),
            Err(e) => {
                tracing::warn!(error = %self.db_err("unmarking delivered retried events", e), "will try again at the next batch");
            }
        }
    }

    /// Parks `items` of aggregate `key` as dead letters behind its dead letter, under the
    /// aggregate's lock (shared with `dead retry`) and only while a dead letter with a lower
    /// seq still holds them; returns the ids parked. Table-less events are parked as rows.
    pub(super) async fn park(
        &self,
        key: &(String, String),
        items: &[(Entry, i32, String)],
        now: OffsetDateTime,
    ) -> Result<HashSet<Uuid>, SourceError> {
        let (rows, messages): (Vec<_>, Vec<_>) = items
            .iter()
            .cloned()
            .partition(|(e, _, _)| matches!(e.meta.origin, Origin::Row { .. }));
        let mut parked: HashSet<Uuid> = messages.iter().map(|(e, _, _)| e.event.id).collect();
        if !messages.is_empty() {
            self.write_dead(&messages, now).await?;
        }
        if rows.is_empty() {
            return Ok(parked);
        }
        let err = |e| self.db_err("parking events behind a dead letter", e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        crate::sql::query(stmt(&self.queries.aggregate_lock))
            .bind(vec![key.0.clone()])
            .bind(vec![key.1.clone()])
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let ids: Vec<Uuid> = rows.iter().map(|(e, _, _)| e.event.id).collect();
        let attempts: Vec<i32> = rows.iter().map(|(_, a, _)| *a).collect();
        let reasons: Vec<&str> = rows.iter().map(|(_, _, r)| r.as_str()).collect();
        let done: Vec<Uuid> = crate::sql::query_scalar(stmt(&self.queries.park))
            .bind(&ids)
            .bind(&attempts)
            .bind(&reasons)
            .bind(now)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        parked.extend(done);
        Ok(parked)
    }

    /// Waits until the transactions `xids` are visible to new snapshots. The stream can
    /// deliver a commit a moment before the committing session has published it; deciding
    /// about dead letters on a snapshot without it could misjudge (or miss) its rows. Nothing
    /// announces that moment, so this polls; it almost never has to wait.
    pub(super) async fn wait_visible(&self, mut xids: Vec<i64>) -> Result<(), SourceError> {
        xids.sort_unstable();
        xids.dedup();
        if xids.is_empty() {
            return Ok(());
        }
        let deadline = Instant::now() + VISIBILITY_TIMEOUT;
        loop {
            let visible: bool = crate::sql::query_scalar(TRANSACTION_VISIBLE)
                .bind(&xids)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.db_err("checking transaction visibility", e))?;
            if visible {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(SourceError::unavailable(format!(
                    "streamed transactions {xids:?} are still not visible after {VISIBILITY_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Records dead letters in one transaction: rows are updated, table-less events inserted.
    pub(super) async fn write_dead(
        &self,
        items: &[(Entry, i32, String)],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let (rows, messages): (Vec<_>, Vec<_>) = items
            .iter()
            .partition(|(e, _, _)| matches!(e.meta.origin, Origin::Row { .. }));
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| self.db_err("dead-lettering events", e))?;
        if !rows.is_empty() {
            let ids: Vec<Uuid> = rows.iter().map(|(e, _, _)| e.event.id).collect();
            let attempts: Vec<i32> = rows.iter().map(|(_, a, _)| *a).collect();
            let reasons: Vec<&str> = rows.iter().map(|(_, _, r)| r.as_str()).collect();
            crate::sql::query(stmt(&self.queries.dead_letter))
                .bind(&ids)
                .bind(&attempts)
                .bind(&reasons)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db_err("dead-lettering events", e))?;
        }
        if !messages.is_empty() {
            // The relay's own number is not the producer's: not stored.
            let events = EventArrays::new(messages.iter().map(|(e, _, _)| &e.event), |name| {
                name != outbox_core::message::header::AGGREGATE_SEQ
            });
            let attempts: Vec<i32> = messages.iter().map(|(_, a, _)| *a).collect();
            let reasons: Vec<&str> = messages.iter().map(|(_, _, r)| r.as_str()).collect();
            events
                .bind(crate::sql::query(stmt(&self.queries.dead_insert)))
                .bind(&attempts)
                .bind(&reasons)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.db_err("dead-lettering table-less events", e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.db_err("committing dead letters", e))
    }
}
