//! The source conformance suite against SQLite, exactly as against PostgreSQL: one call.

use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_sqlite::{OnDelivered, SqliteConfig, SqliteOutbox, SqlitePollSource};
use outbox_testkit::conformance::{Harness, StoredEvent};
use sqlx::SqlitePool;
use uuid::Uuid;

struct SqliteHarness {
    _dir: tempfile::TempDir,
    pool: SqlitePool,
    config: SqliteConfig,
    outbox: SqliteOutbox,
}

impl SqliteHarness {
    async fn new(on_delivered: OnDelivered) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut config = SqliteConfig::new(dir.path().join("outbox.db"));
        config.on_delivered = on_delivered;
        let pool = outbox_sqlite::connect(&config).await?;
        outbox_sqlite::migrate(&pool, &config.table).await?;
        let outbox = SqliteOutbox::new(config.table.clone());
        Ok(Self {
            _dir: dir,
            pool,
            config,
            outbox,
        })
    }
}

impl Harness for SqliteHarness {
    type Source = SqlitePollSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<SqlitePollSource> {
        Ok(SqlitePollSource::new(
            self.pool.clone(),
            &self.config,
            ordering,
            dead_letter,
        ))
    }

    async fn write_counted(
        &self,
        event: NewEvent,
        outbox_first: bool,
        hold: std::time::Duration,
    ) -> anyhow::Result<(Uuid, i64)> {
        let table = self.config.table.to_string();
        outbox_testkit::oracle::sqlite_write_counted(&self.pool, &table, &event, outbox_first, hold)
            .await
    }

    async fn write(&self, events: Vec<NewEvent>, commit: bool) -> anyhow::Result<Vec<Uuid>> {
        let mut tx = self.pool.begin().await?;
        let ids = self.outbox.enqueue_batch(&mut *tx, &events).await?;
        if commit {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok(ids)
    }

    async fn stored(&self, id: Uuid) -> anyhow::Result<Option<StoredEvent>> {
        let row: Option<(String, i64)> =
            sqlx::query_as("SELECT state, attempts FROM outbox WHERE id = ?")
                .bind(id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(state, attempts)| StoredEvent {
            state,
            attempts: attempts as i32,
        }))
    }

    fn replicas(&self) -> usize {
        // One relay per file, enforced by the lease: a second source is a standby.
        1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_source_passes_the_conformance_suite_when_marking() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| SqliteHarness::new(OnDelivered::Mark)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_source_passes_the_conformance_suite_when_deleting() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| SqliteHarness::new(OnDelivered::Delete)).await
}
