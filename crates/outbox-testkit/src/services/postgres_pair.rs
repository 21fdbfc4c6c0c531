//! [`PostgresPair`]: a PostgreSQL primary with a streaming standby on 127.0.0.1, for failover
//! tests: crash the primary, promote the standby.
//!
//! Both servers are private [`Postgres`] servers (free ports, temporary directories, removed on
//! drop, stopped with the test process). The primary is made by `initdb`; the standby by
//! `pg_basebackup -R` from it, streaming under the name [`STANDBY_NAME`]. With
//! `synchronous = true` the primary lists it in `synchronous_standby_names`, so a commit returns
//! only once the standby has flushed it: every commit a client saw succeed survives the
//! primary's death. The standby's own configuration never names a synchronous standby, so once
//! promoted it commits alone.

use std::time::Duration;

use anyhow::Context;
use sqlx::Connection;
use sqlx::postgres::PgConnection;

use super::Postgres;
use super::postgres::PostgresServer;

/// The standby's `application_name` on the primary (`pg_stat_replication`,
/// `synchronous_standby_names`).
pub const STANDBY_NAME: &str = "standby";

/// How long the pair gets for each step (streaming, catching up, promotion) on a busy machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of both servers (after [`Postgres`]'s defaults: `wal_level=logical`, slots and WAL
/// senders). Each can be a primary. `full_page_writes` back on: a base backup and a standby's
/// recovery rely on it.
const SETTINGS: [&str; 3] = [
    "hot_standby=on",
    "full_page_writes=on",
    "wal_keep_size=256MB",
];

/// A primary and its streaming standby.
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::PostgresPair;
///
/// let pair = PostgresPair::start(true).await?; // synchronous standby
/// let url = pair.primary().fresh_database().await?;
/// // ... write through the primary ...
/// pair.crash_primary().await?;    // SIGKILL, as a dead machine
/// pair.promote_standby().await?;  // pg_ctl promote, then writable
/// let same_database = pair.standby().url_for(url.rsplit('/').next().unwrap_or_default());
/// # let _ = same_database; Ok(()) }
/// ```
#[derive(Debug)]
pub struct PostgresPair {
    primary: Postgres,
    standby: Postgres,
    synchronous: bool,
}

impl PostgresPair {
    /// Starts the primary, makes the standby from a base backup of it, starts it, and waits
    /// until it streams (and, with `synchronous`, until the primary counts it as its
    /// synchronous standby).
    pub async fn start(synchronous: bool) -> anyhow::Result<PostgresPair> {
        let settings = || SETTINGS.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let primary = Postgres::launch_with(|root| {
            let server = PostgresServer::new(root, settings())?;
            server.initdb()?;
            Ok(server)
        })
        .await
        .context("starting the primary")?;
        let primary_port = primary.port();
        let standby = Postgres::launch_with(|root| {
            let server = PostgresServer::new(root, settings())?;
            let mut backup = server.tool("pg_basebackup");
            backup
                .args(["-h", "127.0.0.1", "-p", &primary_port.to_string()])
                .args(["-U", "postgres", "-D"])
                .arg(server.data())
                .args(["-X", "stream", "-R", "-c", "fast", "--no-sync"]);
            server
                .run(&mut backup)
                .context("pg_basebackup of the primary failed")?;
            // `-R` wrote a primary_conninfo without a name; the last line wins.
            let auto_conf = server.data().join("postgresql.auto.conf");
            let mut conf = std::fs::read_to_string(&auto_conf)
                .with_context(|| format!("reading {}", auto_conf.display()))?;
            conf.push_str(&format!(
                "primary_conninfo = 'host=127.0.0.1 port={primary_port} user=postgres application_name={STANDBY_NAME}'\n"
            ));
            std::fs::write(&auto_conf, conf)
                .with_context(|| format!("writing {}", auto_conf.display()))?;
            Ok(server)
        })
        .await
        .context("starting the standby")?;
        let pair = PostgresPair {
            primary,
            standby,
            synchronous,
        };
        pair.wait_for_standby(false).await?;
        if synchronous {
            // Set only now, on the primary alone: before the standby streamed, every commit
            // would wait for it; and a base backup would copy the setting to the standby.
            let mut conn = pair.connect_primary().await?;
            for sql in [
                format!("ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'"),
                "SELECT pg_reload_conf()".to_owned(),
            ] {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                    .execute(&mut conn)
                    .await
                    .with_context(|| format!("on the primary: {sql}"))?;
            }
            conn.close().await.ok();
            pair.wait_for_standby(true).await?;
        }
        Ok(pair)
    }

