//! The admin conformance suite (dead letters, why, status, doctor, replay, retention)
//! against PostgreSQL, through the backend seam exactly as the `outbox` command uses it:
//! polling (marking and deleting delivered rows), a partitioned table, and CDC.
#![allow(clippy::disallowed_methods)] // tests talk to PostgreSQL directly, never through a pooler

mod cdc_support;
mod support;

use std::sync::Arc;

use cdc_support::CdcHarness;
use outbox_core::backend::{Backend, BackendConfig, OpenOptions};
use outbox_core::{Identifier, NewEvent};
use outbox_postgres::{OnDelivered, Partitioning, PostgresConfig};
use outbox_testkit::admin_conformance::{self, AdminHarness};
use support::PgHarness;
use uuid::Uuid;

async fn open(config: &PostgresConfig) -> anyhow::Result<Arc<dyn Backend>> {
    Ok(config.open(OpenOptions { connections: 4 }).await?)
}

/// The same database, a table nobody migrated.
async fn unmigrated(config: &PostgresConfig) -> anyhow::Result<Arc<dyn Backend>> {
    let mut other = config.clone();
    other.table = Identifier::new("never_migrated")?;
    open(&other).await
}

struct PollAdmin {
    h: PgHarness,
    backend: Arc<dyn Backend>,
    marks: bool,
}

impl PollAdmin {
    async fn new(on_delivered: OnDelivered, partitioning: Partitioning) -> anyhow::Result<Self> {
        let h = PgHarness::with_partitioning(on_delivered, partitioning).await?;
        let backend = open(&h.config).await?;
        Ok(Self {
            h,
            backend,
            marks: on_delivered == OnDelivered::Mark,
        })
    }
}

impl AdminHarness for PollAdmin {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn write(&self, events: Vec<NewEvent>) -> anyhow::Result<Vec<Uuid>> {
        Ok(self.h.outbox.enqueue_batch(&self.h.pool, &events).await?)
    }
    async fn unmigrated(&self) -> anyhow::Result<Arc<dyn Backend>> {
        unmigrated(&self.h.config).await
    }
    fn retention_by_delivery_time(&self) -> bool {
        self.marks
    }
    fn keeps_delivered_rows(&self) -> bool {
        self.marks
    }
}

struct CdcAdmin {
    h: CdcHarness,
    backend: Arc<dyn Backend>,
}

impl AdminHarness for CdcAdmin {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn write(&self, events: Vec<NewEvent>) -> anyhow::Result<Vec<Uuid>> {
        Ok(self.h.outbox.enqueue_batch(&self.h.pool, &events).await?)
    }
    async fn unmigrated(&self) -> anyhow::Result<Arc<dyn Backend>> {
        unmigrated(&self.h.config).await
    }
    fn records_delivery_in_rows(&self) -> bool {
        false
    }
    fn retention_by_delivery_time(&self) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_backend_passes_the_admin_suite_when_marking() -> anyhow::Result<()> {
    admin_conformance::run_all(|| PollAdmin::new(OnDelivered::Mark, Partitioning::None)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn polling_backend_passes_the_admin_suite_when_deleting() -> anyhow::Result<()> {
    admin_conformance::run_all(|| PollAdmin::new(OnDelivered::Delete, Partitioning::None)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_backend_passes_the_admin_suite() -> anyhow::Result<()> {
    admin_conformance::run_all(|| PollAdmin::new(OnDelivered::Mark, Partitioning::Daily)).await
}

/// The suite once found an ordering bug here: a dead letter retried while the relay that
/// dead-lettered it was stopped (the event behind it still in the slot's unconfirmed tail)
/// was published after that event. Retried rows now keep their seq and stay marked until
/// delivered (migration 0005), and the relay streams an overtaking event again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cdc_backend_passes_the_admin_suite() -> anyhow::Result<()> {
    admin_conformance::run_all(|| async {
        let h = CdcHarness::new().await?;
        let backend = open(&h.config).await?;
        Ok(CdcAdmin { h, backend })
    })
    .await
}
