//! The lease-token claim (`source.claim = "lease"`), for servers without `SKIP LOCKED` or
//! `JSON_TABLE` (MySQL before 8.0, MariaDB before 10.6): instead of row locks held by an open
//! transaction, a claim writes its token and an expiry on the rows it takes.
//!
//! - **Claim**: one `UPDATE` marks the next batch (`lease_claim.sql`: the candidates are
//!   chosen by a plain read, then each is locked by primary key and checked again, so two
//!   relays never both take a row), then one `SELECT` reads the rows by token.
//! - **Order**: the same rule as the `SKIP LOCKED` claim (see `poll.rs`): an aggregate goes
//!   out only as a run of consecutive `seq`s, and not at all while an earlier event of it is
//!   pending outside this claim (claimed by another relay, or waiting). Those rows are given
//!   back at once.
//! - **Settle**: one transaction records the outcomes and clears the token from every row it
//!   still marks. Deliveries are recorded whatever the lease (they are facts about the
//!   broker); retries and dead letters only while the row still carries this claim's token.
//! - **A relay that dies** leaves its rows claimed until the lease expires (`claim_timeout`,
//!   on the server's clock). The relay publishes nothing it could not finish before its
//!   lease runs out, so a paused relay never publishes over a newer claim.
//!
//! Every statement avoids `JSON_TABLE`: lists of positions go as `IN (?, ?, …)`, padded to a
//! power of two so a few prepared statements serve every batch size.

use std::collections::HashSet;

use outbox_core::backend::SettledBatch;
use outbox_core::source::{Fetched, Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, Ordering, SourceError};
use sqlx::MySqlPool;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::{MySqlConfig, OnDelivered};
use crate::poll::{Claims, decode, first_seqs, keep_runs, order_by_seq, utc};
use crate::sql::stmt;

/// Reads the outbox by polling with the lease-token claim. One instance per relay worker.
pub struct MySqlLeaseSource {
    claims: Claims,
    lease: std::time::Duration,
    /// The token and the row positions of the claim being published, until it settles.
    token: Option<(String, Vec<i64>)>,
}

impl std::fmt::Debug for MySqlLeaseSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.claims
            .debug(f, "MySqlLeaseSource", self.token.is_some())
    }
}

/// How often a settle that lost a deadlock is run again.
const DEADLOCK_RETRIES: u32 = 5;

/// InnoDB chose this transaction as a deadlock victim and rolled it back
/// (`ER_LOCK_DEADLOCK`): running it again is the prescribed answer.
fn is_deadlock(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|m| m.number() == 1213))
}

/// `(?, ?, …)` for `n` values padded to the next power of two, and that padded count.
fn in_list(n: usize) -> (String, usize) {
    let padded = n.max(1).next_power_of_two();
    (format!("({})", vec!["?"; padded].join(", ")), padded)
}

/// `values` padded to `len` with copies of its last one (harmless in `IN`).
fn padded(values: &[i64], len: usize) -> impl Iterator<Item = i64> + '_ {
    let last = values.last().copied().unwrap_or(0);
    values
        .iter()
        .copied()
        .chain(std::iter::repeat(last))
        .take(len)
}

