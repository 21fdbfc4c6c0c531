//! `outbox doctor` for PostgreSQL: checks of the schema, indexes, CDC settings, open
//! transactions, bloat and backlog, each with a verdict (ok / warn / red) and the fix.
//!
//! Every check runs on its own: a failed query turns that check red with the error, and the
//! others still run, so one broken thing never hides the rest.

use std::time::Duration;

use outbox_core::admin::{DoctorCheck, DoctorThresholds};
use sqlx::{PgPool, Row};
use time::OffsetDateTime;

use crate::config::{Mode, PostgresConfig};
use crate::inspect::{OpenTransaction, PgInspector, open_transactions};
use crate::sql::render;

/// The indexes migration 0001 creates: suffix, and the statement that recreates one (the
/// fix shown to the user; never executed by this crate).
const EXPECTED_INDEXES: &[(&str, &str)] = &[
    (
        "_pkey",
        "ALTER TABLE {{table}} ADD CONSTRAINT {{name:_pkey}} PRIMARY KEY (id)",
    ),
    (
        "_pending_seq_idx",
        "CREATE INDEX CONCURRENTLY {{name:_pending_seq_idx}} ON {{table}} (seq) WHERE state = 'pending'",
    ),
    (
        "_pending_aggregate_idx",
        "CREATE INDEX CONCURRENTLY {{name:_pending_aggregate_idx}} ON {{table}} (aggregate_type, aggregate_id, seq) WHERE state = 'pending'",
    ),
    (
        "_held_idx",
        "CREATE INDEX CONCURRENTLY {{name:_held_idx}} ON {{table}} (aggregate_type, aggregate_id, seq) WHERE state = 'dead' OR (state = 'pending' AND attempts > 0)",
    ),
    (
        "_put_back_idx",
        "CREATE INDEX CONCURRENTLY {{name:_put_back_idx}} ON {{table}} (aggregate_type, aggregate_id, seq) WHERE state = 'pending' AND attempts = 0 AND last_error IS NOT NULL",
    ),
    (
        "_delivered_at_idx",
        "CREATE INDEX CONCURRENTLY {{name:_delivered_at_idx}} ON {{table}} (delivered_at) WHERE state = 'delivered'",
    ),
];

/// Dead tuples below this many are never a problem, whatever the ratio.
const BLOAT_MIN_DEAD: i64 = 10_000;

/// Runs every database check for `config`'s outbox.
pub async fn doctor(
    pool: &PgPool,
    config: &PostgresConfig,
    thresholds: DoctorThresholds,
) -> Vec<DoctorCheck> {
    let session = pool;
    let db = crate::db::Db::new(pool.clone(), config.transaction_pooling);
    let pool = &db;
    let table = config.qualified_table();
    let mut checks = Vec::new();
    let schema_ok = match crate::schema_version(session, &table).await {
        Ok(None) => {
            checks.push(DoctorCheck::red(
                "schema",
                format!("outbox table {table} is not set up (no migrations recorded)"),
                "run `outbox migrate`",
            ));
            false
        }
        Ok(Some(v)) if v < crate::SCHEMA_VERSION => {
            let missing: Vec<String> = crate::migrate::MIGRATIONS
                .iter()
                .filter(|m| m.version > v)
                .map(|m| format!("{:04}_{}", m.version, m.name))
                .collect();
            checks.push(DoctorCheck::red(
                "schema",
                format!(
                    "schema version {v}, this build expects {}: missing {}",
                    crate::SCHEMA_VERSION,
                    missing.join(", ")
                ),
                "run `outbox migrate` (the relay refuses to start until then)",
            ));
            true
        }
        Ok(Some(v)) if v > crate::SCHEMA_VERSION => {
            checks.push(DoctorCheck::warn(
                "schema",
                format!(
                    "schema version {v} is newer than this build's {}",
                    crate::SCHEMA_VERSION
                ),
                "upgrade the outbox binary",
            ));
            true
        }
        Ok(Some(v)) => {
            checks.push(DoctorCheck::ok(
                "schema",
                format!("version {v} (up to date)"),
            ));
            true
        }
        Err(e) => {
            checks.push(DoctorCheck::red(
                "schema",
                format!("cannot read the schema version: {e}"),
                "check the database URL and the user's privileges",
            ));
            false
        }
    };
    if schema_ok {
        checks.push(indexes(pool, config).await);
    }
    if config.mode == Mode::Cdc {
        checks.extend(cdc(session, config).await);
    }
    let sql = render(include_str!("../queries/doctor_transactions.sql"), &table);
    checks.push(idle_transactions(pool, &sql, thresholds.stale_transaction).await);
    if schema_ok {
        checks.push(bloat(pool, config).await);
        checks.extend(backlog(session, config, thresholds.stuck_after).await);
    }
    checks
}

