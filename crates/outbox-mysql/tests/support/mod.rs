//! Shared test support: a fresh, migrated outbox in its own MariaDB database, and the
//! conformance harness over it.

#![allow(dead_code, unreachable_pub, missing_docs)]

use outbox_core::backend::BoxedSource;
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_mysql::{
    ClaimMode, MySqlConfig, MySqlLeaseSource, MySqlOutbox, MySqlPollSource, OnDelivered,
};
use outbox_testkit::conformance::{Harness, StoredEvent};
use outbox_testkit::services::MariaDb;
use sqlx::MySqlPool;
use uuid::Uuid;

pub struct MySqlHarness {
    pub pool: MySqlPool,
    pub config: MySqlConfig,
    pub outbox: MySqlOutbox,
}

impl MySqlHarness {
    pub async fn new(on_delivered: OnDelivered) -> anyhow::Result<Self> {
        Self::with_claim(on_delivered, ClaimMode::SkipLocked).await
    }

    /// A fresh outbox relayed with the given claim. The lease claim gets a short lease
    /// (longer than the suite's publish timeout), so a dead relay's rows come back soon.
    pub async fn with_claim(on_delivered: OnDelivered, claim: ClaimMode) -> anyhow::Result<Self> {
        outbox_testkit::init_tracing();
        let url = MariaDb::shared().await?.fresh_database().await?;
        let mut config = MySqlConfig::new(url);
        config.on_delivered = on_delivered;
        config.claim = claim;
        if claim == ClaimMode::Lease {
            config.claim_timeout = std::time::Duration::from_secs(8);
        }
        let pool = outbox_mysql::connect(&config, 30).await?;
        outbox_mysql::migrate(&pool, &config.table).await?;
        Ok(Self {
            outbox: MySqlOutbox::new(config.table.clone()),
            pool,
            config,
        })
    }
}

impl Harness for MySqlHarness {
    type Source = BoxedSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<BoxedSource> {
        let (pool, config) = (self.pool.clone(), &self.config);
        Ok(if config.claim == ClaimMode::Lease {
            BoxedSource::new(MySqlLeaseSource::new(pool, config, ordering, dead_letter))
        } else {
            BoxedSource::new(MySqlPollSource::new(pool, config, ordering, dead_letter))
        })
    }

    async fn write_counted(
        &self,
        event: NewEvent,
        outbox_first: bool,
        hold: std::time::Duration,
    ) -> anyhow::Result<(Uuid, i64)> {
        write_counted(&self.pool, event, outbox_first, hold).await
    }

    async fn write(&self, events: Vec<NewEvent>, commit: bool) -> anyhow::Result<Vec<Uuid>> {
        write(&self.pool, &self.outbox, events, commit).await
    }

    async fn stored(&self, id: Uuid) -> anyhow::Result<Option<StoredEvent>> {
        stored(&self.pool, id).await
    }

    fn replicas(&self) -> usize {
        3
    }
}

/// The harnesses' `write`: `events` in one transaction, committed or rolled back.
pub async fn write(
    pool: &MySqlPool,
    outbox: &MySqlOutbox,
    events: Vec<NewEvent>,
    commit: bool,
) -> anyhow::Result<Vec<Uuid>> {
    let mut tx = pool.begin().await?;
    let mut ids = Vec::with_capacity(events.len());
    for event in &events {
        ids.push(outbox.enqueue(&mut tx, event).await?);
    }
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(ids)
}

/// The harnesses' `stored`: the row's state and attempts.
pub async fn stored(pool: &MySqlPool, id: Uuid) -> anyhow::Result<Option<StoredEvent>> {
    let row: Option<(String, i32)> =
        sqlx::query_as("SELECT state, attempts FROM outbox WHERE id = ?")
            .bind(id.to_string())
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(state, attempts)| StoredEvent { state, attempts }))
}

/// The harnesses' `write_counted` (the commit-order oracle) on the table `outbox`.
pub async fn write_counted(
    pool: &MySqlPool,
    event: NewEvent,
    outbox_first: bool,
    hold: std::time::Duration,
) -> anyhow::Result<(Uuid, i64)> {
    outbox_testkit::oracle::mysql_write_counted(pool, "`outbox`", &event, outbox_first, hold).await
}
