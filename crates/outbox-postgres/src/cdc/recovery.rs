//! Recovering a lost replication slot from the table (docs/cdc.md, "Failover").
//!
//! A logical slot lives on one server. After a failover to a standby before PostgreSQL 17,
//! or after someone dropped it, the slot is gone and with it the stream's position. In CDC mode
//! the rows are still in the table, so the relay recovers exactly:
//!
//! 1. Saves keep an *acknowledged snapshot* (migration 0007, `outbox_cdc_offset_save.sql`):
//!    every transaction visible in it was settled. A physical standby has the same
//!    transaction ids, so the snapshot still means the same rows after a promotion.
//! 2. A relay that finds the slot missing records the recovery (`recovery_from` = that
//!    snapshot), then creates the slot. Another relay racing it finds the slot created and
//!    stands by, as usual.
//! 3. Whoever streams from the new slot takes `recovery_after`, a snapshot taken once the slot
//!    exists, and publishes first, in seq order, every pending row visible in
//!    `recovery_after` and not in `recovery_from`. It then streams, dropping the rows of
//!    transactions visible in `recovery_after` (published already). Nothing falls between:
//!    a transaction either committed before `recovery_after` was taken (the table has it) or
//!    after the slot existed (the slot streams it); the ones in both are published once.
//! 4. Once those events are settled and the stream has passed `recovery_after_lsn`, the
//!    recovery is marked done. A relay killed before that starts the same recovery again
//!    (duplicates, never loss).
//!
//! Table-less events (`pg_logical_emit_message`) of the lost window exist in no table: the
//! relay says so with the LSN range, and counts the window in a metric.

use outbox_core::Event;
use outbox_core::enqueue::decode_headers;
use outbox_core::{Position, SourceError};
use sqlx::types::Json;
use sqlx::{PgPool, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use super::ledger::Origin;
use super::queries::CdcQueries;
use crate::sql::stmt;

/// What `<table>_cdc_offsets` says about one slot.
#[derive(Debug, Clone, Default)]
pub(crate) struct OffsetState {
    /// The acknowledged position saved for the slot (0: none).
    pub(crate) confirmed_lsn: u64,
    /// Whether an acknowledged snapshot is recorded (needed to recover a lost slot).
    pub(crate) has_snapshot: bool,
    /// The last recovery, finished or not.
    pub(crate) recovery: Option<RecoveryStatus>,
}

/// The last recovery of a lost slot, as `outbox status` and `doctor` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryStatus {
    /// When the relay found the slot gone and began.
    pub started_at: Option<OffsetDateTime>,
    /// When every event it published was settled; `None` while it runs.
    pub done_at: Option<OffsetDateTime>,
    /// Events published from the table (known once done).
    pub recovered_events: Option<i64>,
    /// The lost slot's last acknowledged position: table-less events after it and before
    /// the new slot's start may have been lost.
    pub lost_from_lsn: Option<u64>,
    /// The WAL position after `recovery_after` was taken.
    pub after_lsn: Option<u64>,
    pub(crate) from_snapshot: String,
    pub(crate) after_snapshot: Option<String>,
}

impl RecoveryStatus {
    /// Whether the recovery still has to run (or finish).
    pub fn in_progress(&self) -> bool {
        self.done_at.is_none()
    }

