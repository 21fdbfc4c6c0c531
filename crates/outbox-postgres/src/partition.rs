//! Partitioned mode (`[source] partitioning = "hourly" | "daily" | "weekly"`): the outbox as a
//! table `PARTITION BY RANGE (created_at)`, one partition per period (UTC), created ahead by
//! `migrate` and by every retention run, plus a DEFAULT partition as a safety net. Retention
//! drops whole partitions (no dead tuples, no index bloat) once every row in them is delivered
//! and outside the window; a partition holding a pending or dead row is kept, and the run says
//! why.
//!
//! Partition names are `<table>_h<YYYYMMDDHH>`, `<table>_d<YYYYMMDD>` and `<table>_w<YYYYMMDD>`
//! (the Monday of the week); the bounds follow from the name alone, so a partition can be
//! judged without parsing catalog expressions. Partition DDL is built by the server's
//! `format()` (`%I`, `%L`) from a validated name and typed timestamps; the outbox table's name
//! comes from `sql::render` as everywhere else.

use std::time::Duration;

use outbox_core::QualifiedTable;
use serde::Deserialize;
use sqlx::PgConnection;
use time::{Date, Month, OffsetDateTime, Time, Weekday};

use crate::sql::render;

/// The layout of the outbox table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Partitioning {
    /// A plain table; retention deletes delivered rows in batches (default).
    #[default]
    None,
    /// One partition per hour (UTC).
    Hourly,
    /// One partition per day (UTC).
    Daily,
    /// One partition per ISO week (Monday 00:00 UTC).
    Weekly,
}

/// How many periods after the current one `migrate` and retention keep created.
pub const PARTITIONS_AHEAD: u32 = 3;

/// How long partition DDL waits for its lock before giving up until the next run.
pub(crate) const LOCK_TIMEOUT: &str = "2s";

impl Partitioning {
    /// `"none"`, `"hourly"`, `"daily"` or `"weekly"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Hourly => "hourly",
            Self::Daily => "daily",
            Self::Weekly => "weekly",
        }
    }

    fn letter(self) -> Option<char> {
        match self {
            Self::None => None,
            Self::Hourly => Some('h'),
            Self::Daily => Some('d'),
            Self::Weekly => Some('w'),
        }
    }

    fn length(self) -> Duration {
        match self {
            Self::None => Duration::ZERO,
            Self::Hourly => Duration::from_secs(3600),
            Self::Daily => Duration::from_secs(86_400),
            Self::Weekly => Duration::from_secs(7 * 86_400),
        }
    }

    /// The start of the period containing `t` (UTC).
    pub(crate) fn period_start(self, t: OffsetDateTime) -> OffsetDateTime {
        let t = t.to_offset(time::UtcOffset::UTC);
        let midnight = t.replace_time(Time::MIDNIGHT);
        match self {
            Self::None => t,
            Self::Hourly => midnight + time::Duration::hours(i64::from(t.hour())),
            Self::Daily => midnight,
            Self::Weekly => {
                midnight - time::Duration::days(i64::from(t.weekday().number_days_from_monday()))
            }
        }
    }

    /// The partition for the period starting at `start`.
    pub(crate) fn partition(self, table: &str, start: OffsetDateTime) -> Option<Partition> {
        let letter = self.letter()?;
        let stamp = match self {
            Self::Hourly => format!(
                "{:04}{:02}{:02}{:02}",
                start.year(),
                u8::from(start.month()),
                start.day(),
                start.hour()
            ),
            _ => format!(
                "{:04}{:02}{:02}",
                start.year(),
                u8::from(start.month()),
                start.day()
            ),
        };
        Some(Partition {
            name: format!("{table}_{letter}{stamp}"),
            from: start,
            to: start + self.length(),
        })
    }

    /// The partitions of the current period and the [`PARTITIONS_AHEAD`] next ones.
    pub(crate) fn ahead(self, table: &str, now: OffsetDateTime) -> Vec<Partition> {
        let mut start = self.period_start(now);
        let mut out = Vec::new();
        for _ in 0..=PARTITIONS_AHEAD {
            if let Some(p) = self.partition(table, start) {
                start = p.to;
                out.push(p);
            }
        }
        out
    }
}

