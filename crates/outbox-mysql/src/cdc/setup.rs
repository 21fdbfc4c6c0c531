//! What `outbox migrate` does in CDC mode, and what the source and `doctor` check: the server
//! writes a row-based binlog with full row images, and the position table holds where the
//! stream starts.

use sqlx::{MySqlPool, Row};
use time::OffsetDateTime;

use super::binlog::BinlogPos;
use super::queries::CdcQueries;
use crate::config::MySqlConfig;
use crate::sql::stmt;

/// The name of the one stream per outbox table.
pub(crate) const STREAM: &str = "relay";

/// What `setup_cdc` found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcSetupReport {
    /// True when this call recorded the starting position (the first CDC `migrate`).
    pub position_recorded: bool,
    /// Where the stream resumes (`file:offset`).
    pub resume_at: String,
}

/// The server settings binlog CDC needs, each with what is wrong; empty when all are right.
pub async fn binlog_problems(pool: &MySqlPool) -> Result<Vec<String>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT CAST(@@global.log_bin AS SIGNED), CAST(@@global.binlog_format AS CHAR), \
         CAST(@@global.binlog_row_image AS CHAR)",
    )
    .fetch_one(pool)
    .await?;
    let log_bin: i64 = row.try_get(0)?;
    let format: String = row.try_get(1)?;
    let image: String = row.try_get(2)?;
    let mut problems = Vec::new();
    if log_bin != 1 {
        problems.push("binary logging is off (start the server with --log-bin)".to_owned());
    }
    if !format.eq_ignore_ascii_case("ROW") {
        problems.push(format!(
            "binlog_format is {format}, CDC needs ROW (SET GLOBAL binlog_format = 'ROW', and in the server's config)"
        ));
    }
    if !image.eq_ignore_ascii_case("FULL") {
        problems.push(format!(
            "binlog_row_image is {image}, CDC needs FULL (SET GLOBAL binlog_row_image = 'FULL', and in the server's config)"
        ));
    }
    Ok(problems)
}

/// The server's GTID position on MariaDB (`gtid_binlog_pos`); `None` on MySQL, whose stream
/// resumes by binlog file and offset (see docs/mysql.md).
pub(crate) async fn current_gtid(pool: &MySqlPool) -> Result<Option<String>, sqlx::Error> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(pool)
        .await?;
    if !version.contains("MariaDB") {
        return Ok(None);
    }
    let gtid: Option<String> = sqlx::query_scalar("SELECT CAST(@@global.gtid_binlog_pos AS CHAR)")
        .fetch_one(pool)
        .await?;
    Ok(gtid.filter(|g| !g.is_empty()))
}

/// What the position table keeps.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub(crate) at: BinlogPos,
    /// When it last moved.
    pub(crate) moved: OffsetDateTime,
    /// The GTID position at the same point (MariaDB).
    pub(crate) gtid: Option<String>,
}

/// The server's current binlog coordinate (`SHOW MASTER STATUS`, renamed `SHOW BINARY LOG
/// STATUS` in MySQL 8.4).
pub(crate) async fn current_position(pool: &MySqlPool) -> Result<Option<BinlogPos>, sqlx::Error> {
    let rows = match sqlx::raw_sql("SHOW MASTER STATUS").fetch_all(pool).await {
        Ok(rows) => rows,
        Err(_) => {
            sqlx::raw_sql("SHOW BINARY LOG STATUS")
                .fetch_all(pool)
                .await?
        }
    };
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let file: String = row.try_get(0)?;
    let offset: u64 = row.try_get(1)?;
    Ok(Some(BinlogPos { file, offset }))
}

/// Checks the server's binlog settings, creates the position table and records where the
/// stream starts (now) unless a position is kept already.
pub async fn setup_cdc(pool: &MySqlPool, config: &MySqlConfig) -> Result<CdcSetupReport, String> {
    let db = |what: &str, e: sqlx::Error| format!("{what}: {}", outbox_core::relay::ErrorChain(&e));
    let problems = binlog_problems(pool)
        .await
        .map_err(|e| db("reading the binlog settings", e))?;
    if !problems.is_empty() {
        return Err(format!(
            "source.mode = \"cdc\" needs a row-based binlog: {}",
            problems.join("; ")
        ));
    }
    let queries = CdcQueries::new(&config.table);
    sqlx::query(stmt(&queries.position_table))
        .execute(pool)
        .await
        .map_err(|e| db("creating the CDC position table", e))?;
    let now = OffsetDateTime::now_utc();
    let start = current_position(pool)
        .await
        .map_err(|e| {
            db(
                "reading the binlog position (needs REPLICATION CLIENT / BINLOG MONITOR)",
                e,
            )
        })?
        .ok_or("the server reports no binlog position: is binary logging on?")?;
    let token = start
        .token()
        .ok_or_else(|| format!("unexpected binlog file name `{}`", start.file))?;
    let gtid = current_gtid(pool)
        .await
        .map_err(|e| db("reading the GTID position", e))?;
    let recorded = sqlx::query(stmt(&queries.position_init))
        .bind(STREAM)
        .bind(&start.file)
        .bind(start.offset)
        .bind(token as i64)
        .bind(&gtid)
        .bind(crate::poll::utc(now))
        .execute(pool)
        .await
        .map_err(|e| db("recording the CDC start position", e))?
        .rows_affected()
        == 1;
    let kept = load_position(pool, &queries)
        .await
        .map_err(|e| db("reading the CDC position", e))?
        .ok_or("the CDC position vanished")?;
    Ok(CdcSetupReport {
        position_recorded: recorded,
        resume_at: match &kept.gtid {
            Some(gtid) => format!("{}:{} (GTID {gtid})", kept.at.file, kept.at.offset),
            None => format!("{}:{}", kept.at.file, kept.at.offset),
        },
    })
}

/// The kept position; `None` before the first CDC `migrate`.
pub(crate) async fn load_position(
    pool: &MySqlPool,
    queries: &CdcQueries,
) -> Result<Option<Kept>, sqlx::Error> {
    let row = sqlx::query(stmt(&queries.position_load))
        .bind(STREAM)
        .fetch_optional(pool)
        .await?;
    row.map(|row| {
        let updated: time::PrimitiveDateTime = row.try_get(3)?;
        Ok(Kept {
            at: BinlogPos {
                file: row.try_get(0)?,
                offset: u64::try_from(row.try_get::<i64, _>(1)?).unwrap_or(0),
            },
            moved: updated.assume_utc(),
            gtid: row.try_get(4)?,
        })
    })
    .transpose()
}
