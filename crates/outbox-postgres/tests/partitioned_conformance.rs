//! The source conformance suite on a partitioned outbox table (`source.partitioning =
//! "daily"`): claims, marks and deletes by seq, the ordering trigger and dead-lettering must
//! behave exactly as on a plain table.

use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_postgres::{
    MigrateOptions, OnDelivered, Partitioning, PgOutbox, PgPollSource, PostgresConfig,
};
use outbox_testkit::conformance::{Harness, StoredEvent};
use outbox_testkit::services::Postgres;
use sqlx::PgPool;
use uuid::Uuid;

struct PartitionedHarness {
    pool: PgPool,
    config: PostgresConfig,
    outbox: PgOutbox,
}

impl PartitionedHarness {
    async fn new(on_delivered: OnDelivered) -> anyhow::Result<Self> {
        outbox_testkit::init_tracing();
        let pg = Postgres::shared().await?;
        let mut config = PostgresConfig::new(pg.fresh_database().await?);
        config.on_delivered = on_delivered;
        config.partitioning = Partitioning::Daily;
        let pool = outbox_postgres::connect(&config, 20).await?;
        outbox_postgres::migrate_with(
            &pool,
            &config.qualified_table(),
            MigrateOptions::from_config(&config),
        )
        .await?;
        let partitioned: bool = sqlx::query_scalar(
            "SELECT relkind = 'p' FROM pg_class WHERE oid = 'public.outbox'::regclass",
        )
        .fetch_one(&pool)
        .await?;
        anyhow::ensure!(partitioned, "the outbox table is not partitioned");
        let outbox = PgOutbox::new(config.qualified_table());
        Ok(Self {
            pool,
            config,
            outbox,
        })
    }
}

impl Harness for PartitionedHarness {
    type Source = PgPollSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<PgPollSource> {
        Ok(PgPollSource::new(
            self.pool.clone(),
            &self.config,
            ordering,
            dead_letter,
        ))
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
        let row: Option<(String, i32)> =
            sqlx::query_as("SELECT state, attempts FROM outbox WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(state, attempts)| StoredEvent { state, attempts }))
    }

    fn replicas(&self) -> usize {
        3
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_table_passes_the_conformance_suite_when_marking() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| PartitionedHarness::new(OnDelivered::Mark)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_table_passes_the_conformance_suite_when_deleting() -> anyhow::Result<()> {
    outbox_testkit::conformance::run_all(|| PartitionedHarness::new(OnDelivered::Delete)).await
}