/// One range partition: its name and its bounds `[from, to)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Partition {
    pub(crate) name: String,
    pub(crate) from: OffsetDateTime,
    pub(crate) to: OffsetDateTime,
}

impl Partition {
    /// Recognizes a partition created by this module for `table` from its name (any
    /// granularity, so a changed `partitioning` still rotates the old partitions).
    pub(crate) fn parse(table: &str, name: &str) -> Option<Self> {
        let rest = name.strip_prefix(table)?.strip_prefix('_')?;
        let mut chars = rest.chars();
        let kind = match chars.next()? {
            'h' => Partitioning::Hourly,
            'd' => Partitioning::Daily,
            'w' => Partitioning::Weekly,
            _ => return None,
        };
        let digits = chars.as_str();
        let want = if kind == Partitioning::Hourly { 10 } else { 8 };
        if digits.len() != want || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let num = |r: std::ops::Range<usize>| digits[r].parse::<u32>().ok();
        let year = i32::try_from(num(0..4)?).ok()?;
        let month = Month::try_from(u8::try_from(num(4..6)?).ok()?).ok()?;
        let day = u8::try_from(num(6..8)?).ok()?;
        let hour = if kind == Partitioning::Hourly {
            u8::try_from(num(8..10)?).ok()?
        } else {
            0
        };
        let date = Date::from_calendar_date(year, month, day).ok()?;
        if kind == Partitioning::Weekly && date.weekday() != Weekday::Monday {
            return None;
        }
        let start = date.with_hms(hour, 0, 0).ok()?.assume_utc();
        kind.partition(table, start)
    }
}

/// The outbox table's layout as found in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    Missing,
    Plain,
    Partitioned,
}

/// Reads the layout of `table`.
pub(crate) async fn layout(
    conn: &mut PgConnection,
    table: &QualifiedTable,
) -> Result<Layout, sqlx::Error> {
    let kind: Option<String> =
        crate::sql::query_scalar(include_str!("../queries/partition_layout.sql"))
            .bind(render("{{table}}", table))
            .fetch_optional(&mut *conn)
            .await?
            .flatten();
    Ok(match kind.as_deref() {
        None => Layout::Missing,
        Some("p") => Layout::Partitioned,
        Some(_) => Layout::Plain,
    })
}

/// The partitions of `table`: (name, is the DEFAULT partition).
pub(crate) async fn list(
    conn: &mut PgConnection,
    table: &QualifiedTable,
) -> Result<Vec<(String, bool)>, sqlx::Error> {
    crate::sql::query_as(include_str!("../queries/partition_list.sql"))
        .bind(render("{{table}}", table))
        .fetch_all(&mut *conn)
        .await
}

fn schema_of(table: &QualifiedTable) -> &str {
    table.schema.as_ref().map_or("public", |s| s.as_str())
}

/// Creates the DEFAULT partition and the partitions of the current and next periods that do
/// not exist yet; returns the names created. Runs in the caller's transaction.
pub(crate) async fn create_ahead(
    conn: &mut PgConnection,
    table: &QualifiedTable,
    partitioning: Partitioning,
    now: OffsetDateTime,
) -> Result<Vec<String>, sqlx::Error> {
    let existing: Vec<String> = list(conn, table)
        .await?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut created = Vec::new();
    let default_name = format!("{}_default", table.table.as_str());
    if !existing.contains(&default_name) {
        crate::sql::query(sqlx::AssertSqlSafe(render(
            include_str!("../queries/partition_create_default.sql"),
            table,
        )))
        .execute(&mut *conn)
        .await?;
        created.push(default_name);
    }
    for p in partitioning.ahead(table.table.as_str(), now) {
        if existing.contains(&p.name) {
            continue;
        }
        let ddl: String = crate::sql::query_scalar(sqlx::AssertSqlSafe(render(
            include_str!("../queries/partition_create_ddl.sql"),
            table,
        )))
        .bind(schema_of(table))
        .bind(&p.name)
        .bind(p.from)
        .bind(p.to)
        .fetch_one(&mut *conn)
        .await?;
        // Built by the server's format() with %I / %L quoting (see the .sql file).
        crate::sql::query(sqlx::AssertSqlSafe(ddl))
            .execute(&mut *conn)
            .await?;
        created.push(p.name);
    }
    Ok(created)
}

