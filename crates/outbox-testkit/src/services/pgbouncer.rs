//! [`PgBouncer`]: a PgBouncer in transaction pooling mode on 127.0.0.1, in front of a test
//! PostgreSQL, with a small server pool so that clients really share server connections.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use sqlx::Connection;

use super::process::{self, Launch, Supervised};

/// A PgBouncer this test started (stopped on drop).
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::{PgBouncer, Postgres};
///
/// let pg = Postgres::shared().await?;
/// let direct = pg.fresh_database().await?;
/// let bouncer = PgBouncer::start(&direct, 4).await?; // transaction mode, 4 server connections
/// let pooled = bouncer.url();                         // same database, through PgBouncer
/// # let _ = pooled; Ok(()) }
/// ```
#[derive(Debug)]
pub struct PgBouncer {
    url: String,
    server: Option<Supervised>,
    _dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer (`pool_mode = transaction`, at most `server_connections` connections
    /// to the server) in front of the database of `direct_url`
    /// (`postgres://USER@127.0.0.1:PORT/DB`, trust authentication), and waits until a client
    /// can run a query through it.
    pub async fn start(direct_url: &str, server_connections: u32) -> anyhow::Result<PgBouncer> {
        let program = process::find_program("pgbouncer").context(
            "`pgbouncer` not found in PATH or /usr/sbin: install it (`apt-get install -y pgbouncer`, \
             or run scripts/test.sh)",
        )?;
        let (user, host, upstream_port, database) = parse(direct_url)
            .with_context(|| format!("expected postgres://USER@HOST:PORT/DB, got {direct_url}"))?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-pgbouncer-")
            .tempdir()?;
        let run_as = process::running_as_root().then_some("postgres");
        let port = process::free_port()?;
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            dir.path().join("userlist.txt"),
            format!("\"{user}\" \"\"\n"),
        )?;
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 {database} = host={host} port={upstream_port} dbname={database}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {dir}/userlist.txt\n\
                 pool_mode = transaction\n\
                 default_pool_size = {server_connections}\n\
                 max_client_conn = 200\n\
                 server_reset_query =\n\
                 logfile = {dir}/pgbouncer.log\n\
                 pidfile = {dir}/pgbouncer.pid\n",
                dir = dir.path().display()
            ),
        )?;
        if let Some(user) = run_as {
            let status = std::process::Command::new("chown")
                .arg("-R")
                .arg(format!("{user}:"))
                .arg(dir.path())
                .status()?;
            anyhow::ensure!(status.success(), "chown of the PgBouncer directory failed");
        }
        let log: PathBuf = dir.path().join("stdout.log");
        let mut server = Supervised::spawn(Launch {
            name: "pgbouncer",
            program: &program,
            args: vec![OsString::from(&ini)],
            run_as,
            stop_signal: "INT",
            cleanup: None,
            log: &log,
            cwd: dir.path(),
        })?;
        let url = format!("postgres://{user}@127.0.0.1:{port}/{database}");
        let ready = super::server::poll(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async {
                // Default sqlx options send extra_float_digits, which a strict PgBouncer refuses.
                let options: sqlx::postgres::PgConnectOptions = url.parse()?;
                let mut conn =
                    sqlx::PgConnection::connect_with(&options.extra_float_digits(None)).await?;
                sqlx::query("SELECT 1")
                    .persistent(false)
                    .execute(&mut conn)
                    .await?;
                conn.close().await?;
                anyhow::Ok(())
            },
        )
        .await;
        if let Err(e) = ready {
            let tail = process::log_tail(&dir.path().join("pgbouncer.log"), 20);
            let exited = server.exited();
            server.stop().await.ok();
            anyhow::bail!("PgBouncer not ready on {url} (exited: {exited:?}): {e:#}\n{tail}");
        }
        Ok(PgBouncer {
            url,
            server: Some(server),
            _dir: dir,
        })
    }

    /// `postgres://USER@127.0.0.1:PORT/DB`: the database, through PgBouncer.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// (user, host, port, database) of `postgres://USER@HOST:PORT/DB[?...]`.
fn parse(url: &str) -> Option<(String, String, u16, String)> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let rest = rest.split('?').next()?;
    let (user, rest) = rest.split_once('@')?;
    let (host_port, database) = rest.split_once('/')?;
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (host_port, 5432),
    };
    (!user.contains(':')).then(|| (user.to_owned(), host.to_owned(), port, database.to_owned()))
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.stop_blocking();
        }
    }
}