    /// The primary (after [`crash_primary`](Self::crash_primary), a stopped server).
    pub fn primary(&self) -> &Postgres {
        &self.primary
    }

    /// The standby (after [`promote_standby`](Self::promote_standby), the new primary).
    pub fn standby(&self) -> &Postgres {
        &self.standby
    }

    /// True when the primary waits for the standby at every commit.
    pub fn is_synchronous(&self) -> bool {
        self.synchronous
    }

    /// Waits until the primary shows the standby in `pg_stat_replication` with state
    /// `streaming` (and `sync_state = 'sync'` once the pair is synchronous).
    pub async fn wait_streaming(&self) -> anyhow::Result<()> {
        self.wait_for_standby(self.synchronous).await
    }

    async fn wait_for_standby(&self, sync: bool) -> anyhow::Result<()> {
        let last = std::sync::Mutex::new(String::from("no walsender for the standby"));
        let ready = crate::wait::eventually(STEP_TIMEOUT, || async {
            let Ok(mut conn) = self.connect_primary().await else {
                return false;
            };
            let row: Option<(String, String)> = sqlx::query_as(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
            )
            .bind(STANDBY_NAME)
            .fetch_optional(&mut conn)
            .await
            .ok()
            .flatten();
            conn.close().await.ok();
            let Some((state, sync_state)) = row else {
                return false;
            };
            *crate::lock(&last) = format!("state {state}, sync_state {sync_state}");
            state == "streaming" && (!sync || sync_state == "sync")
        })
        .await;
        let last = crate::lock(&last).clone();
        ready.with_context(|| {
            format!(
                "the standby on port {} never streamed from the primary on port {} ({last})",
                self.standby.port(),
                self.primary.port()
            )
        })
    }

    /// Waits until the standby has replayed everything the primary has written so far.
    pub async fn wait_caught_up(&self) -> anyhow::Result<()> {
        let mut conn = self.connect_primary().await?;
        let target: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut conn)
            .await?;
        conn.close().await.ok();
        crate::wait::eventually(STEP_TIMEOUT, || async {
            let Ok(mut conn) = PgConnection::connect(self.standby.admin_url()).await else {
                return false;
            };
            let replayed: Option<bool> =
                sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
                    .bind(&target)
                    .fetch_one(&mut conn)
                    .await
                    .ok()
                    .flatten();
            conn.close().await.ok();
            replayed == Some(true)
        })
        .await
        .with_context(|| format!("the standby did not replay the primary's WAL up to {target}"))
    }

    /// Kills the primary as a dead machine: SIGKILL to the postmaster and all its processes
    /// at once ([`Postgres::kill`]). Waits until it is gone.
    pub async fn crash_primary(&self) -> anyhow::Result<()> {
        self.primary.kill().await
    }

    /// Promotes the standby (`pg_ctl promote`) and waits until it accepts writes
    /// (`pg_is_in_recovery()` is false).
    pub async fn promote_standby(&self) -> anyhow::Result<()> {
        let server = self.standby.server()?;
        let mut promote = server.tool("pg_ctl");
        promote.arg("promote").arg("-D").arg(server.data()).args([
            "-w",
            "-t",
            &STEP_TIMEOUT.as_secs().to_string(),
        ]);
        server.run(&mut promote).context("pg_ctl promote failed")?;
        crate::wait::eventually(STEP_TIMEOUT, || async {
            let Ok(mut conn) = PgConnection::connect(self.standby.admin_url()).await else {
                return false;
            };
            let recovering: Option<bool> = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await
                .ok();
            conn.close().await.ok();
            recovering == Some(false)
        })
        .await
        .context("the standby still is in recovery after pg_ctl promote")
    }

    async fn connect_primary(&self) -> anyhow::Result<PgConnection> {
        PgConnection::connect(self.primary.admin_url())
            .await
            .with_context(|| format!("connecting to the primary {}", self.primary.admin_url()))
    }
}
