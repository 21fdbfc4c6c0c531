//! Retention: removes delivered events older than a window, without long locks and without
//! fighting the relay. Used by `outbox retention run` and by the relay's schedule.
//!
//! - **Polling mode** (`on_delivered = "mark"`): deletes rows `state = 'delivered'` with
//!   `delivered_at` before the cutoff, in bounded batches (one short transaction each, oldest
//!   first through `*_delivered_at_idx`, `FOR UPDATE SKIP LOCKED`), pausing between batches so
//!   vacuum and the relay get their turn. Pending and dead rows are never selected (dead rows
//!   have their own purge, `outbox dead purge`). With `on_delivered = "delete"` there is
//!   nothing to delete and a run costs one index probe.
//! - **CDC mode**: rows stay `pending` (the stream carries the event), so a row counts as
//!   delivered only once the replication slot has confirmed its transaction. A run observes
//!   the server (oldest running xid, WAL insert position), waits until the slot's
//!   `confirmed_flush_lsn` passes that position, then deletes rows older than the window whose
//!   xid is older than the observed horizon (see `queries/retention_cdc_*.sql`). If the slot
//!   does not get there in time (a retry holds it back, the relay is down), nothing is deleted
//!   and the report says why.
//! - **Partitioned mode** (`partitioning = "hourly" | "daily" | "weekly"`): first the
//!   partitions ahead are created, then partitions entirely older than the window are detached
//!   and dropped, each in its own transaction that counts the detached rows and rolls back if
//!   any is pending, dead, or delivered inside the window: nothing undelivered is ever dropped.
//!   Then the batched delete runs as above for what remains (the DEFAULT partition and kept
//!   partitions).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::admin::{KeptPartition, RetentionPreview, RetentionReport, RetentionSettings};
use outbox_core::retention_batches::delete_in_batches;
use outbox_core::{Identifier, QualifiedTable};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::config::{Mode, PostgresConfig};
use crate::partition::{self, Layout, Partition, Partitioning};
use crate::sql::render;

/// Why a retention run failed.
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// The database refused a statement or could not be reached.
    #[error("retention on outbox table {table} failed while {doing}")]
    Database {
        /// The table.
        table: String,
        /// What the run was doing.
        doing: &'static str,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// The table's layout does not match `source.partitioning`.
    #[error("{0}")]
    Layout(String),
}

#[derive(Debug)]
struct RetentionQueries {
    delete_batch: Arc<str>,
    count: Arc<str>,
    cdc_delete_batch: Arc<str>,
    cdc_count: Arc<str>,
}

macro_rules! query_file {
    ($name:literal) => {
        include_str!(concat!("../queries/", $name, ".sql"))
    };
}

/// Retention for one PostgreSQL outbox table.
#[derive(Debug)]
pub struct PgRetention {
    pool: crate::db::Db,
    table: QualifiedTable,
    mode: Mode,
    partitioning: Partitioning,
    slot: Identifier,
    queries: RetentionQueries,
}

impl PgRetention {
    /// Retention over `config`'s table using `pool`.
    pub fn new(pool: PgPool, config: &PostgresConfig) -> Self {
        let table = config.qualified_table();
        let r = |t: &str| -> Arc<str> { render(t, &table).into() };
        let queries = RetentionQueries {
            delete_batch: r(query_file!("retention_delete_batch")),
            count: r(query_file!("retention_count")),
            cdc_delete_batch: r(query_file!("retention_cdc_delete_batch")),
            cdc_count: r(query_file!("retention_cdc_count")),
        };
        Self {
            pool: crate::db::Db::new(pool, config.transaction_pooling),
            mode: config.mode,
            partitioning: config.partitioning,
            slot: config.slot.clone(),
            table,
            queries,
        }
    }

