//! Shared support of the CDC tests: a fresh migrated outbox with its own publication and a
//! uniquely named slot (slots are cluster-wide), dropped again when the harness is dropped,
//! and the conformance harness over it.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::time::Duration;

use anyhow::Context;
use outbox_core::source::{Outcome, Settlement};
use outbox_core::{DeadLetterPolicy, Event, NewEvent, Ordering};
use outbox_postgres::{Mode, PgCdcSource, PgOutbox, PostgresConfig};
use outbox_testkit::conformance::{Harness, StoredEvent};
use outbox_testkit::services::Postgres;
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

pub struct CdcHarness {
    pub pool: PgPool,
    pub config: PostgresConfig,
    pub outbox: PgOutbox,
    pub url: String,
    _slot: SlotGuard,
}

impl CdcHarness {
    pub async fn new() -> anyhow::Result<Self> {
        outbox_testkit::init_tracing();
        let pg = Postgres::shared().await?;
        let url = pg.fresh_database().await?;
        let mut config = PostgresConfig::new(url.clone());
        config.mode = Mode::Cdc;
        config.slot = outbox_core::Identifier::new(format!("s{}", Uuid::now_v7().simple()))?;
        config.heartbeat_interval = Duration::from_millis(500);
        config.validate().map_err(anyhow::Error::msg)?;
        let pool = outbox_postgres::connect(&config, 20).await?;
        outbox_postgres::migrate(&pool, &config.qualified_table(), false).await?;
        let guard = SlotGuard {
            url: url.clone(),
            slot: config.slot.as_str().to_owned(),
        };
        outbox_postgres::setup_cdc(&pool, &config).await?;
        let outbox = PgOutbox::new(config.qualified_table());
        Ok(Self {
            pool,
            config,
            outbox,
            url,
            _slot: guard,
        })
    }

    pub fn cdc_source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<PgCdcSource> {
        Ok(PgCdcSource::new(
            self.pool.clone(),
            &self.config,
            ordering,
            dead_letter,
        )?)
    }

    /// Waits until `n` rows of the outbox are dead letters.
    pub async fn wait_dead(&self, n: i64) -> anyhow::Result<()> {
        let pool = self.pool.clone();
        outbox_testkit::wait::eventually(Duration::from_secs(30), || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'dead'")
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(0)
                    == n
            }
        })
        .await
        .with_context(|| format!("the outbox did not reach {n} dead letters"))
    }

    /// Waits until no session streams from the slot (a dropped source closed its session).
    pub async fn slot_released(&self) -> anyhow::Result<()> {
        let pool = self.pool.clone();
        let slot = self.config.slot.as_str().to_owned();
        outbox_testkit::wait::eventually(Duration::from_secs(10), || {
            let (pool, slot) = (pool.clone(), slot.clone());
            async move {
                let active: Option<bool> = sqlx::query_scalar(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                )
                .bind(slot)
                .fetch_optional(&pool)
                .await
                .unwrap_or(None);
                active == Some(false)
            }
        })
        .await
        .context("the slot was not released")
    }

    /// Events of the slot's unconfirmed tail whose bytes mention `needle` (peeking does not
    /// consume). Needs the slot released.
    pub async fn unconfirmed_mentions(&self, needle: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
             'proto_version', '1', 'publication_names', $2, 'messages', 'true') \
             WHERE position(convert_to($3, 'UTF8') IN data) > 0",
        )
        .bind(self.config.slot.as_str())
        .bind(self.config.publication.as_str())
        .bind(needle)
        .fetch_one(&self.pool)
        .await?)
    }

    /// The slot's confirmed flush position, as a number.
    pub async fn confirmed_lsn(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(self.config.slot.as_str())
        .fetch_one(&self.pool)
        .await?)
    }
}

impl Harness for CdcHarness {
    type Source = PgCdcSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<PgCdcSource> {
        self.cdc_source(ordering, dead_letter)
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
        1
    }

    /// In CDC mode delivered rows stay `pending`: delivery is recorded by the slot's confirmed
    /// position. Delivered = no longer in the slot's unconfirmed tail.
    async fn recorded_delivered(&self, id: Uuid) -> anyhow::Result<bool> {
        self.slot_released().await?;
        Ok(self.unconfirmed_mentions(&id.to_string()).await? == 0)
    }
}

/// Drops the test's slot (terminating a session that still holds it) when the test ends.
struct SlotGuard {
    url: String,
    slot: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let (url, slot) = (self.url.clone(), self.slot.clone());
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("runtime")?;
            runtime.block_on(drop_slot(&url, &slot))
        })
        .join();
        if let Ok(Err(e)) = done {
            eprintln!("could not drop test slot: {e:#}");
        }
    }
}

async fn drop_slot(url: &str, slot: &str) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect(url).await?;
    for _ in 0..100 {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(slot)
        .execute(&mut conn)
        .await?;
        match sqlx::query(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(slot)
        .execute(&mut conn)
        .await
        {
            Ok(_) => return Ok(()),
            // Still active for a moment after the terminate.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    anyhow::bail!("slot {slot} stayed active")
}

/// Every event of a batch settled as delivered.
pub fn delivered(events: &[Event]) -> Vec<Settlement> {
    events
        .iter()
        .map(|e| Settlement {
            position: e.position,
            outcome: Outcome::Delivered,
        })
        .collect()
}
