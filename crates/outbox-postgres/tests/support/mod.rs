//! Shared test support: a fresh, migrated outbox in its own database, and the conformance
//! harness over it.

#![allow(dead_code, unreachable_pub, missing_docs)]

use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_postgres::{
    MigrateOptions, OnDelivered, Partitioning, PgOutbox, PgPollSource, PostgresConfig,
};
use outbox_testkit::conformance::{Harness, StoredEvent};
use outbox_testkit::services::Postgres;
use sqlx::PgPool;
use uuid::Uuid;

pub struct PgHarness {
    /// Direct to PostgreSQL: the suite's own checks and the commit-order oracle's writes.
    pub pool: PgPool,
    /// What the relay's sources claim with (`pool` unless a pooler is in between).
    pub claims: PgPool,
    /// What the producer writes with (`pool` unless a pooler is in between).
    pub writes: PgPool,
    pub config: PostgresConfig,
    pub outbox: PgOutbox,
    /// Whatever must live as long as the harness (a PgBouncer in front of the database).
    pub keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl PgHarness {
    pub async fn new(on_delivered: OnDelivered) -> anyhow::Result<Self> {
        Self::with_partitioning(on_delivered, Partitioning::None).await
    }

    /// A fresh outbox created with the given table layout (`source.partitioning`).
    pub async fn with_partitioning(
        on_delivered: OnDelivered,
        partitioning: Partitioning,
    ) -> anyhow::Result<Self> {
        outbox_testkit::init_tracing();
        let pg = Postgres::shared().await?;
        let url = pg.fresh_database().await?;
        let mut config = PostgresConfig::new(url);
        config.on_delivered = on_delivered;
        config.partitioning = partitioning;
        let pool = outbox_postgres::connect(&config, 20).await?;
        outbox_postgres::migrate_with(
            &pool,
            &config.qualified_table(),
            MigrateOptions::from_config(&config),
        )
        .await?;
        let outbox = PgOutbox::new(config.qualified_table());
        Ok(Self {
            claims: pool.clone(),
            writes: pool.clone(),
            pool,
            config,
            outbox,
            keep: None,
        })
    }
}

impl Harness for PgHarness {
    type Source = PgPollSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<PgPollSource> {
        Ok(PgPollSource::new(
            self.claims.clone(),
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
        let table = self.config.qualified_table().to_string();
        outbox_testkit::oracle::pg_write_counted(&self.pool, &table, &event, outbox_first, hold)
            .await
    }

    async fn write(&self, events: Vec<NewEvent>, commit: bool) -> anyhow::Result<Vec<Uuid>> {
        let mut tx = self.writes.begin().await?;
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
