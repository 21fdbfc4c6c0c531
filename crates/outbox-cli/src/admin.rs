//! `outbox migrate` and `outbox status`.

use anyhow::Context;
use outbox_core::source::Inspect;
use serde::Serialize;
use time::OffsetDateTime;

use crate::config::{Config, SourceConfig};

/// Creates or upgrades the outbox schema.
pub(crate) async fn migrate(config: &Config) -> anyhow::Result<()> {
    match &config.source {
        SourceConfig::Postgres(pg) => {
            let pool = outbox_postgres::connect(pg, 1)
                .await
                .with_context(|| format!("cannot connect to {}", pg.url))?;
            let options = outbox_postgres::MigrateOptions::from_config(pg);
            let report = outbox_postgres::migrate_with(&pool, &pg.qualified_table(), options)
                .await
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
            for p in &report.partitions_created {
                println!("created partition {p} of {}", pg.qualified_table());
            }
            if report.applied.is_empty() {
                println!(
                    "outbox table {} is up to date (schema version {})",
                    pg.qualified_table(),
                    report.version
                );
            } else {
                for (v, name) in &report.applied {
                    println!("applied migration {v} ({name}) to {}", pg.qualified_table());
                }
            }
            println!(
                "LISTEN/NOTIFY wake-up trigger: {}",
                if report.wakeup_trigger {
                    "installed (source.listen_notify = true)"
                } else {
                    "not installed"
                }
            );
            if pg.mode == outbox_postgres::Mode::Cdc {
                let cdc = outbox_postgres::setup_cdc(&pool, pg)
                    .await
                    .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
                println!(
                    "CDC publication `{}`: {} (inserts of {})",
                    pg.publication,
                    match (cdc.publication_created, cdc.publication_table_added) {
                        (true, _) => "created",
                        (_, true) => "table added",
                        _ => "exists",
                    },
                    pg.qualified_table()
                );
                println!(
                    "CDC replication slot `{}` (pgoutput): {}, streams from {}",
                    pg.slot,
                    if cdc.slot_created {
                        "created"
                    } else {
                        "exists"
                    },
                    cdc.slot_lsn.as_deref().unwrap_or("?")
                );
            }
        }
        SourceConfig::Sqlite(sq) => {
            let pool = outbox_sqlite::connect(sq)
                .await
                .with_context(|| format!("cannot open SQLite database `{}`", sq.path.display()))?;
            outbox_sqlite::migrate(&pool, &sq.table)
                .await
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
            println!(
                "outbox table {} in `{}` is up to date",
                sq.table,
                sq.path.display()
            );
        }
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct Status {
    database: String,
    table: String,
    #[serde(flatten)]
    backlog: outbox_core::source::Backlog,
    held_aggregates: Vec<outbox_postgres::HeldAggregate>,
    producer_lock_waits: Vec<outbox_postgres::LockWait>,
    /// PostgreSQL: pending events older than `metrics.stuck_after`, and the oldest open
    /// transaction (the xmin horizon's holder).
    #[serde(skip_serializing_if = "Option::is_none")]
    watchdog: Option<outbox_postgres::Watchdog>,
    /// CDC mode: the replication slot (pending events are WAL, not row state).
    #[serde(skip_serializing_if = "Option::is_none")]
    replication_slot: Option<outbox_postgres::SlotStatus>,
}

/// Prints the backlog and what holds delivery back.
pub(crate) async fn status(config: &Config, json: bool) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    let status = match &config.source {
        SourceConfig::Postgres(pg) if pg.mode == outbox_postgres::Mode::Cdc => {
            cdc_status(pg, now, json).await?
        }
        SourceConfig::Postgres(pg) => {
            let pool = outbox_postgres::connect(pg, 1)
                .await
                .with_context(|| format!("cannot connect to {}", pg.url))?;
            let inspector = outbox_postgres::PgInspector::new(pool, pg);
            let ctx = || format!("reading outbox table {}", pg.qualified_table());
            Status {
                database: pg.url.redacted(),
                table: pg.qualified_table().to_string(),
                backlog: inspector
                    .backlog_at(now)
                    .await
                    .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
                    .with_context(ctx)?,
                held_aggregates: inspector
                    .held_aggregates(now, 20)
                    .await
                    .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
                    .with_context(ctx)?,
                producer_lock_waits: inspector
                    .lock_waits(20)
                    .await
                    .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
                    .with_context(ctx)?,
                watchdog: Some(
                    inspector
                        .watchdog(now, config.metrics.stuck_after)
                        .await
                        .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
                        .with_context(ctx)?,
                ),
                replication_slot: None,
            }
        }
        SourceConfig::Sqlite(sq) => {
            let pool = outbox_sqlite::connect(sq)
                .await
                .with_context(|| format!("cannot open SQLite database `{}`", sq.path.display()))?;
            let inspector = outbox_sqlite::SqliteInspector::new(pool, sq);
            Status {
                database: sq.path.display().to_string(),
                table: sq.table.to_string(),
                backlog: inspector
                    .backlog()
                    .await
                    .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?,
                held_aggregates: Vec::new(),
                producer_lock_waits: Vec::new(),
                watchdog: None,
                replication_slot: None,
            }
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    let b = &status.backlog;
    println!("outbox {} in {}", status.table, status.database);
    if let Some(slot) = &status.replication_slot {
        print_slot(slot);
    }
    println!("  pending            {}", b.pending);
    println!("  retrying           {}", b.retrying);
    println!("  dead-lettered      {}", b.dead);
    println!(
        "  oldest pending     {:.1}s (not counting events waiting on backoff)",
        b.oldest_pending_age_seconds
    );
    match b.delivered_last_minute {
        Some(n) => println!("  published (1 min)  {n}"),
        None => println!("  published (1 min)  n/a (delivered rows are not kept)"),
    }
    if let Some(w) = &status.watchdog {
        println!(
            "  stuck              {} event(s) pending longer than {} (metrics.stuck_after)",
            w.stuck_events,
            humantime::format_duration(config.metrics.stuck_after)
        );
        match &w.oldest_transaction {
            Some(t) => println!("  horizon held by    {}", crate::why::describe(t)),
            None => println!("  horizon held by    no open transaction"),
        }
    }
    if status.held_aggregates.is_empty() && status.producer_lock_waits.is_empty() {
        println!("  blocked            nothing holds delivery back");
    }
    for h in &status.held_aggregates {
        let why = if h.state == "dead" {
            "dead-lettered (retry with `outbox dead retry`)".to_owned()
        } else {
            match h.next_attempt_at {
                Some(t) => format!(
                    "retrying (attempt {} failed; next at {})",
                    h.attempts,
                    crate::dead::when(t)
                ),
                None => format!("retrying (attempt {} failed; due now)", h.attempts),
            }
        };
        println!(
            "  held aggregate     {}/{}: head event {} {why}; {} event(s) wait behind it; last error: {}",
            h.aggregate_type,
            h.aggregate_id,
            h.head_id,
            h.waiting,
            h.last_error.as_deref().unwrap_or("-")
        );
    }
    for w in &status.producer_lock_waits {
        println!(
            "  producer waits     pid {} waits for the aggregate lock held by pid {} (transaction age {:.1}s, {}): {}",
            w.waiting_pid,
            w.holder_pid,
            w.holder_xact_age_seconds.unwrap_or(0.0),
            w.holder_state.as_deref().unwrap_or("?"),
            w.holder_query.as_deref().unwrap_or("")
        );
    }
    Ok(())
}

/// The CDC status: the slot, dead letters, and a note on what `pending` means there.
async fn cdc_status(
    pg: &outbox_postgres::PostgresConfig,
    now: OffsetDateTime,
    json: bool,
) -> anyhow::Result<Status> {
    let pool = outbox_postgres::connect(pg, 1)
        .await
        .with_context(|| format!("cannot connect to {}", pg.url))?;
    let ctx = || format!("reading outbox table {}", pg.qualified_table());
    let cdc = outbox_postgres::PgCdcInspector::new(pool, pg);
    let slot = cdc
        .slot()
        .await
        .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
        .with_context(ctx)?;
    cdc_status_note(pg, slot.as_ref(), json);
    Ok(Status {
        database: pg.url.redacted(),
        table: pg.qualified_table().to_string(),
        backlog: cdc
            .backlog_at(now)
            .await
            .map_err(|e| anyhow::anyhow!(crate::chain(&e)))
            .with_context(ctx)?,
        held_aggregates: Vec::new(),
        producer_lock_waits: Vec::new(),
        watchdog: None,
        replication_slot: slot,
    })
}

/// CDC `status` lines about the slot that the backlog counters cannot show.
fn cdc_status_note(
    pg: &outbox_postgres::PostgresConfig,
    slot: Option<&outbox_postgres::SlotStatus>,
    json: bool,
) {
    if json {
        return;
    }
    if slot.is_none() {
        println!(
            "  replication slot   `{}` does not exist: run `outbox migrate` (docs/cdc.md)",
            pg.slot
        );
    }
    println!(
        "  (CDC: undelivered events are WAL held by the slot, not row state; `pending` counts only a running relay's memory)"
    );
}

fn print_slot(slot: &outbox_postgres::SlotStatus) {
    let mib = |b: Option<i64>| {
        b.map_or("?".to_owned(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        })
    };
    println!(
        "  replication slot   `{}`: {} (wal_status {}), confirmed up to {}",
        slot.slot,
        match slot.active_pid {
            Some(pid) if slot.active => format!("streaming to pid {pid}"),
            _ => "no relay streaming".to_owned(),
        },
        slot.wal_status.as_deref().unwrap_or("?"),
        slot.confirmed_flush_lsn.as_deref().unwrap_or("?")
    );
    println!(
        "  slot lag           {} not yet confirmed; {} kept on disk{}",
        mib(slot.retained_wal_bytes),
        mib(slot.restart_lag_bytes),
        slot.safe_wal_size
            .map(|b| format!(
                "; {} until max_slot_wal_keep_size invalidates it",
                mib(Some(b))
            ))
            .unwrap_or_default()
    );
    if slot.is_lost() {
        println!(
            "  SLOT LOST          the server invalidated it: see docs/cdc.md#recovering-a-lost-slot"
        );
    }
}
