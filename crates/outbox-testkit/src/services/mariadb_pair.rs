//! [`MariaDbPair`]: a MariaDB primary with a GTID replica on 127.0.0.1, for failover tests:
//! crash the primary, promote the replica.
//!
//! Both are private [`MariaDb`] servers (free ports, temporary directories, removed on drop)
//! with a row binlog, `log_slave_updates` (the replica's binlog holds the primary's
//! transactions under their own GTIDs, so a binlog reader can resume on it by GTID after a
//! failover) and server ids 1 and 2. The replica follows by GTID (`MASTER_USE_GTID =
//! slave_pos`) and runs `read_only`. With `semi_sync = true` the primary waits at every commit,
//! before the commit is visible (`AFTER_SYNC`), until the replica has the transaction in its
//! relay log: every commit a client saw succeed survives the primary's death. Only the primary
//! has the master side of semi-sync on, so the promoted replica commits alone.

use std::time::Duration;

use anyhow::Context;
use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::{Connection as _, Row as _};

use super::MariaDb;

/// How long the pair gets for each step (the replica connecting, catching up, promotion).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// A primary and its GTID replica.
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::MariaDbPair;
///
/// let pair = MariaDbPair::start(true).await?;  // semi-synchronous
/// let url = pair.primary().fresh_database().await?;
/// // ... write through the primary ...
/// pair.crash_primary().await?;                  // SIGKILL
/// pair.promote_replica().await?;                // applies what it received, then writable
/// # let _ = url; Ok(()) }
/// ```
#[derive(Debug)]
pub struct MariaDbPair {
    primary: MariaDb,
    replica: MariaDb,
    semi_sync: bool,
}

impl MariaDbPair {
    /// Starts both servers, points the replica at the primary by GTID, and waits until it
    /// replicates (both replication threads running, semi-sync on when asked) and has applied
    /// everything the primary wrote.
    pub async fn start(semi_sync: bool) -> anyhow::Result<MariaDbPair> {
        let common = [
            "--log-slave-updates=ON",
            "--binlog-row-image=FULL",
            "--rpl-semi-sync-slave-enabled=ON",
        ];
        let mut primary_options: Vec<String> = common.iter().map(|s| (*s).to_owned()).collect();
        if semi_sync {
            primary_options.extend(
                [
                    "--rpl-semi-sync-master-enabled=ON",
                    "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
                    // Falls back to asynchronous only after this long without the replica.
                    "--rpl-semi-sync-master-timeout=60000",
                ]
                .map(str::to_owned),
            );
        }
        let mut replica_options: Vec<String> = common.iter().map(|s| (*s).to_owned()).collect();
        replica_options.push("--read-only=ON".to_owned());
        // Side by side: each `mariadb-install-db` takes seconds.
        let (primary, replica) = tokio::join!(
            MariaDb::start_with(1, primary_options),
            MariaDb::start_with(2, replica_options)
        );
        let primary = primary.context("starting the MariaDB primary")?;
        let replica = replica.context("starting the MariaDB replica")?;
        let pair = MariaDbPair {
            primary,
            replica,
            semi_sync,
        };
        // The primary's binlog holds everything since its first start (the system tables come
        // from each server's own install): the replica starts from its beginning.
        let mut conn = pair.connect_replica().await?;
        let change = format!(
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'root', \
             MASTER_PASSWORD = '', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
            pair.primary.port()
        );
        for sql in [
            "SET GLOBAL gtid_slave_pos = ''".to_owned(),
            change,
            "START SLAVE".to_owned(),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(&mut conn)
                .await
                .with_context(|| format!("on the replica: {sql}"))?;
        }
        conn.close().await.ok();
        pair.wait_replicating().await?;
        pair.wait_caught_up().await?;
        Ok(pair)
    }

    /// The primary (after [`crash_primary`](Self::crash_primary), a stopped server).
    pub fn primary(&self) -> &MariaDb {
        &self.primary
    }

    /// The replica (after [`promote_replica`](Self::promote_replica), the new primary).
    pub fn replica(&self) -> &MariaDb {
        &self.replica
    }

    /// Waits until the replica's IO and SQL threads run and, with semi-sync, the primary
    /// counts it as a semi-sync client with semi-sync on.
    pub async fn wait_replicating(&self) -> anyhow::Result<()> {
        let last = std::sync::Mutex::new(String::from("no slave status"));
        let ready = crate::wait::eventually(STEP_TIMEOUT, || async {
            let status = match self.slave_status().await {
                Ok(Some(status)) => status,
                Ok(None) => return false,
                Err(e) => {
                    *crate::lock(&last) = format!("{e:#}");
                    return false;
                }
            };
            *crate::lock(&last) = status.to_string();
            if !status.running() {
                return false;
            }
            !self.semi_sync || self.semi_sync_on().await
        })
        .await;
        let last = crate::lock(&last).clone();
        ready.with_context(|| {
            format!(
                "the replica on port {} does not replicate from the primary on port {}: {last}",
                self.replica.port(),
                self.primary.port()
            )
        })
    }