/// What a detached partition held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Contents {
    pub(crate) undelivered: i64,
    pub(crate) in_window: i64,
    pub(crate) rows: i64,
}

/// Detaches `name` in the caller's transaction.
pub(crate) async fn detach(
    conn: &mut PgConnection,
    table: &QualifiedTable,
    name: &str,
) -> Result<(), sqlx::Error> {
    let detach: String = crate::sql::query_scalar(sqlx::AssertSqlSafe(render(
        include_str!("../queries/partition_detach_ddl.sql"),
        table,
    )))
    .bind(schema_of(table))
    .bind(name)
    .fetch_one(&mut *conn)
    .await?;
    crate::sql::query(sqlx::AssertSqlSafe(detach))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Counts what partition `name` holds (attached or detached).
pub(crate) async fn contents(
    conn: &mut PgConnection,
    table: &QualifiedTable,
    name: &str,
    cutoff: OffsetDateTime,
) -> Result<Contents, sqlx::Error> {
    let count: String = crate::sql::query_scalar(sqlx::AssertSqlSafe(render(
        include_str!("../queries/partition_contents_ddl.sql"),
        table,
    )))
    .bind(schema_of(table))
    .bind(name)
    .fetch_one(&mut *conn)
    .await?;
    // Built by the server's format() with %I quoting (see the .sql file).
    let (undelivered, in_window, rows): (i64, i64, i64) =
        crate::sql::query_as(sqlx::AssertSqlSafe(count))
            .bind(cutoff)
            .fetch_one(&mut *conn)
            .await?;
    Ok(Contents {
        undelivered,
        in_window,
        rows,
    })
}

/// Drops the (detached) partition `name` in the caller's transaction.
pub(crate) async fn drop_detached(
    conn: &mut PgConnection,
    table: &QualifiedTable,
    name: &str,
) -> Result<(), sqlx::Error> {
    let ddl: String = crate::sql::query_scalar(sqlx::AssertSqlSafe(render(
        include_str!("../queries/partition_drop_ddl.sql"),
        table,
    )))
    .bind(schema_of(table))
    .bind(name)
    .fetch_one(&mut *conn)
    .await?;
    crate::sql::query(sqlx::AssertSqlSafe(ddl))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Prepares the caller's transaction for partition DDL: a short `lock_timeout`, and the
/// table's rotation lock. `false` when another rotation of this table holds that lock.
pub(crate) async fn begin_ddl(
    conn: &mut PgConnection,
    table: &QualifiedTable,
) -> Result<bool, sqlx::Error> {
    crate::sql::query(include_str!("../queries/partition_lock_timeout.sql"))
        .bind(LOCK_TIMEOUT)
        .execute(&mut *conn)
        .await?;
    crate::sql::query_scalar(include_str!("../queries/partition_rotation_lock.sql"))
        .bind(format!("outbox retention {table}"))
        .fetch_one(&mut *conn)
        .await
}

/// The partitioned variant of migration 1: the same SQL with
///
/// - the primary key widened to `(id, created_at)` (PostgreSQL requires every unique
///   constraint of a partitioned table to include the partition key);
/// - the table declared `PARTITION BY RANGE (created_at)`;
/// - the ordering trigger's advisory-lock key naming the partitioned table itself instead of
///   `TG_TABLE_NAME`: the row trigger runs on each partition, where `TG_TABLE_NAME` is the
///   partition's name, so two transactions writing one aggregate into two partitions (around a
///   period boundary) would take different locks and could commit out of `seq` order.
///
/// # Panics
/// If migration 1 no longer has the anchors (a bug caught by this module's tests).
pub(crate) fn partitioned_variant(sql: &str) -> String {
    const PK: &str = "PRIMARY KEY (id),";
    const END: &str = "\n);\n\nCOMMENT ON TABLE";
    assert!(
        [PK, END].iter().all(|a| sql.matches(a).count() == 1),
        "migration 1 lost its partitioning anchors"
    );
    partitioned_lock_key(&sql.replace(PK, "PRIMARY KEY (id, created_at),").replace(
        END,
        "\n) PARTITION BY RANGE (created_at);\n\nCOMMENT ON TABLE",
    ))
}

/// The ordering trigger's lock key for a partitioned table: the parent table's name, not
/// the partition's (`TG_TABLE_NAME` is the partition a row lands in), so that one
/// aggregate's writers into two partitions still wait for each other. For every migration
/// that (re)defines the trigger function.
pub(crate) fn partitioned_lock_key(sql: &str) -> String {
    const LOCK_KEY: &str = "TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || chr(31)";
    assert!(
        sql.matches(LOCK_KEY).count() == 1,
        "a migration that defines the trigger function lost its lock key anchor"
    );
    // '"schema"."table"' once rendered: a string literal (identifiers hold no quote).
    sql.replace(LOCK_KEY, "'{{table}}' || chr(31)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(y: i32, m: u8, d: u8, h: u8, min: u8) -> OffsetDateTime {
        Date::from_calendar_date(y, Month::try_from(m).expect("month"), d)
            .expect("date")
            .with_hms(h, min, 0)
            .expect("time")
            .assume_utc()
    }

    #[test]
    fn periods_start_on_utc_boundaries() {
        let t = utc(2026, 11, 22, 7, 41); // a Sunday
        assert_eq!(
            Partitioning::Hourly.period_start(t),
            utc(2026, 11, 22, 7, 0)
        );
        assert_eq!(Partitioning::Daily.period_start(t), utc(2026, 11, 22, 0, 0));
        assert_eq!(
            Partitioning::Weekly.period_start(t),
            utc(2026, 11, 16, 0, 0)
        );
        let ahead = Partitioning::Daily.ahead("outbox", t);
        let names: Vec<_> = ahead.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "outbox_d20261122",
                "outbox_d20261123",
                "outbox_d20261124",
                "outbox_d20261125"
            ]
        );
    }

    #[test]
    fn partition_names_round_trip_and_foreign_names_are_ignored() {
        for kind in [
            Partitioning::Hourly,
            Partitioning::Daily,
            Partitioning::Weekly,
        ] {
            let p = kind
                .partition("outbox", kind.period_start(utc(2026, 2, 28, 23, 59)))
                .expect("partitioned");
            assert_eq!(Partition::parse("outbox", &p.name), Some(p.clone()));
            assert_eq!(p.to - p.from, kind.length());
        }
        for name in [
            "outbox_default",
            "outbox_d2026112",
            "outbox_x20261122",
            "other_d20261122",
            "outbox_w20261122", // a Sunday: not a week start
            "outbox_d20261341",
        ] {
            assert_eq!(Partition::parse("outbox", name), None, "{name}");
        }
    }

    #[test]
    fn every_migration_that_defines_the_trigger_locks_the_parent_table_when_partitioned() {
        for m in crate::migrate::MIGRATIONS {
            if m.sql.contains("_before_insert}}() RETURNS trigger") {
                let v = partitioned_lock_key(m.sql);
                assert!(
                    v.contains("'{{table}}' || chr(31)"),
                    "migration {}",
                    m.version
                );
                assert!(
                    !v.contains("TG_TABLE_NAME || chr(31)"),
                    "migration {}",
                    m.version
                );
            }
        }
    }

    #[test]
    fn the_partitioned_variant_of_migration_1_changes_only_the_key_and_the_layout() {
        let sql = crate::migrate::MIGRATIONS[0].sql;
        let v = partitioned_variant(sql);
        assert!(v.contains("PRIMARY KEY (id, created_at)"));
        assert!(v.contains(") PARTITION BY RANGE (created_at);"));
        assert!(
            v.contains("hashtextextended(\n        '{{table}}' || chr(31) || NEW.aggregate_type")
        );
        assert!(!v.contains("TG_TABLE_NAME || chr(31)"));
    }
}
