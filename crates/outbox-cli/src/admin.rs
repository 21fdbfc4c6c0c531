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
            let report = outbox_postgres::migrate(&pool, &pg.qualified_table(), pg.listen_notify)
                .await
                .map_err(|e| anyhow::anyhow!(crate::chain(&e)))?;
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
}

/// Prints the backlog and what holds delivery back.
pub(crate) async fn status(config: &Config, json: bool) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    let status = match &config.source {
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
            }
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    let b = &status.backlog;
    println!("outbox {} in {}", status.table, status.database);
    println!("  pending            {}", b.pending);
    println!("  retrying           {}", b.retrying);
    println!("  dead-lettered      {}", b.dead);
    println!(
        "  oldest pending     {:.1}s (not counting events waiting on backoff)",
        b.oldest_pending_age_seconds
    );
    match b.delivered_last_minute {
        Some(n) => println!("  published (1 min)  {n}"),
        None => println!("  published (1 min)  n/a (delivered rows are deleted)"),
    }
    if status.held_aggregates.is_empty() && status.producer_lock_waits.is_empty() {
        println!("  blocked            nothing holds delivery back");
    }
    for h in &status.held_aggregates {
        let why = if h.state == "dead" {
            "dead-lettered (retry with `outbox dead retry`)".to_owned()
        } else {
            match h.next_attempt_at {
                Some(t) => format!("retrying (attempt {} failed; next at {t})", h.attempts),
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
