//! The publication and the replication slot: created by `outbox migrate` (see
//! [`setup_cdc`]), checked before streaming, and inspected for `status` and the slot-lag
//! metric.
//!
//! Why `migrate` and not the relay's first start: a slot sees only what commits after it
//! exists. Events written between `migrate` and a relay's first start would never be streamed
//! if the relay created the slot. So the slot exists from the moment the table can receive
//! events, and a relay that finds it missing never quietly creates a new one past a gap: it
//! recovers the gap from the table first (`recovery.rs`, docs/cdc.md#failover) or stops.

use outbox_core::{SourceError, SourceErrorKind};
use sqlx::{PgPool, Row};

use super::queries::{
    CdcQueries, PUBLICATION_STATUS, SLOT_CREATE, SLOT_CREATE_FAILOVER, SLOT_STATUS,
};
use crate::config::PostgresConfig;
use crate::error::classify;

/// What [`setup_cdc`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcSetupReport {
    /// The publication was created by this call.
    pub publication_created: bool,
    /// The outbox table was added to an existing publication.
    pub publication_table_added: bool,
    /// The slot was created by this call.
    pub slot_created: bool,
    /// The slot's confirmed flush LSN (where streaming resumes).
    pub slot_lsn: Option<String>,
    /// The slot was gone while events had been acknowledged from it (a failover, a drop):
    /// it was created again with a recovery recorded, which the next relay to stream runs
    /// (docs/cdc.md, "Failover").
    pub slot_recovery: bool,
}