impl MySqlLeaseSource {
    /// A source over `config`'s table using `pool` (see [`crate::connect`]).
    pub fn new(
        pool: MySqlPool,
        config: &MySqlConfig,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> Self {
        Self {
            claims: Claims::new(pool, config, ordering, dead_letter),
            lease: config.claim_timeout,
            token: None,
        }
    }

    /// Clears `token` from the claimed rows at `positions` that it still marks (by primary
    /// key: no index scan to take locks in another order than the claim's).
    fn release_statement(&self, positions: &[i64]) -> (String, usize) {
        let (list, len) = in_list(positions.len());
        let table = &self.claims.queries.table;
        (
            format!(
                "UPDATE {table} SET claimed_by = NULL, claimed_until = NULL \
                 WHERE position IN {list} AND claimed_by = ?"
            ),
            len,
        )
    }

    async fn release(&self, token: &str, positions: &[i64]) -> Result<(), SourceError> {
        if positions.is_empty() {
            return Ok(());
        }
        let (sql, len) = self.release_statement(positions);
        // Only the number of placeholders varies; every value is bound.
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for p in padded(positions, len) {
            q = q.bind(p);
        }
        q.bind(token)
            .execute(&self.claims.pool)
            .await
            .map_err(|e| self.claims.err("giving back a claim", e))
            .map(drop)
    }

    /// The claimed aggregates whose first pending (or, held, dead) event comes before this
    /// claim's first one: two index-only probes per aggregate, in one statement.
    async fn blocked(
        &self,
        firsts: &[(&str, &str, i64)],
    ) -> Result<HashSet<(String, String)>, SourceError> {
        let table = &self.claims.queries.table;
        let one = format!(
            "SELECT ? AS t, ? AS i FROM DUAL WHERE COALESCE((SELECT e.seq FROM {table} AS e \
             WHERE e.aggregate_type = ? AND e.aggregate_id = ? AND e.state = 'pending' \
             ORDER BY e.seq LIMIT 1), ?) < ? OR (? AND COALESCE((SELECT d.seq FROM {table} AS d \
             WHERE d.aggregate_type = ? AND d.aggregate_id = ? AND d.state = 'dead' \
             ORDER BY d.seq LIMIT 1), ?) < ?)"
        );
        // Only the number of parts varies; the table name is a rendered, validated
        // identifier and every value is bound.
        let sql = vec![one; firsts.len()].join(" UNION ALL ");
        let mut q = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql));
        for (t, i, seq) in firsts {
            q = q
                .bind(*t)
                .bind(*i)
                .bind(*t)
                .bind(*i)
                .bind(*seq)
                .bind(*seq)
                .bind(self.claims.hold_dead)
                .bind(*t)
                .bind(*i)
                .bind(*seq)
                .bind(*seq);
        }
        let rows = q.fetch_all(&self.claims.pool).await.map_err(|e| {
            self.claims
                .err("checking the claimed aggregates' earlier events", e)
        })?;
        Ok(rows.into_iter().collect())
    }

    /// Claims the next batch ([`Source::fetch`](outbox_core::Source::fetch)).
    async fn claim(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        if let Some((stale, positions)) = self.token.take() {
            // A fetch without settle: give the previous claim back untouched.
            self.release(&stale, &positions).await?;
        }
        // The lease runs on the server's clock from the claim statement; measured from
        // before it here, so the deadline errs early.
        let valid_until = tokio::time::Instant::now() + self.lease;
        let token = Uuid::now_v7().hyphenated().to_string();
        let now_db = utc(now);
        let lease_us = i64::try_from(self.lease.as_micros()).unwrap_or(i64::MAX);
        let hold = self.claims.hold_dead && self.claims.ordering != Ordering::None;
        let far = time::PrimitiveDateTime::new(
            time::Date::from_calendar_date(9999, time::Month::December, 31)
                .unwrap_or(time::Date::MAX),
            time::Time::MIDNIGHT,
        );
        let mut attempt = 0;
        let taken = loop {
            let result = sqlx::query(stmt(&self.claims.queries.lease_claim))
                .bind(now_db)
                // With ordering off nothing waits behind a retrying event: no time is later.
                .bind(if self.claims.ordering == Ordering::None {
                    far
                } else {
                    now_db
                })
                .bind(hold)
                .bind(u64::try_from(limit).unwrap_or(u64::MAX))
                .bind(&token)
                .bind(lease_us)
                .execute(&self.claims.pool)
                .await;
            match result {
                Err(e) if is_deadlock(&e) && attempt < DEADLOCK_RETRIES => attempt += 1,
                other => {
                    break other
                        .map_err(|e| self.claims.err("claiming a batch", e))?
                        .rows_affected();
                }
            }
        };
        if taken == 0 {
            return Ok(Fetched::default());
        }
        let rows = sqlx::query(stmt(&self.claims.queries.lease_claimed))
            .bind(&token)
            .fetch_all(&self.claims.pool)
            .await
            .map_err(|e| self.claims.err("reading a claimed batch", e))?;
        let mut decoded = Vec::with_capacity(rows.len());
        for row in &rows {
            decoded.push(decode(row).map_err(|e| self.claims.err("reading a claimed event", e))?);
        }
        let positions: Vec<i64> = decoded.iter().map(|(e, _)| e.position.0).collect();
        let events = if self.claims.ordering == Ordering::None {
            decoded.into_iter().map(|(e, _)| e).collect()
        } else {
            order_by_seq(&mut decoded);
            let blocked = self.blocked(&first_seqs(&decoded)).await?;
            let (kept, dropped) = keep_runs(decoded, &blocked);
            // What may not go out is given back at once, for whoever may deliver it.
            self.release(&token, &dropped).await?;
            kept
        };
        if events.is_empty() {
            return Ok(Fetched::default());
        }
        self.token = Some((token, positions));
        Ok(Fetched {
            more: usize::try_from(taken).unwrap_or(usize::MAX) >= limit,
            events,
            valid_until: Some(valid_until),
        })
    }

    /// Records a claimed batch's outcomes and gives its rows back ([`Source::settle`](outbox_core::Source::settle)).
    async fn record(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let Some((token, positions)) = self.token.take() else {
            return Ok(());
        };
        // A deadlock with another relay's claim rolls the whole settle back; InnoDB asks
        // for the transaction to be run again, and nothing of it was applied.
        let mut attempt = 0;
        loop {
            match self.record_once(settlements, now, &token, &positions).await {
                Err(e) if is_deadlock(&e) && attempt < DEADLOCK_RETRIES => attempt += 1,
                other => return other.map_err(|e| self.claims.err("recording batch outcomes", e)),
            }
        }
    }

    async fn record_once(
        &self,
        settlements: &[Settlement],
        now: OffsetDateTime,
        token: &str,
        positions: &[i64],
    ) -> Result<(), sqlx::Error> {
        let now_db = utc(now);
        let delivered = SettledBatch::sort(settlements).delivered;
        let mut tx = self.claims.pool.begin().await?;
        if !delivered.is_empty() {
            let (list, len) = in_list(delivered.len());
            let table = &self.claims.queries.table;
            // Only the number of placeholders varies; every value is bound.
            let sql = match self.claims.on_delivered {
                OnDelivered::Mark => format!(
                    "UPDATE {table} SET state = 'delivered', delivered_at = ?, \
                     claimed_by = NULL, claimed_until = NULL \
                     WHERE position IN {list} AND state = 'pending'"
                ),
                OnDelivered::Delete => {
                    format!("DELETE FROM {table} WHERE position IN {list} AND state = 'pending'")
                }
            };
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            if self.claims.on_delivered == OnDelivered::Mark {
                q = q.bind(now_db);
            }
            for p in padded(&delivered, len) {
                q = q.bind(p);
            }
            q.execute(&mut *tx).await?;
        }
        // Failures are rare: one primary-key statement each.
        for s in settlements {
            match &s.outcome {
                Outcome::Retry { not_before, error } => {
                    sqlx::query(stmt(&self.claims.queries.lease_retry))
                        .bind(utc(*not_before))
                        .bind(error)
                        .bind(s.position.0)
                        .bind(token)
                        .execute(&mut *tx)
                        .await?;
                }
                Outcome::DeadLetter { reason } => {
                    sqlx::query(stmt(&self.claims.queries.lease_dead_letter))
                        .bind(reason)
                        .bind(now_db)
                        .bind(s.position.0)
                        .bind(token)
                        .execute(&mut *tx)
                        .await?;
                }
                Outcome::Delivered | Outcome::Released => {}
            }
        }
        let (sql, len) = self.release_statement(positions);
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        for p in padded(positions, len) {
            q = q.bind(p);
        }
        q.bind(token).execute(&mut *tx).await?;
        tx.commit().await
    }
}

outbox_core::forward_source!(MySqlLeaseSource, fetch = claim, settle = record);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_lists_are_padded_to_a_power_of_two() {
        assert_eq!(in_list(1), ("(?)".to_owned(), 1));
        assert_eq!(in_list(3).1, 4);
        assert_eq!(in_list(500).1, 512);
        assert_eq!(
            padded(&[7, 9, 11], 4).collect::<Vec<_>>(),
            vec![7, 9, 11, 11]
        );
    }
}
