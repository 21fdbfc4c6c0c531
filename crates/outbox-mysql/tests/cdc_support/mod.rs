//! The conformance harness for the binlog CDC source: a fresh outbox in its own database on
//! the shared MariaDB (row-based binlog), migrated in CDC mode. Writes and reads rows like
//! the polling harness (`support`, which every test using this module declares too).

#![allow(dead_code, unreachable_pub, missing_docs)]

use futures::StreamExt as _;
use mysql_async::binlog::events::EventData;
use outbox_core::{DeadLetterPolicy, NewEvent, Ordering};
use outbox_mysql::{Mode, MySqlCdcSource, MySqlConfig, MySqlOutbox};
use outbox_testkit::conformance::{Harness, StoredEvent};
use outbox_testkit::services::MariaDb;
use sqlx::MySqlPool;
use uuid::Uuid;

pub struct CdcHarness {
    pub pool: MySqlPool,
    pub config: MySqlConfig,
    pub outbox: MySqlOutbox,
    pub url: String,
}

impl CdcHarness {
    pub async fn new() -> anyhow::Result<Self> {
        outbox_testkit::init_tracing();
        let url = MariaDb::shared().await?.fresh_database().await?;
        let mut config = MySqlConfig::new(url.clone());
        config.mode = Mode::Cdc;
        // Short enough that a test's dropped source frees the stream soon.
        config.claim_timeout = std::time::Duration::from_secs(8);
        let pool = outbox_mysql::connect(&config, 30).await?;
        outbox_mysql::migrate(&pool, &config.table).await?;
        outbox_mysql::setup_cdc(&pool, &config)
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            outbox: MySqlOutbox::new(config.table.clone()),
            pool,
            config,
            url,
        })
    }

    /// The kept position (`file`, offset).
    pub async fn kept(&self) -> anyhow::Result<(String, u64)> {
        let (file, pos): (String, i64) = sqlx::query_as(
            "SELECT binlog_file, binlog_pos FROM outbox_cdc_position WHERE stream = 'relay'",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((file, u64::try_from(pos)?))
    }

    /// Whether the binlog after the kept position still holds an insert (or a put-back) of
    /// the outbox row `id`: reads it to its end with a non-blocking binlog session.
    pub async fn unconfirmed(&self, id: Uuid) -> anyhow::Result<bool> {
        let (file, pos) = self.kept().await?;
        let opts = mysql_async::Opts::from_url(&self.url)?;
        let conn = mysql_async::Conn::new(opts).await?;
        let database = self.url.rsplit('/').next().unwrap_or_default().to_owned();
        let request = mysql_async::BinlogStreamRequest::new(0x3fff_0000 | u32::from(rand_u16()))
            .with_filename(file.as_bytes())
            .with_pos(pos)
            .with_non_blocking();
        let mut stream = conn.get_binlog_stream(request).await?;
        let needle = id.to_string();
        let mut found = false;
        while let Some(event) = stream.next().await {
            let event = event?;
            if let Some(EventData::RowsEvent(rows)) = event.read_data()? {
                let Some(tme) = stream.get_tme(rows.table_id()) else {
                    continue;
                };
                if tme.database_name() != database || tme.table_name() != "outbox" {
                    continue;
                }
                for row in rows.rows(tme) {
                    let (_, after) = row?;
                    if let Some(after) = after
                        && format!("{after:?}").contains(&needle)
                    {
                        found = true;
                    }
                }
            }
        }
        Ok(found)
    }
}

fn rand_u16() -> u16 {
    let b = Uuid::new_v4().into_bytes();
    u16::from_le_bytes([b[0], b[1]])
}

impl Harness for CdcHarness {
    type Source = MySqlCdcSource;

    async fn source(
        &self,
        ordering: Ordering,
        dead_letter: DeadLetterPolicy,
    ) -> anyhow::Result<MySqlCdcSource> {
        Ok(MySqlCdcSource::new(
            self.pool.clone(),
            &self.config,
            ordering,
            dead_letter,
        )?)
    }

    async fn write_counted(
        &self,
        event: NewEvent,
        outbox_first: bool,
        hold: std::time::Duration,
    ) -> anyhow::Result<(Uuid, i64)> {
        crate::support::write_counted(&self.pool, event, outbox_first, hold).await
    }

    async fn write(&self, events: Vec<NewEvent>, commit: bool) -> anyhow::Result<Vec<Uuid>> {
        crate::support::write(&self.pool, &self.outbox, events, commit).await
    }

    async fn stored(&self, id: Uuid) -> anyhow::Result<Option<StoredEvent>> {
        crate::support::stored(&self.pool, id).await
    }

    /// One stream at a time; the others stand by.
    fn replicas(&self) -> usize {
        2
    }

    /// Streamed rows stay `pending`: delivered means the kept position passed the row.
    async fn recorded_delivered(&self, id: Uuid) -> anyhow::Result<bool> {
        Ok(!self.unconfirmed(id).await?)
    }
}