async fn indexes(pool: &crate::db::Db, config: &PostgresConfig) -> DoctorCheck {
    let table = config.qualified_table();
    let sql = render(include_str!("../queries/doctor_indexes.sql"), &table);
    // Rendered by `sql::render` from validated identifiers only.
    let rows: Vec<(String, bool)> = match crate::sql::query_as(sqlx::AssertSqlSafe(sql))
        .bind(render("{{table}}", &table))
        .fetch_all(pool)
        .await
    {
        Ok(rows) => rows,
        Err(e) => {
            return DoctorCheck::red(
                "indexes",
                format!("cannot read the indexes of {table}: {e}"),
                "check the user's privileges",
            );
        }
    };
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    for (suffix, create) in EXPECTED_INDEXES {
        let name = format!("{}{suffix}", config.table.as_str());
        match rows.iter().find(|(n, _)| *n == name) {
            None => {
                problems.push(format!("{name} is missing"));
                fixes.push(format!("{};", render(create, &table)));
            }
            Some((_, false)) => {
                problems.push(format!(
                    "{name} is invalid (an interrupted CREATE INDEX CONCURRENTLY?)"
                ));
                fixes.push(format!(
                    "REINDEX INDEX CONCURRENTLY {};",
                    render(&format!("{{{{qname:{suffix}}}}}"), &table)
                ));
            }
            Some((_, true)) => {}
        }
    }
    if problems.is_empty() {
        DoctorCheck::ok(
            "indexes",
            format!(
                "all {} expected indexes present and valid",
                EXPECTED_INDEXES.len()
            ),
        )
    } else {
        DoctorCheck::red(
            "indexes",
            format!(
                "{} (claims and status scan the whole table without them)",
                problems.join("; ")
            ),
            fixes.join(" "),
        )
    }
}

async fn cdc(pool: &PgPool, config: &PostgresConfig) -> Vec<DoctorCheck> {
    let mut checks = Vec::new();
    let settings = crate::sql::query(include_str!("../queries/doctor_settings.sql"))
        .fetch_one(pool)
        .await;
    match settings {
        Ok(row) => {
            let wal_level: String = row.try_get(0).unwrap_or_default();
            let keep: String = row.try_get(1).unwrap_or_default();
            checks.push(if wal_level == "logical" {
                DoctorCheck::ok("wal_level", "logical")
            } else {
                DoctorCheck::red(
                    "wal_level",
                    format!("wal_level = {wal_level}: CDC needs `logical`"),
                    "ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL",
                )
            });
            checks.push(if keep == "-1" {
                DoctorCheck::warn(
                    "max_slot_wal_keep_size",
                    "unlimited (-1): a replication slot nobody reads keeps WAL until the disk is full",
                    "ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT pg_reload_conf(); (a slot past it is invalidated: docs/cdc.md#failover)",
                )
            } else {
                DoctorCheck::ok("max_slot_wal_keep_size", keep)
            });
        }
        Err(e) => checks.push(DoctorCheck::red(
            "wal_level",
            format!("cannot read server settings: {e}"),
            "check the database URL",
        )),
    }
    let slot = config.slot.as_str();
    checks.push(match crate::slot_status(pool, slot).await {
        Ok(None) => DoctorCheck::red(
            "replication_slot",
            format!("slot `{slot}` does not exist"),
            "on a first set-up run `outbox migrate` (it creates the slot and the publication); after a failover or a drop, a relay with source.on_slot_loss = \"recover\" creates it again and publishes from the table what was not acknowledged (docs/cdc.md#failover)",
        ),
        Ok(Some(s)) if s.is_lost() => DoctorCheck::red(
            "replication_slot",
            format!("slot `{slot}` was invalidated by the server (wal_status lost)"),
            "a relay with source.on_slot_loss = \"recover\" drops it and recovers from the table (docs/cdc.md#failover)",
        ),
        Ok(Some(s)) if !s.active => DoctorCheck::warn(
            "replication_slot",
            format!(
                "slot `{slot}` exists but no relay streams from it; it retains {} bytes of WAL",
                s.retained_wal_bytes.unwrap_or(0)
            ),
            "start `outbox relay` (an idle slot keeps WAL on disk), or drop the slot if CDC is retired",
        ),
        Ok(Some(s)) => DoctorCheck::ok(
            "replication_slot",
            format!(
                "slot `{slot}` streaming to pid {}, {} bytes not yet confirmed",
                s.active_pid.unwrap_or(0),
                s.retained_wal_bytes.unwrap_or(0)
            ),
        ),
        Err(e) => DoctorCheck::red(
            "replication_slot",
            format!("cannot read slot `{slot}`: {e}"),
            "check the user's privileges (pg_replication_slots)",
        ),
    });
    checks.push(publication(pool, config).await);
    match crate::cdc::recovery_status(pool, config).await {
        Ok(Some(r)) if r.in_progress() => checks.push(DoctorCheck::warn(
            "slot_recovery",
            r.describe(),
            "let a relay run: it finishes the recovery before streaming (docs/cdc.md#failover)",
        )),
        Ok(Some(r)) => checks.push(DoctorCheck::ok("slot_recovery", r.describe())),
        Ok(None) => {}
        Err(e) => checks.push(DoctorCheck::warn(
            "slot_recovery",
            format!("cannot read the slot recovery record: {e}"),
            "run `outbox migrate`",
        )),
    }
    checks
}