    /// One line for `outbox status` and `doctor`.
    pub fn describe(&self) -> String {
        let lsn = |l: Option<u64>| {
            l.map(|l| pgwire_replication::Lsn::from_u64(l).to_string())
                .unwrap_or_else(|| "?".into())
        };
        let time = |t: Option<OffsetDateTime>| {
            t.and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| "?".into())
        };
        let lost = format!(
            "table-less events (pg_logical_emit_message) committed after {} on the lost slot may have been lost",
            lsn(self.lost_from_lsn)
        );
        match self.done_at {
            None => format!(
                "slot recovery in progress since {}: publishing from the table what the lost slot had not acknowledged; {lost}",
                time(self.started_at)
            ),
            Some(done) => format!(
                "slot recovered at {}: {} events published again from the table (lost at {}); {lost}",
                time(Some(done)),
                self.recovered_events.unwrap_or(0),
                time(self.started_at)
            ),
        }
    }

    /// The same as JSON, for `status --json`.
    pub fn to_json(&self) -> serde_json::Value {
        let time = |t: Option<OffsetDateTime>| {
            t.and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
        };
        serde_json::json!({
            "in_progress": self.in_progress(),
            "started_at": time(self.started_at),
            "done_at": time(self.done_at),
            "recovered_events": self.recovered_events,
            "table_less_events_may_be_lost_after_lsn": self
                .lost_from_lsn
                .map(|l| pgwire_replication::Lsn::from_u64(l).to_string()),
        })
    }
}

/// The last recovery of the slot of `config`, if any (`None` as well for a schema without
/// the CDC offsets table).
pub async fn recovery_status(
    pool: &PgPool,
    config: &crate::config::PostgresConfig,
) -> Result<Option<RecoveryStatus>, sqlx::Error> {
    let queries = CdcQueries::new(&config.qualified_table(), &config.publication);
    match read_state(pool, &queries, config.slot.as_str()).await {
        Ok(state) => Ok(state.and_then(|s| s.recovery)),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads the saved state of `slot`; `None` when nothing was ever saved.
pub(crate) async fn read_state(
    pool: &PgPool,
    queries: &CdcQueries,
    slot: &str,
) -> Result<Option<OffsetState>, sqlx::Error> {
    let Some(row) = crate::sql::query(stmt(&queries.offset_read))
        .bind(slot)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let lsn = |v: Option<i64>| v.map(|v| v.max(0) as u64);
    let from: Option<String> = row.try_get("recovery_from")?;
    let recovery = match from {
        None => None,
        Some(from_snapshot) => Some(RecoveryStatus {
            started_at: row.try_get("recovery_started_at")?,
            done_at: row.try_get("recovery_done_at")?,
            recovered_events: row.try_get("recovered_events")?,
            lost_from_lsn: lsn(row.try_get("recovery_from_lsn")?),
            after_lsn: lsn(row.try_get("recovery_after_lsn")?),
            from_snapshot,
            after_snapshot: row.try_get("recovery_after")?,
        }),
    };
    Ok(Some(OffsetState {
        confirmed_lsn: lsn(row.try_get("confirmed_lsn")?).unwrap_or(0),
        has_snapshot: row.try_get("has_snapshot")?,
        recovery,
    }))
}

/// Records that `slot` is lost and must be recovered, while it is still missing. Returns
/// the lost slot's saved position, or `None` when nothing was recorded (the slot exists
/// again, or no acknowledged snapshot is known).
pub(crate) async fn begin(
    pool: &PgPool,
    queries: &CdcQueries,
    slot: &str,
) -> Result<Option<u64>, sqlx::Error> {
    let lsn: Option<Option<i64>> = crate::sql::query_scalar(stmt(&queries.recovery_begin))
        .bind(slot)
        .fetch_optional(pool)
        .await?;
    Ok(lsn.map(|l| l.unwrap_or(0).max(0) as u64))
}

/// Sets the recovery's upper snapshot if nobody has yet.
pub(crate) async fn take_after(
    pool: &PgPool,
    queries: &CdcQueries,
    slot: &str,
) -> Result<(), sqlx::Error> {
    crate::sql::query(stmt(&queries.recovery_after))
        .bind(slot)
        .execute(pool)
        .await
        .map(drop)
}

/// Marks the recovery of `slot` finished after `published` events.
pub(crate) async fn finish(
    pool: &PgPool,
    queries: &CdcQueries,
    slot: &str,
    published: u64,
) -> Result<(), sqlx::Error> {
    crate::sql::query(stmt(&queries.recovery_done))
        .bind(slot)
        .bind(i64::try_from(published).unwrap_or(i64::MAX))
        .execute(pool)
        .await
        .map(drop)
}

/// The events to publish from the table: pending rows visible in `after` and not in `from`,
/// in seq order, each with its origin and transaction id.
pub(crate) async fn events(
    pool: &PgPool,
    queries: &CdcQueries,
    from: &str,
    after: &str,
) -> Result<Vec<(Event, Origin, u32)>, sqlx::Error> {
    let rows = crate::sql::query(stmt(&queries.recovery_rows))
        .bind(from)
        .bind(after)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|row| {
            let headers: Json<serde_json::Map<String, serde_json::Value>> = row.try_get(6)?;
            let payload: Vec<u8> = row.try_get(5)?;
            let attempts: i32 = row.try_get(8)?;
            let had_error: bool = row.try_get(9)?;
            let xid: i64 = row.try_get(10)?;
            let event = Event {
                position: Position(0),
                id: row.try_get::<Uuid, _>(1)?,
                aggregate_type: row.try_get(2)?,
                aggregate_id: row.try_get(3)?,
                event_type: row.try_get(4)?,
                payload: payload.into(),
                headers: decode_headers(headers.0),
                created_at: row.try_get(7)?,
                attempts: 0,
            };
            let origin = Origin::Row {
                seq: row.try_get(0)?,
                // The same rule as the stream's decoder: a dead letter put back in line.
                put_back: attempts == 0 && had_error,
            };
            Ok((event, origin, xid as u32))
        })
        .collect()
}

/// A `pg_snapshot` (text form `xmin:xmax:xip,...`, 64-bit ids) asked about 32-bit xids, as
/// the stream gives them. Right for xids within 2^31 of the snapshot's xmax: the stream's
/// transactions are recent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    xmax: u32,
    in_progress: Vec<u32>,
}

