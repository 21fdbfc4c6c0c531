//! The admin conformance suite against SQLite, through the backend seam exactly as the
//! `outbox` command uses it. SQLite has no replay: the suite checks that it says so.

use std::sync::Arc;

use outbox_core::NewEvent;
use outbox_core::backend::{Backend, BackendConfig, OpenOptions};
use outbox_sqlite::{SqliteConfig, SqliteOutbox};
use outbox_testkit::admin_conformance::{self, AdminHarness};
use sqlx::SqlitePool;
use uuid::Uuid;

struct SqliteAdmin {
    dir: tempfile::TempDir,
    pool: SqlitePool,
    outbox: SqliteOutbox,
    backend: Arc<dyn Backend>,
}

impl SqliteAdmin {
    async fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = SqliteConfig::new(dir.path().join("outbox.db"));
        let backend = config.open(OpenOptions { connections: 1 }).await?;
        backend.migrate().await?;
        let pool = outbox_sqlite::connect(&config).await?;
        Ok(Self {
            dir,
            pool,
            outbox: SqliteOutbox::new(config.table.clone()),
            backend,
        })
    }
}

impl AdminHarness for SqliteAdmin {
    fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }
    async fn write(&self, events: Vec<NewEvent>) -> anyhow::Result<Vec<Uuid>> {
        Ok(self.outbox.enqueue_batch(&self.pool, &events).await?)
    }
    async fn unmigrated(&self) -> anyhow::Result<Arc<dyn Backend>> {
        let config = SqliteConfig::new(self.dir.path().join("never_migrated.db"));
        Ok(config.open(OpenOptions { connections: 1 }).await?)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_backend_passes_the_admin_suite() -> anyhow::Result<()> {
    admin_conformance::run_all(SqliteAdmin::new).await
}