/// The publication the relay streams: it must exist, publish inserts and include the table
/// (the relay refuses to start otherwise).
async fn publication(pool: &PgPool, config: &PostgresConfig) -> DoctorCheck {
    let name = config.publication.as_str();
    let table = config.qualified_table();
    let row = crate::sql::query(crate::cdc::queries::PUBLICATION_STATUS)
        .bind(name)
        .bind(config.schema.as_str())
        .bind(config.table.as_str())
        .fetch_optional(pool)
        .await;
    let fix = "run `outbox migrate` with source.mode = \"cdc\" (it creates the publication or adds the table); events committed meanwhile are streamed once it exists only if the slot still holds them: see docs/cdc.md";
    match row {
        Ok(None) => DoctorCheck::red(
            "publication",
            format!("publication `{name}` does not exist: the CDC relay refuses to start"),
            fix,
        ),
        Ok(Some(r)) => {
            let inserts = r.try_get::<bool, _>("pubinsert").unwrap_or(false);
            let has_table = r.try_get::<bool, _>("has_table").unwrap_or(false);
            if !has_table {
                DoctorCheck::red(
                    "publication",
                    format!(
                        "publication `{name}` does not include {table}: the CDC relay refuses to start"
                    ),
                    fix,
                )
            } else if !inserts {
                DoctorCheck::red(
                    "publication",
                    format!(
                        "publication `{name}` does not publish inserts: the CDC relay refuses to start"
                    ),
                    format!("ALTER PUBLICATION \"{name}\" SET (publish = 'insert')"),
                )
            } else {
                DoctorCheck::ok(
                    "publication",
                    format!("`{name}` publishes inserts of {table}"),
                )
            }
        }
        Err(e) => DoctorCheck::red(
            "publication",
            format!("cannot read publication `{name}`: {e}"),
            "check the user's privileges (pg_publication)",
        ),
    }
}

/// Describes a transaction for a human: pid, state, age, query start and query.
pub(crate) fn describe_transaction(t: &OpenTransaction) -> String {
    format!(
        "pid {} ({}, {}) transaction open {:.0}s, query started {}: {}",
        t.pid,
        t.state.as_deref().unwrap_or("?"),
        t.user.as_deref().unwrap_or("?"),
        t.xact_age_seconds,
        t.query_start
            .and_then(|q| q
                .format(&time::format_description::well_known::Rfc3339)
                .ok())
            .unwrap_or_else(|| "?".to_owned()),
        t.query.as_deref().unwrap_or("").trim()
    )
}

