//! Schema migrations for one outbox table, with their own bookkeeping table
//! (`<table>_migrations`, next to the outbox table; never the application's).
//!
//! `migrate` is idempotent and safe to run concurrently: everything happens in one
//! transaction that first takes an advisory lock named after the table, so a second
//! `migrate` waits and then finds nothing to do. PostgreSQL DDL is transactional, so a failed
//! migration leaves nothing half-done.

use outbox_core::QualifiedTable;
pub use outbox_core::migration::MigrateError;
use outbox_core::migration::Migration;
use sqlx::{Executor, PgPool};

use crate::partition::{self, Layout, Partitioning};
use crate::sql::render;

/// Every migration, in order. Append only; never edit one that has shipped.
pub(crate) const MIGRATIONS: &[Migration] = outbox_core::migrations!("migrations":
    "0001_outbox_table", "0002_attempt_history", "0003_cdc_offsets", "0004_aggregate_positions",
    "0005_cdc_put_back", "0006_positions_fillfactor", "0007_cdc_snapshots",
    "0008_cdc_offset_owner",
);

/// The schema version this build of the library expects.
pub const SCHEMA_VERSION: i32 = 8;

const WAKEUP_ON: &str = "DROP TRIGGER IF EXISTS {{name:_wakeup}} ON {{table}};
CREATE TRIGGER {{name:_wakeup}} AFTER INSERT ON {{table}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{qname:_notify}}();";
const WAKEUP_OFF: &str = "DROP TRIGGER IF EXISTS {{name:_wakeup}} ON {{table}}";

/// What `migrate` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Migrations applied by this call (version, name).
    pub applied: Vec<(i32, &'static str)>,
    /// The schema version after the call.
    pub version: i32,
    /// Whether the LISTEN/NOTIFY wake-up trigger is now installed.
    pub wakeup_trigger: bool,
    /// Partitions created by this call (partitioned mode: the DEFAULT partition and the
    /// current and next periods).
    pub partitions_created: Vec<String>,
}

/// How [`migrate_with`] sets the table up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigrateOptions {
    /// Install the LISTEN/NOTIFY wake-up trigger (`source.listen_notify`).
    pub listen_notify: bool,
    /// The table's layout (`source.partitioning`). A new table is created with it; an
    /// existing table with another layout is an error ([`MigrateError::Layout`]).
    pub partitioning: Partitioning,
}

impl MigrateOptions {
    /// The options of a `[source]` configuration.
    pub fn from_config(config: &crate::PostgresConfig) -> Self {
        Self {
            listen_notify: config.listen_notify,
            partitioning: config.partitioning,
        }
    }
}

/// Creates or upgrades the outbox schema for `table`, and installs (`listen_notify = true`)
/// or removes the statement-level NOTIFY wake-up trigger.
pub async fn migrate(
    pool: &PgPool,
    table: &QualifiedTable,
    listen_notify: bool,
) -> Result<MigrationReport, MigrateError> {
    migrate_with(
        pool,
        table,
        MigrateOptions {
            listen_notify,
            partitioning: Partitioning::None,
        },
    )
    .await
}

/// [`migrate`] with every option: in partitioned mode a new table is created
/// `PARTITION BY RANGE (created_at)` with its partitions ahead and a DEFAULT partition
/// (docs/operations.md, "Partitioned outbox").
pub async fn migrate_with(
    pool: &PgPool,
    table: &QualifiedTable,
    options: MigrateOptions,
) -> Result<MigrationReport, MigrateError> {
    let listen_notify = options.listen_notify;
    let name = table.to_string();
    let db = |source| MigrateError::database("outbox", &name, source);
    let mut tx = pool.begin().await.map_err(db)?;
    crate::sql::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("outbox migrate {name}"))
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    let schema_sql = render("CREATE SCHEMA IF NOT EXISTS {{schema}}", table);
    tx.execute(sqlx::AssertSqlSafe(schema_sql))
        .await
        .map_err(db)?;
    let book = outbox_sql::bookkeeping!("outbox", &name, |sql| render(sql, table));
    let mut run = book.on(&mut *tx);
    let plan = run.pending(MIGRATIONS).await?;
    let layout = partition::layout(run.conn, table).await.map_err(db)?;
    if layout != Layout::Missing {
        crate::retention::layout_matches(table, options.partitioning, layout)
            .map_err(|e| MigrateError::Layout(e.to_string()))?;
    }
    let mut report = MigrationReport {
        applied: Vec::new(),
        version: plan.current,
        wakeup_trigger: listen_notify,
        partitions_created: Vec::new(),
    };
    for (m, checksum) in plan.to_apply {
        // A partitioned table (layout_matches checked the option against the table) gets
        // its variant of the statements that know the layout.
        let partitioned = options.partitioning != Partitioning::None;
        let sql = match m.version {
            1 if partitioned => render(&partition::partitioned_variant(m.sql), table),
            5 if partitioned => render(&partition::partitioned_lock_key(m.sql), table),
            _ => render(m.sql, table),
        };
        run.run_script(sql).await?;
        run.record(m, &checksum).await?;
        report.applied.push((m.version, m.name));
        report.version = m.version;
    }
    if options.partitioning != Partitioning::None {
        report.partitions_created = partition::create_ahead(
            &mut tx,
            table,
            options.partitioning,
            time::OffsetDateTime::now_utc(),
        )
        .await
        .map_err(db)?;
    }
    let wakeup = if listen_notify { WAKEUP_ON } else { WAKEUP_OFF };
    tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(render(wakeup, table))))
        .await
        .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(report)
}

/// The schema version recorded for `table`, or `None` when it was never migrated.
pub async fn schema_version(
    pool: &PgPool,
    table: &QualifiedTable,
) -> Result<Option<i32>, sqlx::Error> {
    let pool = &crate::db::Db::new(pool.clone(), !crate::sql::named());
    let exists: Option<String> = crate::sql::query_scalar("SELECT to_regclass($1)::text")
        .bind(render("{{qname:_migrations}}", table))
        .fetch_one(pool)
        .await?;
    if exists.is_none() {
        return Ok(None);
    }
    crate::sql::query_scalar(sqlx::AssertSqlSafe(render(
        "SELECT max(version) FROM {{qname:_migrations}}",
        table,
    )))
    .fetch_one(pool)
    .await
}
