//! Dead letters of a binlog-streamed outbox: undecodable rows, events parked behind their
//! aggregate's dead letter (`hold-aggregate`), and the order of rows put back in line
//! (`dead retry`): an event that streamed before its aggregate's put-back rows is streamed
//! again after them.

use outbox_core::SourceError;
use time::OffsetDateTime;
use uuid::Uuid;

use super::MySqlCdcSource;
use super::log::Entry;
use crate::error::source_error;
use crate::sql::stmt;

impl MySqlCdcSource {
    /// Dead-letters queued rows that cannot be published, and settles queued events of
    /// aggregates with dead letters: an event that is itself already dead (streamed again
    /// after a restart) is dropped; with `hold-aggregate` the others are parked as dead
    /// letters behind it. An aggregate whose dead letters were retried or purged flows again.
    pub(super) async fn resolve(&mut self, now: OffsetDateTime) -> Result<(), SourceError> {
        let invalid: Vec<(Entry, i32, String)> = self
            .cs
            .ledger
            .queued()
            .filter_map(|e| e.meta.invalid.clone().map(|why| (e.clone(), 1, why)))
            .collect();
        if !invalid.is_empty() {
            self.write_dead(&invalid, now).await?;
            for (entry, _, why) in &invalid {
                tracing::error!(row = entry.meta.row, reason = %why, "dead-lettered an outbox row that cannot be published");
                if let Some(entry) = self.cs.ledger.remove_queued(entry.event.position.0) {
                    self.cs.ledger.finish(&entry);
                }
            }
        }
        let groups = self.cs.suspect_groups();
        for (key, positions) in groups {
            let dead_ids: Vec<String> = sqlx::query_scalar(stmt(&self.queries.dead_of_aggregate))
                .bind(&key.0)
                .bind(&key.1)
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.db_err("reading the dead letters of an aggregate", e))?;
            let dead_ids: Vec<Uuid> = dead_ids
                .iter()
                .filter_map(|s| Uuid::parse_str(s).ok())
                .collect();
            if dead_ids.is_empty() {
                // The dead letters were retried or purged. A retried one is streamed again
                // from where `dead retry` committed: an event of this aggregate with a higher
                // `seq` that was streamed before that (the tail after a restart) must not
                // overtake it, so it is streamed again too, after it.
                let put_back: Vec<(i64, i64)> = sqlx::query_as(stmt(&self.queries.put_back_seqs))
                    .bind(&key.0)
                    .bind(&key.1)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| self.db_err("reading the retried events of an aggregate", e))?;
                // Where the stream holds each put-back row already (its ledger position).
                let held: std::collections::HashMap<i64, i64> = self
                    .cs
                    .ledger
                    .entries()
                    .filter(|e| e.meta.put_back)
                    .map(|e| (e.meta.row, e.event.position.0))
                    .collect();
                let mut overtaking = Vec::new();
                for p in &positions {
                    if let Some(e) = self.cs.ledger.queued_mut(*p) {
                        // A put-back row with a lower seq that the stream has not handed over
                        // ahead of this event (not yet streamed, or streamed after it).
                        let waits = put_back.iter().any(|(row, seq)| {
                            *seq < e.meta.seq && held.get(row).is_none_or(|at| at > p)
                        });
                        if waits {
                            overtaking.push(*p);
                        } else {
                            e.checked = true;
                        }
                    }
                }
                if overtaking.is_empty() {
                    self.cs.dead.remove(&key);
                } else {
                    self.restream(&overtaking).await?;
                }
                continue;
            }
            let park = self.cs.behind_dead(&key, positions, &dead_ids);
            if !park.is_empty() {
                self.write_dead(&park, now).await?;
                self.cs.settle_parked(&key, &park, |_| true);
            }
        }
        Ok(())
    }

    /// Streams the queued events at `positions` again, after everything committed so far
    /// (see `queries/cdc_restream.sql`), and settles them here.
    pub(super) async fn restream(&mut self, positions: &[i64]) -> Result<(), SourceError> {
        let rows: Vec<i64> = positions
            .iter()
            .filter_map(|p| self.cs.ledger.queued_mut(*p).map(|e| e.meta.row))
            .collect();
        let list = serde_json::Value::from(rows).to_string();
        let err = |e| source_error("streaming events again", &self.table, e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        for state in ["dead", "pending"] {
            sqlx::query(stmt(&self.queries.restream))
                .bind(&list)
                .bind(state)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        for p in positions {
            if let Some(entry) = self.cs.ledger.remove_queued(*p) {
                tracing::info!(event_id = %entry.event.id, "streaming an event again after the retried dead letters of its aggregate");
                self.cs.ledger.finish(&entry);
            }
        }
        Ok(())
    }

    /// Records dead letters in one statement. Waits (row lock) for a producer's transaction
    /// the binlog already showed but the server has not finished committing.
    pub(super) async fn write_dead(
        &self,
        items: &[(Entry, i32, String)],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let list: Vec<serde_json::Value> = items
            .iter()
            .map(|(e, attempts, reason)| serde_json::json!([e.meta.row, attempts, reason]))
            .collect();
        sqlx::query(stmt(&self.queries.dead_letter))
            .bind(serde_json::Value::Array(list).to_string())
            .bind(crate::poll::utc(now))
            .execute(&self.pool)
            .await
            .map_err(|e| self.db_err("dead-lettering events", e))?;
        Ok(())
    }
}
