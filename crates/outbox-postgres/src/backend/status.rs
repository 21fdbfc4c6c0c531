//! `outbox status` for PostgreSQL (the polling backlog with held aggregates, producers
//! waiting on an aggregate's ordering lock and the transaction holding the vacuum horizon;
//! in CDC mode the replication slot), and the relay's watchdog over the same signals.

use std::time::Duration;

use outbox_core::SourceError;
use outbox_core::admin::{StatusReport, when};
use outbox_core::backend::{Backend, Watchdog};
use outbox_core::metrics as m;
use outbox_core::sink::BoxFuture;
use time::OffsetDateTime;

use super::PgBackend;
use crate::cdc::{PgCdcInspector, SlotStatus};
use crate::inspect::{OpenTransaction, PgInspector};

impl PgBackend {
    pub(super) async fn poll_status(
        &self,
        now: OffsetDateTime,
        stuck_after: Duration,
    ) -> Result<StatusReport, SourceError> {
        let i = &self.inspector;
        let mut status = StatusReport::new(self.database(), self.table(), i.backlog_at(now).await?);
        status.held_aggregates = i.held_aggregates(now, 20).await?;
        let waits = i.lock_waits(20).await?;
        let watchdog = i.watchdog(now, stuck_after).await?;
        status.detail_lines.push(format!(
            "stuck              {} event(s) pending longer than {} (metrics.stuck_after)",
            watchdog.stuck_events,
            humantime::format_duration(stuck_after)
        ));
        status
            .detail_lines
            .push(match &watchdog.oldest_transaction {
                Some(t) => format!("horizon held by    {}", t.describe()),
                None => "horizon held by    no open transaction".to_owned(),
            });
        for w in &waits {
            status.blocking_lines.push(format!(
                "producer waits     pid {} waits for the aggregate lock held by pid {} (transaction age {:.1}s, {}): {}",
                w.waiting_pid,
                w.holder_pid,
                w.holder_xact_age_seconds.unwrap_or(0.0),
                w.holder_state.as_deref().unwrap_or("?"),
                w.holder_query.as_deref().unwrap_or("")
            ));
        }
        status
            .sections
            .insert("producer_lock_waits".into(), to_json(&waits));
        status
            .sections
            .insert("watchdog".into(), to_json(&watchdog));
        Ok(status)
    }

    pub(super) async fn cdc_status(
        &self,
        now: OffsetDateTime,
    ) -> Result<StatusReport, SourceError> {
        let cdc = PgCdcInspector::new(self.pool.clone(), &self.config);
        let slot = cdc.slot().await?;
        let mut status =
            StatusReport::new(self.database(), self.table(), cdc.backlog_at(now).await?);
        match &slot {
            Some(slot) => status.head_lines.extend(slot_lines(slot)),
            None => status.head_lines.push(format!(
                "replication slot   `{}` does not exist: a relay with source.on_slot_loss = \"recover\" creates it again and recovers from the table; on a first set-up run `outbox migrate` (docs/cdc.md#failover)",
                self.config.slot
            )),
        }
        let recovery = crate::cdc::recovery_status(&self.pool, &self.config)
            .await
            .map_err(|e| {
                crate::error::source_error("reading the slot recovery", &self.table(), e)
            })?;
        if let Some(r) = &recovery {
            status
                .head_lines
                .push(format!("slot recovery      {}", r.describe()));
            status.sections.insert("slot_recovery".into(), r.to_json());
        }
        status.head_lines.push(
            "(CDC: undelivered events are WAL held by the slot, not row state; `pending` counts only a running relay's memory)".to_owned(),
        );
        status.sections.insert(
            "producer_lock_waits".into(),
            serde_json::Value::Array(Vec::new()),
        );
        if let Some(slot) = &slot {
            status
                .sections
                .insert("replication_slot".into(), to_json(slot));
        }
        Ok(status)
    }
}

impl Watchdog for PgInspector {
    fn check(&self, stuck_after: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let now = OffsetDateTime::now_utc();
            let w = match self.watchdog(now, stuck_after).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %outbox_core::relay::ErrorChain(&e), "watchdog: could not read stuck events and open transactions");
                    return;
                }
            };
            metrics::gauge!(m::STUCK_EVENTS).set(w.stuck_events as f64);
            if w.stuck_events > 0 {
                tracing::warn!(
                    stuck_events = w.stuck_events,
                    stuck_after = ?stuck_after,
                    "events pending longer than metrics.stuck_after; `outbox status` shows what holds them, `outbox why ID` explains one"
                );
            }
            let (age, pid) = w
                .oldest_transaction
                .as_ref()
                .map_or((0.0, 0.0), |t| (t.xact_age_seconds, f64::from(t.pid)));
            metrics::gauge!(m::OLDEST_TRANSACTION_AGE_SECONDS).set(age);
            metrics::gauge!(m::OLDEST_TRANSACTION_PID).set(pid);
            if let Some(t) = w.oldest_transaction
                && t.xact_age_seconds > stuck_after.as_secs_f64()
            {
                tracing::warn!(
                    pid = t.pid,
                    transaction_age_seconds = t.xact_age_seconds,
                    state = t.state.as_deref().unwrap_or("?"),
                    query_start = ?t.query_start,
                    query = t.query.as_deref().unwrap_or(""),
                    "a long transaction holds the xmin horizon (vacuum cannot clean the outbox table); end it with pg_terminate_backend(pid) if it is stuck"
                );
            }
        })
    }
}

impl OpenTransaction {
    /// One open transaction for a human: pid, state, age, query start, query.
    pub fn describe(&self) -> String {
        format!(
            "pid {} ({}, user {}, application `{}`): transaction open {:.1}s, last query started {}: {}",
            self.pid,
            self.state.as_deref().unwrap_or("?"),
            self.user.as_deref().unwrap_or("?"),
            self.application_name.as_deref().unwrap_or(""),
            self.xact_age_seconds,
            self.query_start.map(when).unwrap_or_else(|| "?".to_owned()),
            self.query.as_deref().unwrap_or("").trim()
        )
    }
}

/// The replication slot in `outbox status`.
fn slot_lines(slot: &SlotStatus) -> Vec<String> {
    let mib = |b: Option<i64>| {
        b.map_or("?".to_owned(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        })
    };
    let mut lines = vec![
        format!(
            "replication slot   `{}`: {} (wal_status {}), confirmed up to {}",
            slot.slot,
            match slot.active_pid {
                Some(pid) if slot.active => format!("streaming to pid {pid}"),
                _ => "no relay streaming".to_owned(),
            },
            slot.wal_status.as_deref().unwrap_or("?"),
            slot.confirmed_flush_lsn.as_deref().unwrap_or("?")
        ),
        format!(
            "slot lag           {} not yet confirmed; {} kept on disk{}",
            mib(slot.retained_wal_bytes),
            mib(slot.restart_lag_bytes),
            slot.safe_wal_size
                .map(|b| format!(
                    "; {} until max_slot_wal_keep_size invalidates it",
                    mib(Some(b))
                ))
                .unwrap_or_default()
        ),
    ];
    if slot.is_lost() {
        lines.push(
            "SLOT LOST          the server invalidated it: see docs/cdc.md#failover".to_owned(),
        );
    }
    lines
}

fn to_json(value: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}