    /// Waits until the replica has applied every transaction in the primary's binlog so far.
    pub async fn wait_caught_up(&self) -> anyhow::Result<()> {
        let mut conn = MySqlConnection::connect(self.primary.url()).await?;
        let head: String = sqlx::query_scalar("SELECT CAST(@@gtid_binlog_pos AS CHAR)")
            .fetch_one(&mut conn)
            .await?;
        conn.close().await.ok();
        self.wait_applied(&head).await
    }

    /// Kills the primary with SIGKILL ([`MariaDb::kill`]) and waits until it is gone.
    pub async fn crash_primary(&self) -> anyhow::Result<()> {
        self.primary.kill().await
    }

    /// Promotes the replica as an operator (or a failover tool) does once the primary is dead:
    /// waits until it has applied everything its IO thread received (`Gtid_IO_Pos`), then
    /// `STOP SLAVE`, `RESET SLAVE ALL`, `read_only = OFF`.
    pub async fn promote_replica(&self) -> anyhow::Result<()> {
        let status = self
            .slave_status()
            .await?
            .context("the replica has no master configured")?;
        if !status.io_pos.is_empty() {
            self.wait_applied(&status.io_pos).await?;
        }
        let mut conn = self.connect_replica().await?;
        for sql in [
            "STOP SLAVE",
            "RESET SLAVE ALL",
            "SET GLOBAL read_only = OFF",
        ] {
            sqlx::raw_sql(sql)
                .execute(&mut conn)
                .await
                .with_context(|| format!("promoting the replica: {sql}"))?;
        }
        conn.close().await.ok();
        Ok(())
    }

    /// Waits until the replica's applied GTID position reaches `gtid` (`MASTER_GTID_WAIT`).
    async fn wait_applied(&self, gtid: &str) -> anyhow::Result<()> {
        if gtid.is_empty() {
            return Ok(());
        }
        let mut conn = self.connect_replica().await?;
        let waited: Option<i64> = sqlx::query_scalar("SELECT MASTER_GTID_WAIT(?, ?)")
            .bind(gtid)
            .bind(STEP_TIMEOUT.as_secs_f64())
            .fetch_one(&mut conn)
            .await
            .context("MASTER_GTID_WAIT on the replica")?;
        conn.close().await.ok();
        anyhow::ensure!(
            waited == Some(0),
            "the replica did not apply up to GTID {gtid} within {STEP_TIMEOUT:?} (status: {})",
            self.slave_status()
                .await
                .ok()
                .flatten()
                .map(|s| s.to_string())
                .unwrap_or_default()
        );
        Ok(())
    }

    async fn connect_replica(&self) -> anyhow::Result<MySqlConnection> {
        MySqlConnection::connect(self.replica.url())
            .await
            .with_context(|| format!("connecting to the replica {}", self.replica.url()))
    }

    /// `SHOW SLAVE STATUS` of the replica (`None` once it has no master).
    async fn slave_status(&self) -> anyhow::Result<Option<SlaveStatus>> {
        let mut conn = self.connect_replica().await?;
        let row: Option<MySqlRow> = sqlx::raw_sql("SHOW SLAVE STATUS")
            .fetch_optional(&mut conn)
            .await?;
        conn.close().await.ok();
        let Some(row) = row else {
            return Ok(None);
        };
        let text = |name: &str| -> String {
            row.try_get::<String, _>(name)
                .or_else(|_| {
                    row.try_get::<Vec<u8>, _>(name)
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                })
                .unwrap_or_default()
        };
        Ok(Some(SlaveStatus {
            io: text("Slave_IO_Running"),
            sql: text("Slave_SQL_Running"),
            io_pos: text("Gtid_IO_Pos"),
            last_error: [text("Last_IO_Error"), text("Last_SQL_Error")]
                .into_iter()
                .filter(|e| !e.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
        }))
    }

    /// True when the primary has semi-sync on with at least one semi-sync replica.
    async fn semi_sync_on(&self) -> bool {
        let Ok(mut conn) = MySqlConnection::connect(self.primary.url()).await else {
            return false;
        };
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT VARIABLE_NAME, CAST(VARIABLE_VALUE AS CHAR) FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME IN ('RPL_SEMI_SYNC_MASTER_STATUS', 'RPL_SEMI_SYNC_MASTER_CLIENTS')",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap_or_default();
        conn.close().await.ok();
        let value = |name: &str| {
            rows.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        value("RPL_SEMI_SYNC_MASTER_STATUS").eq_ignore_ascii_case("ON")
            && value("RPL_SEMI_SYNC_MASTER_CLIENTS")
                .parse::<u32>()
                .is_ok_and(|n| n >= 1)
    }
}

/// The part of `SHOW SLAVE STATUS` the pair looks at.
struct SlaveStatus {
    io: String,
    sql: String,
    io_pos: String,
    last_error: String,
}

impl SlaveStatus {
    fn running(&self) -> bool {
        self.io == "Yes" && self.sql == "Yes"
    }
}

impl std::fmt::Display for SlaveStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Slave_IO_Running {}, Slave_SQL_Running {}, Gtid_IO_Pos {}",
            self.io, self.sql, self.io_pos
        )?;
        if !self.last_error.is_empty() {
            write!(f, ", last error: {}", self.last_error)?;
        }
        Ok(())
    }
}
