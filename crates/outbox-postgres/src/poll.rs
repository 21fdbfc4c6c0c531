//! The polling source: claims batches with `FOR UPDATE SKIP LOCKED` in a transaction that
//! stays open while the batch is published, then records every outcome and commits.
//!
//! Why a held transaction instead of a lease column: the row locks are the claim. If the relay
//! is killed, its connection closes, PostgreSQL rolls the transaction back and the events are
//! claimable by another replica at once; there is no lease to expire and no extra write per
//! claim. A relay that hangs instead is cut off by `idle_in_transaction_session_timeout`
//! (`source.claim_timeout`).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::aggregate_seq::{self, AssignedPositions};
use outbox_core::backend::SettledBatch;
use outbox_core::enqueue::decode_headers;
use outbox_core::source::{Fetched, Settlement};
use outbox_core::{DeadLetterPolicy, Event, Ordering, Source, SourceError};
use outbox_sql::poll::{OutcomeStatements, Statement, claimed_event, record_outcomes};
use sqlx::postgres::{PgListener, PgRow};
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, Row, Transaction};
use time::OffsetDateTime;

use crate::config::{OnDelivered, PostgresConfig};
use crate::error::source_error;
use crate::sql::{Cols, Queries, stmt};

/// The first key of the claim-turn advisory lock (`pg_advisory_xact_lock(int, int)`, a key
/// space apart from the single-key locks of the ordering trigger and `migrate`).
const TURN_LOCK_CLASS: i32 = 0x6f62_7478; // "obtx"
/// How long a claim waits for another replica's turn before claiming beside it.
const TURN_WAIT: Duration = Duration::from_millis(100);

/// Reads the outbox by polling. One instance per relay worker; each holds at most one claim
/// transaction (one pooled connection) at a time.
pub struct PgPollSource {
    pool: PgPool,
    queries: Arc<Queries>,
    table: String,
    ordering: Ordering,
    hold_dead: bool,
    on_delivered: OnDelivered,
    claim: Option<Transaction<'static, Postgres>>,
    /// The delivery positions of the claimed batch (ordering on), until it settles.
    positions: Option<AssignedPositions>,
    claim_timeout: std::time::Duration,
    /// Through a transaction pooler: the claim timeout is set per claim (`SET LOCAL`).
    transaction_pooling: bool,
    listener: Option<PgListener>,
    wakeup_channel: Option<String>,
    /// Replicas take turns at claiming (`source.claim_turns`).
    claim_turns: bool,
    /// The second key of this table's claim-turn lock.
    turn_key: i32,
}

impl std::fmt::Debug for PgPollSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgPollSource")
            .field("table", &self.table)
            .field("ordering", &self.ordering)
            .field("claim_open", &self.claim.is_some())
            .finish_non_exhaustive()
    }
}