impl Snapshot {
    /// Parses the text form; the error says what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Self, SourceError> {
        let bad = || {
            SourceError::fatal(format!(
                "unreadable snapshot `{text}` in the CDC offsets table"
            ))
        };
        let mut parts = text.split(':');
        let (Some(_xmin), Some(xmax), Some(xip), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let id = |s: &str| s.parse::<u64>().map(|v| v as u32).map_err(|_| bad());
        let in_progress = xip
            .split(',')
            .filter(|s| !s.is_empty())
            .map(id)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            xmax: id(xmax)?,
            in_progress,
        })
    }

    /// Whether transaction `xid` had committed when the snapshot was taken.
    pub(crate) fn sees(&self, xid: u32) -> bool {
        // `xid` precedes xmax in 32-bit modular order, and was not running.
        (self.xmax.wrapping_sub(xid) as i32) > 0 && !self.in_progress.contains(&xid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_sees_what_committed_before_it_only() {
        let s = Snapshot::parse("100:110:103,107").expect("valid");
        assert!(s.sees(99));
        assert!(s.sees(100));
        assert!(s.sees(104));
        assert!(!s.sees(103), "running at the snapshot");
        assert!(!s.sees(107), "running at the snapshot");
        assert!(!s.sees(110), "xmax: not yet assigned");
        assert!(!s.sees(4_000_000), "after xmax");
    }

    #[test]
    fn xids_are_compared_across_the_32_bit_wrap() {
        // Epoch 1: 64-bit 4294967396 is 32-bit 100.
        let s = Snapshot::parse("4294967290:4294967396:").expect("valid");
        assert!(s.sees(4_294_967_290), "before the wrap, 32-bit");
        assert!(s.sees(50));
        assert!(!s.sees(100));
        assert!(!s.sees(150));
    }

    #[test]
    fn a_malformed_snapshot_is_a_clear_error() {
        for text in ["", "1:2", "1:x:", "1:2:3:4"] {
            let e = Snapshot::parse(text).expect_err(text);
            assert!(e.to_string().contains("unreadable snapshot"), "{e}");
        }
    }
}