async fn idle_transactions(pool: &crate::db::Db, sql: &str, stale: Duration) -> DoctorCheck {
    let open = match open_transactions(pool, sql, stale, 20).await {
        Ok(open) => open,
        Err(e) => {
            return DoctorCheck::red(
                "idle_transactions",
                format!("cannot read pg_stat_activity: {e}"),
                "grant the user pg_read_all_stats to see other sessions",
            );
        }
    };
    let idle: Vec<&OpenTransaction> = open
        .iter()
        .filter(|t| {
            t.pins_xmin
                && t.state
                    .as_deref()
                    .is_some_and(|s| s.starts_with("idle in transaction"))
        })
        .collect();
    if let Some(first) = idle.first() {
        return DoctorCheck::red(
            "idle_transactions",
            format!(
                "{} idle-in-transaction session(s) older than {}s pin the xmin horizon (vacuum cannot clean the outbox table): {}",
                idle.len(),
                stale.as_secs(),
                idle.iter()
                    .map(|t| describe_transaction(t))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            format!(
                "end it: SELECT pg_terminate_backend({}); and fix the client that leaves transactions open (or set idle_in_transaction_session_timeout)",
                first.pid
            ),
        );
    }
    match open.iter().find(|t| t.pins_xmin) {
        Some(t) => DoctorCheck::warn(
            "idle_transactions",
            format!(
                "no idle session, but a long transaction pins the xmin horizon: {}",
                describe_transaction(t)
            ),
            "check that it is expected (a report, a migration); it delays vacuum of the outbox table",
        ),
        None => DoctorCheck::ok(
            "idle_transactions",
            format!("no transaction open longer than {}s", stale.as_secs()),
        ),
    }
}

async fn bloat(pool: &crate::db::Db, config: &PostgresConfig) -> DoctorCheck {
    let table = config.qualified_table();
    let stats = crate::sql::query(include_str!("../queries/doctor_table_stats.sql"))
        .bind(config.schema.as_str())
        .bind(config.table.as_str())
        .fetch_optional(pool)
        .await;
    let row = match stats {
        Ok(Some(row)) => row,
        Ok(None) => {
            return DoctorCheck::warn(
                "bloat",
                format!("no statistics for {table}"),
                "run ANALYZE on it",
            );
        }
        Err(e) => {
            return DoctorCheck::red(
                "bloat",
                format!("cannot read pg_stat_user_tables: {e}"),
                "check the user's privileges",
            );
        }
    };
    let live: i64 = row.try_get(0).unwrap_or(0);
    let dead: i64 = row.try_get(1).unwrap_or(0);
    let last: Option<OffsetDateTime> = row
        .try_get::<Option<OffsetDateTime>, _>(2)
        .ok()
        .flatten()
        .max(row.try_get::<Option<OffsetDateTime>, _>(3).ok().flatten());
    let detail = format!(
        "{dead} dead / {live} live tuples; last vacuum {}",
        last.and_then(|t| t
            .format(&time::format_description::well_known::Rfc3339)
            .ok())
            .unwrap_or_else(|| "never".to_owned())
    );
    let fix = format!(
        "VACUUM (VERBOSE) {table}; if dead rows stay, something pins the xmin horizon (see idle_transactions); consider `[retention]` partitioned mode or a lower autovacuum_vacuum_scale_factor for the table"
    );
    if dead >= BLOAT_MIN_DEAD && dead > live {
        DoctorCheck::red("bloat", detail, fix)
    } else if dead >= BLOAT_MIN_DEAD && dead * 5 > live {
        DoctorCheck::warn("bloat", detail, fix)
    } else {
        DoctorCheck::ok("bloat", detail)
    }
}

async fn backlog(
    pool: &PgPool,
    config: &PostgresConfig,
    stuck_after: Duration,
) -> Vec<DoctorCheck> {
    if config.mode == Mode::Cdc {
        // Pending CDC events are WAL held by the slot (checked above), not row state; dead
        // letters are rows.
        let sql = render(
            include_str!("../queries/outbox_cdc_backlog.sql"),
            &config.qualified_table(),
        );
        return vec![
            match crate::sql::query_scalar::<i64>(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
            {
                Ok(dead) => dead_letters(u64::try_from(dead).unwrap_or(0)),
                Err(e) => DoctorCheck::red(
                    "dead_letters",
                    format!("cannot count dead letters: {e}"),
                    "run `outbox migrate`; check the user's privileges",
                ),
            },
        ];
    }
    let inspector = PgInspector::new(pool.clone(), config);
    let b = match inspector.backlog_at(OffsetDateTime::now_utc()).await {
        Ok(b) => b,
        Err(e) => {
            return vec![DoctorCheck::red(
                "oldest_pending",
                format!(
                    "cannot read the backlog: {}",
                    outbox_core::relay::ErrorChain(&e)
                ),
                "run `outbox migrate`; check the user's privileges",
            )];
        }
    };
    outbox_core::admin::backlog_checks(
        &b,
        stuck_after,
        "is a relay running and reaching the broker? `outbox status` shows what holds delivery; `outbox why ID` explains one event",
    )
}

fn dead_letters(dead: u64) -> DoctorCheck {
    outbox_core::admin::dead_letter_check(dead)
}