impl PgPollSource {
    /// A source over `config`'s table using `pool` (see [`crate::connect`]).
    pub fn new(
        pool: PgPool,
        config: &PostgresConfig,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> Self {
        let table = config.qualified_table();
        Self {
            pool,
            queries: Arc::new(Queries::new(&table)),
            claim_turns: config.claim_turns,
            turn_key: turn_key(&table.to_string()),
            table: table.to_string(),
            ordering,
            hold_dead: dead_letter == DeadLetterPolicy::HoldAggregate,
            on_delivered: config.on_delivered,
            claim: None,
            positions: None,
            claim_timeout: config.claim_timeout,
            transaction_pooling: config.transaction_pooling,
            listener: None,
            wakeup_channel: config
                .listen_notify
                .then(|| format!("{}_wakeup", config.table.as_str())),
        }
    }

    /// Runs `ANALYZE` on the outbox table when it has no planner statistics yet and already
    /// holds a backlog of 1,000 rows or more (a table filled before autovacuum's first pass,
    /// or a partitioned parent, which autovacuum never analyzes): without them the first
    /// claims can be planned as full scans. An empty or small table is left alone, so that
    /// statistics saying "empty" never outlive the table's growth. The relay calls it once
    /// at start.
    pub async fn analyze_if_never_analyzed(
        pool: &PgPool,
        config: &PostgresConfig,
    ) -> Result<(), SourceError> {
        let table = config.qualified_table();
        let sql = crate::sql::render(
            include_str!("../queries/outbox_analyze_if_never.sql"),
            &table,
        );
        let e = |e| source_error("collecting planner statistics", &table.to_string(), e);
        // An explicit transaction: the statement may pass a transaction pooler (crate::db).
        let mut tx = pool.begin().await.map_err(e)?;
        crate::sql::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .map_err(e)?;
        tx.commit().await.map_err(e)
    }

    fn err(&self, context: &str, e: sqlx::Error) -> SourceError {
        source_error(context, &self.table, e)
    }

    /// Replicas take turns: a claim transaction first takes the table's claim lock, which it
    /// holds until it settles, so a second replica's claim waits for the first one's batch
    /// instead of colliding with it (claiming events whose aggregates it holds, and
    /// releasing them). The wait is bounded by [`TURN_WAIT`]: a replica whose batch takes
    /// longer (a slow broker, a paused relay) does not hold the others back; they claim
    /// beside it, as without turns. Turns are a speed-up only: the claim's own checks keep
    /// the order whatever happens here.
    async fn wait_for_turn(
        &self,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<(), SourceError> {
        let got: bool = crate::sql::query_scalar("SELECT pg_try_advisory_xact_lock($1, $2)")
            .bind(TURN_LOCK_CLASS)
            .bind(self.turn_key)
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| self.err("taking the claim turn", e))?;
        if got {
            return Ok(());
        }
        let wait = format!(
            "SAVEPOINT outbox_turn; SET LOCAL lock_timeout = {}; \
             SELECT pg_advisory_xact_lock({TURN_LOCK_CLASS}, {}); \
             SET LOCAL lock_timeout = 0; RELEASE SAVEPOINT outbox_turn",
            TURN_WAIT.as_millis(),
            self.turn_key,
        );
        if sqlx::raw_sql(sqlx::AssertSqlSafe(wait))
            .execute(&mut **tx)
            .await
            .is_err()
        {
            // Still busy after TURN_WAIT: claim beside it.
            sqlx::raw_sql("ROLLBACK TO SAVEPOINT outbox_turn; RELEASE SAVEPOINT outbox_turn")
                .execute(&mut **tx)
                .await
                .map_err(|e| self.err("giving up the claim turn", e))?;
        }
        Ok(())
    }

    async fn claim(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        // The server ends a claim transaction idle for `claim_timeout`
        // (`idle_in_transaction_session_timeout`), freeing its rows for other replicas: from
        // before the claim started, so the deadline errs early.
        let valid_until = tokio::time::Instant::now() + self.claim_timeout;
        let begun = if self.transaction_pooling {
            // No session settings through a pooler: the timeout lives as long as the claim.
            let begin = format!(
                "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}",
                self.claim_timeout.as_millis()
            );
            self.pool.begin_with(sqlx::AssertSqlSafe(begin)).await
        } else {
            self.pool.begin().await
        };
        let mut tx = begun.map_err(|e| self.err("starting a claim transaction", e))?;
        if self.claim_turns && self.ordering != Ordering::None {
            self.wait_for_turn(&mut tx).await?;
        }
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match self.ordering {
            Ordering::None => {
                crate::sql::query(stmt(&self.queries.claim_batch_unordered))
                    .bind(now)
                    .bind(limit_i64)
                    .fetch_all(&mut *tx)
                    .await
            }
            Ordering::PerAggregate | Ordering::Total => {
                crate::sql::query(stmt(&self.queries.claim_batch))
                    .bind(now)
                    .bind(limit_i64)
                    .bind(self.hold_dead)
                    .fetch_all(&mut *tx)
                    .await
            }
        }
        .map_err(|e| self.err("claiming a batch", e))?;
        let claimed = rows.len();
        let ordered = self.ordering != Ordering::None;
        let mut events = Vec::with_capacity(claimed);
        let mut heads = Vec::with_capacity(if ordered { claimed } else { 0 });
        for row in &rows {
            let (event, gap) = decode(row).map_err(|e| self.err("reading a claimed event", e))?;
            // Deliver only what precedes the first earlier event this batch does not hold;
            // the rest stays locked, untouched, until commit, then is claimable again.
            if gap.is_none_or(|g| event.position.0 < g) {
                if ordered {
                    heads.push(
                        row.try_get::<i64, _>(10)
                            .map_err(|e| self.err("reading a claimed event", e))?,
                    );
                }
                events.push(event);
            }
        }
        if events.is_empty() {
            tx.commit()
                .await
                .map_err(|e| self.err("ending an empty claim", e))?;
            return Ok(Fetched::default());
        }
        self.positions = ordered.then(|| aggregate_seq::assign(&mut events, &heads));
        self.claim = Some(tx);
        // A claim that had to release events collided with another replica's: it holds
        // earlier events of these aggregates. Claiming again at once would mostly collide
        // again (and run the claim's costly gap path each time); pausing for the poll
        // interval lets that replica settle first. One relay alone never releases here.
        let collided = events.len() < claimed;
        Ok(Fetched {
            more: claimed >= limit && !collided,
            events,
            valid_until: Some(valid_until),
        })
    }

    async fn record(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        let Some(mut tx) = self.claim.take() else {
            self.positions = None;
            return Ok(());
        };
        let statements = Outcomes {
            queries: &self.queries,
            now,
        };
        let batch = SettledBatch::sort(settlements);
        record_outcomes(&mut *tx, &statements, self.on_delivered, &batch)
            .await
            .map_err(|f| self.err(f.step, f.error))?;
        // In the same transaction as the outcomes: a head never moves without them.
        let advanced = self
            .positions
            .take()
            .map(|p| p.advanced(settlements, true))
            .unwrap_or_default();
        if !advanced.is_empty() {
            let mut types = Vec::with_capacity(advanced.len());
            let mut ids = Vec::with_capacity(advanced.len());
            let mut heads = Vec::with_capacity(advanced.len());
            for (t, id, n) in advanced {
                types.push(t);
                ids.push(id);
                heads.push(n);
            }
            crate::sql::query(stmt(&self.queries.positions_advance))
                .bind(&types)
                .bind(&ids)
                .bind(&heads)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err("recording delivery positions", e))?;
        }
        tx.commit()
            .await
            .map_err(|e| self.err("committing batch outcomes", e))
    }
}