    fn err(&self, doing: &'static str) -> impl Fn(sqlx::Error) -> RetentionError + '_ {
        move |source| RetentionError::Database {
            table: self.table.to_string(),
            doing,
            source,
        }
    }

    /// Checks that the table's layout matches `source.partitioning`.
    async fn check_layout(&self) -> Result<Layout, RetentionError> {
        let mut tx = self.pool.begin().await.map_err(self.err("connecting"))?;
        let found = partition::layout(&mut tx, &self.table)
            .await
            .map_err(self.err("reading the table's layout"))?;
        tx.commit()
            .await
            .map_err(self.err("reading the table's layout"))?;
        layout_matches(&self.table, self.partitioning, found)?;
        Ok(found)
    }

    /// What [`run`](Self::run) would remove now, without removing anything.
    pub async fn preview(
        &self,
        now: OffsetDateTime,
        keep: Duration,
    ) -> Result<RetentionPreview, RetentionError> {
        let cutoff = now - keep;
        let layout = self.check_layout().await?;
        let mut preview = RetentionPreview::default();
        if layout == Layout::Partitioned {
            let mut tx = self.pool.begin().await.map_err(self.err("connecting"))?;
            for p in self.old_partitions(&mut tx, cutoff).await? {
                let c = partition::contents(&mut tx, &self.table, &p.name, cutoff)
                    .await
                    .map_err(self.err("counting a partition's rows"))?;
                match keep_reason(c) {
                    Some(reason) => preview.partitions_kept.push(KeptPartition {
                        name: p.name,
                        reason,
                    }),
                    None => preview
                        .partitions_dropped
                        .push((p.name, u64::try_from(c.rows).unwrap_or(0))),
                }
            }
            tx.commit()
                .await
                .map_err(self.err("counting a partition's rows"))?;
        }
        let (rows, oldest): (i64, Option<OffsetDateTime>) = match self.mode {
            Mode::Poll => crate::sql::query_as(crate::sql::stmt(&self.queries.count))
                .bind(cutoff)
                .fetch_one(&self.pool)
                .await
                .map_err(self.err("counting delivered rows"))?,
            Mode::Cdc => {
                let (xmin, _lsn) = self.cdc_observe().await?;
                preview.notes.push(format!(
                    "CDC mode: counted rows whose transaction has ended; a run deletes them only once slot `{}` has confirmed them",
                    self.slot
                ));
                crate::sql::query_as(crate::sql::stmt(&self.queries.cdc_count))
                    .bind(cutoff)
                    .bind(xmin)
                    .fetch_one(&self.pool)
                    .await
                    .map_err(self.err("counting streamed rows"))?
            }
        };
        preview.rows = u64::try_from(rows).unwrap_or(0);
        preview.oldest = oldest;
        Ok(preview)
    }

    /// Removes what is past the window: rotates partitions (partitioned mode), then deletes
    /// in batches of `settings.batch`. `progress` is called after every batch with the rows
    /// deleted so far; returning `Break` stops the run after that batch.
    pub async fn run(
        &self,
        now: OffsetDateTime,
        settings: &RetentionSettings,
        progress: &mut (dyn FnMut(u64) -> ControlFlow<()> + Send),
    ) -> Result<RetentionReport, RetentionError> {
        let cutoff = now - settings.keep;
        let layout = self.check_layout().await?;
        let mut report = RetentionReport::default();
        if layout == Layout::Partitioned {
            self.rotate(now, cutoff, &mut report).await?;
        }
        match self.mode {
            Mode::Poll => {
                self.delete_batches(
                    &self.queries.delete_batch,
                    cutoff,
                    None,
                    settings,
                    progress,
                    &mut report,
                )
                .await?;
            }
            Mode::Cdc => {
                if let Some(xmin) = self.cdc_horizon(settings.cdc_wait, &mut report).await? {
                    self.delete_batches(
                        &self.queries.cdc_delete_batch,
                        cutoff,
                        Some(xmin),
                        settings,
                        progress,
                        &mut report,
                    )
                    .await?;
                }
            }
        }
        Ok(report)
    }

    async fn delete_batches(
        &self,
        sql: &Arc<str>,
        cutoff: OffsetDateTime,
        xmin: Option<i64>,
        settings: &RetentionSettings,
        progress: &mut (dyn FnMut(u64) -> ControlFlow<()> + Send),
        report: &mut RetentionReport,
    ) -> Result<(), RetentionError> {
        // A short batch ends the run: nothing eligible is left (rows locked by someone else
        // are skipped and picked up by the next run).
        delete_in_batches(
            settings.batch,
            settings.pause,
            progress,
            report,
            |batch| async move {
                let mut q = crate::sql::query_scalar::<i64>(crate::sql::stmt(sql))
                    .bind(cutoff)
                    .bind(i64::from(batch));
                if let Some(xmin) = xmin {
                    q = q.bind(xmin);
                }
                let n = q
                    .fetch_one(&self.pool)
                    .await
                    .map_err(self.err("deleting a batch of delivered rows"))?;
                Ok(u64::try_from(n).unwrap_or(0))
            },
        )
        .await
    }

    /// Step 1 of CDC retention: (oldest running xid as 32 bits, WAL insert position).
    async fn cdc_observe(&self) -> Result<(i64, String), RetentionError> {
        crate::sql::query_as(query_file!("retention_cdc_horizon"))
            .fetch_one(&self.pool)
            .await
            .map_err(self.err("observing the transaction horizon"))
    }

    /// Observes the horizon and waits (up to `wait`) until the slot has confirmed it.
    /// `None`: not confirmed in time, or no slot; the reason is added to the report.
    async fn cdc_horizon(
        &self,
        wait: Duration,
        report: &mut RetentionReport,
    ) -> Result<Option<i64>, RetentionError> {
        let (xmin, lsn) = self.cdc_observe().await?;
        let deadline = Instant::now() + wait;
        loop {
            let row: Option<(Option<bool>, Option<String>)> =
                crate::sql::query_as(query_file!("retention_cdc_slot_passed"))
                    .bind(self.slot.as_str())
                    .bind(&lsn)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(self.err("reading the replication slot"))?;
            match row {
                None => {
                    report.notes.push(format!(
                        "CDC mode: replication slot `{}` does not exist, so nothing is known to be delivered; no row deleted (run `outbox migrate`)",
                        self.slot
                    ));
                    return Ok(None);
                }
                Some((Some(true), _)) => return Ok(Some(xmin)),
                Some((_, confirmed)) if Instant::now() >= deadline => {
                    report.notes.push(format!(
                        "CDC mode: slot `{}` has not confirmed the stream up to {lsn} within {} (confirmed: {}); no row deleted this run. A retrying event or a stopped relay holds the slot back; the next run tries again",
                        self.slot,
                        humantime_serde::re::humantime::format_duration(wait),
                        confirmed.as_deref().unwrap_or("nothing yet"),
                    ));
                    return Ok(None);
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// The partitions created by this tool whose whole range is older than `cutoff`.
    async fn old_partitions(
        &self,
        conn: &mut sqlx::PgConnection,
        cutoff: OffsetDateTime,
    ) -> Result<Vec<Partition>, RetentionError> {
        let names = partition::list(conn, &self.table)
            .await
            .map_err(self.err("listing partitions"))?;
        Ok(names
            .into_iter()
            .filter(|(_, is_default)| !is_default)
            .filter_map(|(name, _)| Partition::parse(self.table.table.as_str(), &name))
            .filter(|p| p.to <= cutoff)
            .collect())
    }

    /// Creates partitions ahead and drops old ones that hold only delivered rows past the
    /// window.
    async fn rotate(
        &self,
        now: OffsetDateTime,
        cutoff: OffsetDateTime,
        report: &mut RetentionReport,
    ) -> Result<(), RetentionError> {
        let created = async {
            let mut tx = self.pool.begin().await?;
            if !partition::begin_ddl(&mut tx, &self.table).await? {
                return Ok(None);
            }
            let created =
                partition::create_ahead(&mut tx, &self.table, self.partitioning, now).await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(Some(created))
        }
        .await;
        match created {
            Ok(Some(created)) => report.partitions_created = created,
            Ok(None) => {
                report.notes.push(format!(
                    "another retention run is rotating the partitions of {}; this run only deletes rows",
                    self.table
                ));
                return Ok(());
            }
            Err(e) if lock_timeout(&e) => report.notes.push(format!(
                "creating partitions ahead: could not lock {} within {}; the next run tries again",
                self.table,
                partition::LOCK_TIMEOUT
            )),
            Err(e) if is_db_error(&e) => report.notes.push(format!(
                "creating partitions ahead of {} failed: {e} (rows for that period may already sit in the DEFAULT partition)",
                self.table
            )),
            Err(e) => return Err(self.err("creating partitions")(e)),
        }
        let old = {
            let mut tx = self.pool.begin().await.map_err(self.err("connecting"))?;
            let old = self.old_partitions(&mut tx, cutoff).await?;
            tx.commit()
                .await
                .map_err(self.err("listing old partitions"))?;
            old
        };
        for p in old {
            let outcome = async {
                let mut tx = self.pool.begin().await?;
                if !partition::begin_ddl(&mut tx, &self.table).await? {
                    return Ok(Err(
                        "another retention run is rotating this table's partitions".to_owned(),
                    ));
                }
                // Detach first: from here on no statement can add or change a row of it,
                // so the count below is final.
                partition::detach(&mut tx, &self.table, &p.name).await?;
                let c = partition::contents(&mut tx, &self.table, &p.name, cutoff).await?;
                if let Some(reason) = keep_reason(c) {
                    tx.rollback().await?;
                    return Ok(Err(reason));
                }
                partition::drop_detached(&mut tx, &self.table, &p.name).await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(Ok(u64::try_from(c.rows).unwrap_or(0)))
            }
            .await;
            match outcome {
                Ok(Ok(rows)) => {
                    tracing::info!(table = %self.table, partition = %p.name, rows, "dropped partition");
                    report.partitions_dropped.push((p.name, rows));
                }
                Ok(Err(reason)) => {
                    tracing::info!(table = %self.table, partition = %p.name, %reason, "kept partition");
                    report.partitions_kept.push(KeptPartition {
                        name: p.name,
                        reason,
                    });
                }
                Err(e) if lock_timeout(&e) => {
                    report.partitions_kept.push(KeptPartition {
                        name: p.name,
                        reason: format!(
                            "could not lock {} within {} (long claim or query); the next run tries again",
                            self.table,
                            partition::LOCK_TIMEOUT
                        ),
                    });
                    break;
                }
                Err(e) => return Err(self.err("dropping an old partition")(e)),
            }
        }
        Ok(())
    }
}

fn keep_reason(c: partition::Contents) -> Option<String> {
    if c.undelivered > 0 {
        Some(format!(
            "holds {} undelivered (pending or dead) event(s); their delivered neighbours are deleted row by row instead",
            c.undelivered
        ))
    } else if c.in_window > 0 {
        Some(format!(
            "holds {} event(s) delivered within the retention window",
            c.in_window
        ))
    } else {
        None
    }
}

fn lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

fn is_db_error(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_))
}

/// The clear error for a table whose layout differs from the configured one. Nothing is
/// ever converted silently.
pub(crate) fn layout_matches(
    table: &QualifiedTable,
    partitioning: Partitioning,
    found: Layout,
) -> Result<(), RetentionError> {
    match (partitioning, found) {
        (_, Layout::Missing) => Err(RetentionError::Layout(format!(
            "outbox table {table} does not exist; run `outbox migrate` first"
        ))),
        (Partitioning::None, Layout::Partitioned) => Err(RetentionError::Layout(format!(
            "outbox table {table} is partitioned, but source.partitioning is \"none\"; set source.partitioning to the table's period (\"hourly\", \"daily\" or \"weekly\")"
        ))),
        (p, Layout::Plain) if p != Partitioning::None => Err(RetentionError::Layout(format!(
            "outbox table {table} is a plain (not partitioned) table, but source.partitioning is \"{}\"; an existing table is never converted silently: {}",
            p.as_str(),
            CONVERT_HOW
        ))),
        _ => Ok(()),
    }
}

/// How to move an existing plain outbox to the partitioned layout (docs/operations.md).
pub(crate) const CONVERT_HOW: &str = "either keep source.partitioning = \"none\", or create a partitioned table under a new name (source.table = \"outbox_v2\", run `outbox migrate`), point producers at it, let a relay configured for the old table drain it, then drop the old table (docs/operations.md, \"Partitioned outbox\")";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_mismatch_is_an_error_that_says_how_to_fix_it() {
        let t = QualifiedTable::new(
            Some(Identifier::new("public").expect("valid")),
            Identifier::new("outbox").expect("valid"),
        );
        let e = layout_matches(&t, Partitioning::Daily, Layout::Plain).expect_err("mismatch");
        assert!(e.to_string().contains("never converted silently"), "{e}");
        let e = layout_matches(&t, Partitioning::None, Layout::Partitioned).expect_err("mismatch");
        assert!(e.to_string().contains("source.partitioning"), "{e}");
        assert!(layout_matches(&t, Partitioning::None, Layout::Plain).is_ok());
        assert!(layout_matches(&t, Partitioning::Weekly, Layout::Partitioned).is_ok());
    }

    #[test]
    fn a_partition_with_anything_undelivered_is_kept() {
        let c = |undelivered, in_window| partition::Contents {
            undelivered,
            in_window,
            rows: 10,
        };
        assert!(keep_reason(c(1, 0)).expect("kept").contains("undelivered"));
        assert!(keep_reason(c(0, 2)).expect("kept").contains("window"));
        assert_eq!(keep_reason(c(0, 0)), None);
    }
}
