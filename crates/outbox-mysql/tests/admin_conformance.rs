//! The admin conformance suite against a real MariaDB, through the backend seam exactly as
//! the `outbox` command uses it: status, doctor (red on a never-migrated database), dead
//! letters (list, show, retry, purge), why, retention, and replay (republishing exactly the
//! window; refused, saying why, when delivered rows are deleted).

use std::sync::Arc;

use outbox_core::NewEvent;
use outbox_core::backend::{Backend, BackendConfig, OpenOptions};
use outbox_mysql::{Mode, MySqlConfig, MySqlOutbox, OnDelivered};
use outbox_testkit::admin_conformance::{self, AdminHarness};
use outbox_testkit::services::MariaDb;
use sqlx::MySqlPool;
use uuid::Uuid;

struct MySqlAdminHarness {
    pool: MySqlPool,
    outbox: MySqlOutbox,
    backend: Arc<dyn Backend>,
    on_delivered: OnDelivered,
    mode: Mode,
}

impl MySqlAdminHarness {
    async fn new(on_delivered: OnDelivered) -> anyhow::Result<Self> {
        Self::with_mode(on_delivered, Mode::Poll).await
    }

    async fn with_mode(on_delivered: OnDelivered, mode: Mode) -> anyhow::Result<Self> {
        outbox_testkit::init_tracing();
        let url = MariaDb::shared().await?.fresh_database().await?;
        let mut config = MySqlConfig::new(url);
        config.on_delivered = on_delivered;
        config.mode = mode;
        let backend = config.open(OpenOptions { connections: 4 }).await?;
        backend.migrate().await?;
        let pool = outbox_mysql::connect(&config, 4).await?;
        Ok(Self {
            pool,
            outbox: MySqlOutbox::new(config.table.clone()),
            backend,
            on_delivered,
            mode,
        })
    }
}

impl AdminHarness for MySqlAdminHarness {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn write(&self, events: Vec<NewEvent>) -> anyhow::Result<Vec<Uuid>> {
        let mut tx = self.pool.begin().await?;
        let mut ids = Vec::with_capacity(events.len());
        for event in &events {
            ids.push(self.outbox.enqueue(&mut tx, event).await?);
        }
        tx.commit().await?;
        Ok(ids)
    }
    fn records_delivery_in_rows(&self) -> bool {
        self.mode == Mode::Poll
    }
    fn retention_by_delivery_time(&self) -> bool {
        self.mode == Mode::Poll && self.on_delivered == OnDelivered::Mark
    }
    fn keeps_delivered_rows(&self) -> bool {
        self.mode == Mode::Poll && self.on_delivered == OnDelivered::Mark
    }
    async fn unmigrated(&self) -> anyhow::Result<Arc<dyn Backend>> {
        let url = MariaDb::shared().await?.fresh_database().await?;
        let mut config = MySqlConfig::new(url);
        config.mode = self.mode;
        Ok(config.open(OpenOptions { connections: 1 }).await?)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_backend_passes_the_admin_suite() -> anyhow::Result<()> {
    admin_conformance::run_all(|| MySqlAdminHarness::new(OnDelivered::Mark)).await
}

/// Deleting delivered rows: replay refuses and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_backend_passes_the_admin_suite_when_deleting() -> anyhow::Result<()> {
    admin_conformance::run_all(|| MySqlAdminHarness::new(OnDelivered::Delete)).await
}

/// Binlog CDC: dead letters (retrying one puts back the events parked behind it, and the
/// stream publishes them in order), purge, doctor, and replay refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_cdc_backend_passes_the_admin_suite() -> anyhow::Result<()> {
    admin_conformance::run_all(|| MySqlAdminHarness::with_mode(OnDelivered::Mark, Mode::Cdc)).await
}