/// Why setting up CDC failed.
#[derive(Debug, thiserror::Error)]
pub enum CdcSetupError {
    /// Creating or altering the publication failed (it needs ownership of the table).
    #[error("setting up publication `{publication}` for {table} failed")]
    Publication {
        /// The publication.
        publication: String,
        /// The outbox table.
        table: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// Creating or reading the slot failed (creating needs the REPLICATION attribute and
    /// `wal_level = logical`).
    #[error("setting up replication slot `{slot}` failed")]
    Slot {
        /// The slot.
        slot: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// A slot of that name exists but cannot serve this outbox.
    #[error("replication slot `{slot}` exists but {reason}; pick another source.slot or drop it")]
    Mismatch {
        /// The slot.
        slot: String,
        /// What does not fit.
        reason: String,
    },
}

impl CdcSetupError {
    /// Whether retrying may help ([`SourceErrorKind::Unavailable`]) or not.
    pub fn kind(&self) -> SourceErrorKind {
        match self {
            Self::Publication { source, .. } | Self::Slot { source, .. } => classify(source),
            Self::Mismatch { .. } => SourceErrorKind::Fatal,
        }
    }
}

/// The slot as the server reports it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SlotStatus {
    /// Slot name.
    pub slot: String,
    /// A session streams from it (the active relay).
    pub active: bool,
    /// That session's backend pid.
    pub active_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost` (invalidated: it can no longer stream).
    pub wal_status: Option<String>,
    /// Where streaming resumes.
    pub confirmed_flush_lsn: Option<String>,
    /// WAL after the confirmed position, bytes (the metric
    /// `outbox_replication_slot_retained_wal_bytes`).
    pub retained_wal_bytes: Option<i64>,
    /// WAL the server keeps on disk for the slot (from its restart LSN), bytes.
    pub restart_lag_bytes: Option<i64>,
    /// Bytes that may still be written before the slot is invalidated
    /// (`max_slot_wal_keep_size`); `None` when unlimited.
    pub safe_wal_size: Option<i64>,
}

impl SlotStatus {
    /// True when the server invalidated the slot.
    pub fn is_lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

struct SlotRow {
    status: SlotStatus,
    plugin: Option<String>,
    slot_type: String,
    database: Option<String>,
}

async fn read_slot(pool: &PgPool, slot: &str) -> Result<Option<SlotRow>, sqlx::Error> {
    let Some(r) = crate::sql::query(SLOT_STATUS)
        .bind(slot)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(SlotRow {
        plugin: r.try_get("plugin")?,
        slot_type: r.try_get("slot_type")?,
        database: r.try_get("database")?,
        status: SlotStatus {
            slot: slot.to_owned(),
            active: r.try_get("active")?,
            active_pid: r.try_get("active_pid")?,
            wal_status: r.try_get("wal_status")?,
            confirmed_flush_lsn: r.try_get("confirmed_flush_lsn")?,
            retained_wal_bytes: r.try_get("retained_wal_bytes")?,
            restart_lag_bytes: r.try_get("restart_lag_bytes")?,
            safe_wal_size: r.try_get("safe_wal_size")?,
        },
    }))
}

/// Reads the slot's status; `None` when it does not exist.
pub async fn slot_status(pool: &PgPool, slot: &str) -> Result<Option<SlotStatus>, sqlx::Error> {
    Ok(read_slot(pool, slot).await?.map(|r| r.status))
}

fn mismatch(row: &SlotRow, database: &str) -> Option<String> {
    if row.slot_type != "logical" {
        return Some(format!("is a {} slot, not a logical one", row.slot_type));
    }
    if row.plugin.as_deref() != Some("pgoutput") {
        return Some(format!(
            "uses the output plugin `{}`, not `pgoutput`",
            row.plugin.as_deref().unwrap_or("?")
        ));
    }
    if row.database.as_deref() != Some(database) {
        return Some(format!(
            "belongs to database `{}`, not `{database}`",
            row.database.as_deref().unwrap_or("?")
        ));
    }
    None
}

/// Creates the CDC publication (inserts of the outbox table) and the `pgoutput` slot when
/// they do not exist; idempotent and safe to run concurrently. Run it after the table's own
/// migration (`outbox migrate` does both when `source.mode = "cdc"`).
pub async fn setup_cdc(
    pool: &PgPool,
    config: &PostgresConfig,
) -> Result<CdcSetupReport, CdcSetupError> {
    let table = config.qualified_table();
    let queries = CdcQueries::new(&table, &config.publication);
    let publication = config.publication.as_str();
    let slot = config.slot.as_str();
    let pub_err = |source| CdcSetupError::Publication {
        publication: publication.to_owned(),
        table: table.to_string(),
        source,
    };
    let slot_err = |source| CdcSetupError::Slot {
        slot: slot.to_owned(),
        source,
    };
    let mut report = CdcSetupReport {
        publication_created: false,
        publication_table_added: false,
        slot_created: false,
        slot_lsn: None,
        slot_recovery: false,
    };
    let existing = crate::sql::query(PUBLICATION_STATUS)
        .bind(publication)
        .bind(config.schema.as_str())
        .bind(config.table.as_str())
        .fetch_optional(pool)
        .await
        .map_err(pub_err)?;
    match existing {
        None => match crate::sql::query(crate::sql::stmt(&queries.publication_create))
            .execute(pool)
            .await
        {
            Ok(_) => report.publication_created = true,
            // Created concurrently by another `migrate`: fine.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42710") => {}
            Err(e) => return Err(pub_err(e)),
        },
        Some(row) => {
            let has_table: bool = row.try_get("has_table").map_err(pub_err)?;
            if !has_table {
                crate::sql::query(crate::sql::stmt(&queries.publication_add_table))
                    .execute(pool)
                    .await
                    .map_err(pub_err)?;
                report.publication_table_added = true;
            }
        }
    }
    let database: String = crate::sql::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .map_err(slot_err)?;
    if read_slot(pool, slot).await.map_err(slot_err)?.is_none() {
        let known = super::recovery::read_state(pool, &queries, slot)
            .await
            .map_err(slot_err)?;
        if known.is_some_and(|s| s.has_snapshot) {
            // Events were acknowledged from a slot of this name that is gone: recorded as a
            // recovery first, so that the relay publishes from the table what it had not.
            report.slot_recovery = super::recovery::begin(pool, &queries, slot)
                .await
                .map_err(slot_err)?
                .is_some();
        }
        // Taken before the slot exists: everything it sees is older than the slot.
        let before: String = crate::sql::query_scalar("SELECT pg_current_snapshot()::text")
            .fetch_one(pool)
            .await
            .map_err(slot_err)?;
        match create(pool, config).await {
            Ok(_) => report.slot_created = true,
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42710") => {}
            Err(e) => return Err(slot_err(e)),
        }
        if report.slot_created && !report.slot_recovery {
            // A new slot starts from its own position, not one saved for an older namesake;
            // what committed before it counts as handled.
            crate::sql::query(crate::sql::stmt(&queries.offset_init))
                .bind(slot)
                .bind(&before)
                .execute(pool)
                .await
                .map_err(slot_err)?;
        }
    }
    let row = read_slot(pool, slot)
        .await
        .map_err(slot_err)?
        .ok_or_else(|| CdcSetupError::Mismatch {
            slot: slot.to_owned(),
            reason: "vanished right after it was created".into(),
        })?;
    if let Some(reason) = mismatch(&row, &database) {
        return Err(CdcSetupError::Mismatch {
            slot: slot.to_owned(),
            reason,
        });
    }
    report.slot_lsn = row.status.confirmed_flush_lsn;
    Ok(report)
}

/// Creates the slot (`source.failover_slot`: as a PostgreSQL 17 failover slot); returns its
/// start position. A slot created concurrently by someone else is a database error with
/// SQLSTATE 42710, left to the caller.
pub(crate) async fn create(pool: &PgPool, config: &PostgresConfig) -> Result<String, sqlx::Error> {
    if !config.failover_slot {
        return crate::sql::query_scalar(SLOT_CREATE)
            .bind(config.slot.as_str())
            .fetch_one(pool)
            .await;
    }
    let version: i32 =
        crate::sql::query_scalar("SELECT current_setting('server_version_num')::int")
            .fetch_one(pool)
            .await?;
    if version < 170_000 {
        return Err(sqlx::Error::Configuration(
            format!(
                "source.failover_slot needs PostgreSQL 17 or later (this server is {}.{}); turn it off, the relay recovers a lost slot from the table (docs/cdc.md#failover)",
                version / 10_000,
                version % 10_000 / 100
            )
            .into(),
        ));
    }
    crate::sql::query_scalar(SLOT_CREATE_FAILOVER)
        .bind(config.slot.as_str())
        .fetch_one(pool)
        .await
}

/// What the relay found before streaming.
#[derive(Debug)]
pub(crate) struct Readiness {
    /// Another session streams from the slot.
    pub(crate) busy: bool,
    /// The slot does not exist (the publication does).
    pub(crate) missing: bool,
    /// The server invalidated the slot (`wal_status = lost`) and `source.on_slot_loss` is
    /// `recover`: it must be dropped and recovered.
    pub(crate) invalidated: bool,
}

/// Checks that the slot and the publication can serve this outbox; an invalidated slot is a
/// fatal error with the recovery in its message, a missing one is reported.
pub(crate) async fn check(
    pool: &PgPool,
    config: &PostgresConfig,
) -> Result<Readiness, SourceError> {
    let slot = config.slot.as_str();
    let db = |context: &str, e: sqlx::Error| {
        SourceError::new(classify(&e), context.to_owned()).with_source(e)
    };
    let row = read_slot(pool, slot)
        .await
        .map_err(|e| db("reading the replication slot", e))?;
    let database: String = crate::sql::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .map_err(|e| db("reading the database name", e))?;
    if let Some(row) = &row
        && let Some(reason) = mismatch(row, &database)
    {
        return Err(SourceError::fatal(format!(
            "replication slot `{slot}` {reason}; pick another source.slot"
        )));
    }
    let invalidated = row.as_ref().is_some_and(|r| r.status.is_lost());
    if invalidated && config.on_slot_loss == crate::config::OnSlotLoss::Stop {
        return Err(SourceError::fatal(format!(
            "replication slot `{slot}` was invalidated by the server (wal_status = lost: it retained more WAL than max_slot_wal_keep_size); events committed since its confirmed position {} may not have been delivered; with source.on_slot_loss = \"recover\" the relay recovers them from the table (docs/cdc.md#failover)",
            row.as_ref()
                .and_then(|r| r.status.confirmed_flush_lsn.as_deref())
                .unwrap_or("?")
        )));
    }
    let publication = config.publication.as_str();
    let p = crate::sql::query(PUBLICATION_STATUS)
        .bind(publication)
        .bind(config.schema.as_str())
        .bind(config.table.as_str())
        .fetch_optional(pool)
        .await
        .map_err(|e| db("reading the publication", e))?;
    let ok = match &p {
        Some(r) => {
            r.try_get::<bool, _>("pubinsert").unwrap_or(false)
                && r.try_get::<bool, _>("has_table").unwrap_or(false)
        }
        None => false,
    };
    if !ok {
        return Err(SourceError::fatal(format!(
            "publication `{publication}` does not exist or does not publish inserts of {}; run `outbox migrate` with source.mode = \"cdc\"",
            config.qualified_table()
        )));
    }
    Ok(Readiness {
        busy: row.as_ref().is_some_and(|r| r.status.active),
        missing: row.is_none(),
        invalidated,
    })
}