/// A stable key for `table` (FNV-1a, folded to 32 bits): every replica computes the same.
fn turn_key(table: &str) -> i32 {
    let hash = table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    i32::from_ne_bytes(((hash >> 32) as u32 ^ hash as u32).to_ne_bytes())
}

/// The settle statements of one batch: each list bound as arrays (`unnest`), with the
/// settle's time.
struct Outcomes<'a> {
    queries: &'a Queries,
    now: OffsetDateTime,
}

impl OutcomeStatements<Postgres> for Outcomes<'_> {
    fn mark_delivered(&self, batch: &SettledBatch<'_>) -> Statement<Postgres> {
        crate::sql::query(stmt(&self.queries.mark_delivered))
            .bind(&batch.delivered)
            .bind(self.now)
    }

    fn delete_delivered(&self, batch: &SettledBatch<'_>) -> Statement<Postgres> {
        crate::sql::query(stmt(&self.queries.delete_delivered)).bind(&batch.delivered)
    }

    fn schedule_retry(&self, batch: &SettledBatch<'_>) -> Statement<Postgres> {
        // One array a column.
        let retries = &batch.retries;
        let retry_seqs: Vec<i64> = retries.iter().map(|r| r.0).collect();
        let retry_at: Vec<OffsetDateTime> = retries.iter().map(|r| r.1).collect();
        let retry_errors: Vec<&str> = retries.iter().map(|r| r.2).collect();
        crate::sql::query(stmt(&self.queries.schedule_retry))
            .bind(&retry_seqs)
            .bind(&retry_at)
            .bind(&retry_errors)
    }

    fn dead_letter(&self, batch: &SettledBatch<'_>) -> Statement<Postgres> {
        let (dead_seqs, dead_reasons): (Vec<i64>, Vec<&str>) = batch.dead.iter().copied().unzip();
        crate::sql::query(stmt(&self.queries.dead_letter))
            .bind(&dead_seqs)
            .bind(&dead_reasons)
            .bind(self.now)
    }
}

/// One claimed row: the event and the position of the first earlier event of its aggregate
/// that the batch does not hold (none: nothing is missing).
fn decode(row: &PgRow) -> Result<(Event, Option<i64>), sqlx::Error> {
    let headers: Json<serde_json::Map<String, serde_json::Value>> = row.try_get(6)?;
    let event = claimed_event(&Cols(row), decode_headers(headers.0))?;
    Ok((event, row.try_get(9)?))
}

impl Source for PgPollSource {
    async fn fetch(&mut self, limit: usize, now: OffsetDateTime) -> Result<Fetched, SourceError> {
        if let Some(stale) = self.claim.take() {
            // A fetch without settle: release the previous claim untouched.
            self.positions = None;
            let _ = stale.rollback().await;
        }
        self.claim(limit, now).await
    }

    async fn settle(
        &mut self,
        settlements: &[Settlement],
        now: OffsetDateTime,
    ) -> Result<(), SourceError> {
        self.record(settlements, now).await
    }

    async fn wait_for_events(&mut self, max: Duration) {
        let Some(channel) = self.wakeup_channel.clone() else {
            tokio::time::sleep(max).await;
            return;
        };
        if self.listener.is_none() {
            match PgListener::connect_with(&self.pool).await {
                Ok(mut l) => match l.listen(&channel).await {
                    Ok(()) => self.listener = Some(l),
                    Err(e) => tracing::warn!(error = %e, "LISTEN failed; polling only"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "could not open the LISTEN connection; polling only")
                }
            }
        }
        let Some(listener) = self.listener.as_mut() else {
            tokio::time::sleep(max).await;
            return;
        };
        let deadline = tokio::time::Instant::now() + max;
        match tokio::time::timeout_at(deadline, listener.recv()).await {
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "LISTEN connection lost; reconnecting on next wait");
                self.listener = None;
                tokio::time::sleep_until(deadline).await;
            }
        }
    }
}
