//! [`Postgres`]: a PostgreSQL server for tests on 127.0.0.1, with a fresh database per test.
//!
//! The server is configured for the relay's needs (`wal_level=logical` and replication slots
//! for CDC tests) and for speed (`fsync=off`; `synchronous_commit` stays on because turning it
//! off delays logical decoding).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::OnceCell;

use super::process::{self, Launch, Supervised};
use crate::lock;

/// Environment variable with the admin URL of an existing server
/// (`postgres://postgres@127.0.0.1:PORT/postgres`) that [`Postgres::shared`] uses instead of
/// starting its own. `scripts/test.sh` sets it so a whole test run shares one server.
pub const DATABASE_URL_ENV: &str = "OUTBOX_TEST_DATABASE_URL";

/// How long a server gets to accept connections after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Attempts at finding a free port when another process takes ours first.
const PORT_ATTEMPTS: usize = 3;

static SHARED: OnceCell<Postgres> = OnceCell::const_new();

/// A PostgreSQL server for tests: either one started by this process from the installed
/// binaries, or an existing one named by [`DATABASE_URL_ENV`].
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::Postgres;
///
/// let pg = Postgres::shared().await?;
/// let url = pg.fresh_database().await?; // a new, empty database for this test
/// let pool = sqlx::PgPool::connect(&url).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Postgres {
    admin_url: String,
    port: u16,
    local: Option<Local>,
}

/// A server this process started.
#[derive(Debug)]
struct Local {
    /// Owned by the value (`start_private`): may be stopped and restarted, removed on drop.
    private: bool,
    bin_dir: PathBuf,
    /// Temporary directory holding `data/`, the socket and `postgres.log`.
    root: PathBuf,
    /// Removes `root` on drop (private servers); the shared server's watchdog removes it.
    _dir: Option<tempfile::TempDir>,
    /// `postgres` when we run as root (PostgreSQL refuses to run as root).
    run_as: Option<&'static str>,
    server: Mutex<Option<Supervised>>,
}

impl Postgres {
    /// The server shared by every test of this process: the one named by
    /// [`DATABASE_URL_ENV`] when it is set, otherwise a private server started on first use
    /// that stops when the process exits (also when it is killed).
    ///
    /// Call [`Postgres::fresh_database`] for a database of your own; never stop it.
    pub async fn shared() -> anyhow::Result<&'static Postgres> {
        SHARED
            .get_or_try_init(|| async {
                match std::env::var(DATABASE_URL_ENV) {
                    Ok(url) if !url.trim().is_empty() => {
                        Self::external(url.trim().to_owned()).await
                    }
                    _ => Self::launch(false).await,
                }
            })
            .await
    }

    /// A server owned by the returned value, for tests that stop and restart the database.
    /// It is stopped and its data removed when the value is dropped.
    pub async fn start_private() -> anyhow::Result<Postgres> {
        Self::launch(true).await
    }

    /// The URL of the `postgres` database as the `postgres` superuser.
    pub fn admin_url(&self) -> &str {
        &self.admin_url
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `database` on this server, as the admin user.
    pub fn url_for(&self, database: &str) -> String {
        with_database(&self.admin_url, database)
    }

    /// Creates a database with a unique name and returns its URL. Tests run in parallel on one
    /// server; each takes its own database.
    pub async fn fresh_database(&self) -> anyhow::Result<String> {
        let name = format!("outbox_test_{}", uuid::Uuid::now_v7().simple());
        let mut conn = PgConnection::connect(&self.admin_url)
            .await
            .with_context(|| format!("connecting to {}", self.admin_url))?;
        // `name` is built here from hex digits only: safe to splice.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .with_context(|| format!("creating database {name} on {}", self.admin_url))?;
        conn.close().await.ok();
        Ok(self.url_for(&name))
    }

    /// Stops a private server with a fast shutdown (clients are disconnected, the data is
    /// kept). Refused for the shared server and for an external one.
    pub async fn stop(&self) -> anyhow::Result<()> {
        let local = self.private_local("stop")?;
        let server = lock(&local.server).take();
        match server {
            Some(server) => server.stop().await,
            None => Ok(()),
        }
    }

    /// Starts a private server again on the same port with the same data, stopping it first
    /// if it is running, and waits until it accepts connections.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await?;
        let local = self.private_local("restart")?;
        let server = local.spawn(self.port)?;
        let server = wait_ready(&self.admin_url, server).await?;
        *lock(&local.server) = Some(server);
        Ok(())
    }

    /// True while a server this process started is running (always true for an external one).
    pub fn is_running(&self) -> bool {
        match &self.local {
            Some(local) => lock(&local.server)
                .as_mut()
                .is_some_and(|s| s.exited().is_none()),
            None => true,
        }
    }

    /// The server's log file (`None` for an external server).
    pub fn log_path(&self) -> Option<PathBuf> {
        self.local.as_ref().map(|l| l.root.join("postgres.log"))
    }

    fn private_local(&self, what: &str) -> anyhow::Result<&Local> {
        match &self.local {
            Some(local) if local.private => Ok(local),
            _ => anyhow::bail!(
                "cannot {what} a shared PostgreSQL server (other tests use it); use Postgres::start_private()"
            ),
        }
    }

    async fn external(url: String) -> anyhow::Result<Postgres> {
        let options = PgConnectOptions::from_str(&url)
            .with_context(|| format!("{DATABASE_URL_ENV}={url} is not a PostgreSQL URL"))?;
        let port = options.get_port();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match options.connect().await {
                Ok(conn) => {
                    conn.close().await.ok();
                    break;
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(anyhow::Error::new(e).context(format!(
                        "{DATABASE_URL_ENV}={url}: server not reachable (unset it to let the tests start their own)"
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(Postgres {
            admin_url: url,
            port,
            local: None,
        })
    }

    async fn launch(private: bool) -> anyhow::Result<Postgres> {
        let bin_dir = bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-pg-")
            .tempdir()
            .context("creating a temporary directory for PostgreSQL")?;
        let root = dir.path().to_owned();
        let run_as = process::running_as_root().then_some("postgres");
        if let Some(user) = run_as {
            run(
                std::process::Command::new("chown")
                    .arg(format!("{user}:"))
                    .arg(&root),
                &root,
            )
            .context("giving the data directory to the `postgres` user")?;
        }
        let mut local = Local {
            private,
            bin_dir,
            root,
            _dir: None,
            run_as,
            server: Mutex::new(None),
        };
        local.initdb()?;

        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = process::free_port()?;
            let admin_url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
            let server = local.spawn(port)?;
            match wait_ready(&admin_url, server).await {
                Ok(server) => {
                    *lock(&local.server) = Some(server);
                    if private {
                        local._dir = Some(dir);
                    } else {
                        // The shared server is never dropped: its watchdog removes the
                        // directory when the process exits. (On failure `dir` removes it.)
                        let _ = dir.keep();
                    }
                    return Ok(Postgres {
                        admin_url,
                        port,
                        local: Some(local),
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && process::port_was_taken(&local.log()) => {
                    tracing::debug!(port, error = %e, "port taken; retrying PostgreSQL on another");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Local {
    fn log(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// `initdb` into `root/data`, as the `postgres` user when we are root.
    fn initdb(&self) -> anyhow::Result<()> {
        let mut cmd = self.command(&self.bin_dir.join("initdb"));
        cmd.arg("-D").arg(self.data()).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        run(&mut cmd, &self.root).context("initdb failed")
    }

    fn command(&self, program: &Path) -> std::process::Command {
        match self.run_as {
            Some(user) => {
                let mut cmd = std::process::Command::new("setpriv");
                cmd.arg(format!("--reuid={user}"))
                    .arg(format!("--regid={user}"))
                    .arg("--init-groups")
                    .arg("--")
                    .arg(program);
                cmd
            }
            None => std::process::Command::new(program),
        }
    }

    fn spawn(&self, port: u16) -> anyhow::Result<Supervised> {
        let settings = [
            "listen_addresses=127.0.0.1",
            "wal_level=logical",
            "max_replication_slots=20",
            "max_wal_senders=20",
            "fsync=off",
            "full_page_writes=off",
            "max_connections=200",
            "shared_buffers=128MB",
        ];
        let mut args = vec![
            "-D".into(),
            self.data().into_os_string(),
            "-p".into(),
            port.to_string().into(),
        ];
        args.extend(["-k".into(), self.root.clone().into_os_string()]);
        for s in settings {
            args.extend(["-c".into(), s.into()]);
        }
        Supervised::spawn(Launch {
            name: "postgres",
            program: &self.bin_dir.join("postgres"),
            args,
            run_as: self.run_as,
            stop_signal: "INT", // fast shutdown: disconnect clients, checkpoint, exit
            cleanup: Some(&self.root),
            log: &self.log(),
            cwd: &self.root,
        })
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(local) = &self.local
            && let Some(mut server) = lock(&local.server).take()
        {
            server.stop_blocking();
        }
    }
}

/// Polls until the server accepts connections, failing early (with its log) if it exits.
async fn wait_ready(admin_url: &str, mut server: Supervised) -> anyhow::Result<Supervised> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let last_error = match PgConnection::connect(admin_url).await {
            Ok(conn) => {
                conn.close().await.ok();
                return Ok(server);
            }
            Err(e) => e,
        };
        if let Some(status) = server.exited() {
            anyhow::bail!(
                "PostgreSQL exited ({status}) before accepting connections on {admin_url}\n{}",
                server.log_tail()
            );
        }
        if Instant::now() >= deadline {
            let tail = server.log_tail();
            server.stop().await.ok();
            anyhow::bail!(
                "PostgreSQL did not accept connections on {admin_url} within {READY_TIMEOUT:?} (last error: {last_error})\n{tail}"
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The directory with `initdb` and `postgres`: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian keeps them out of `PATH`), else `PATH`.
fn bin_dir() -> anyhow::Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Ok(out) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_server(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    if let Some(dir) = process::find_program("initdb").and_then(|p| p.parent().map(Path::to_owned))
        && has_server(&dir)
    {
        return Ok(dir);
    }
    anyhow::bail!(
        "PostgreSQL server binaries (initdb, postgres) not found via `pg_config --bindir`, \
         /usr/lib/postgresql/*/bin or PATH: install them (`apt-get install -y postgresql`, or run \
         scripts/test.sh), or set {DATABASE_URL_ENV} to an existing server"
    )
}

/// Runs a short command to completion; on failure the error carries its output.
fn run(cmd: &mut std::process::Command, cwd: &Path) -> anyhow::Result<()> {
    let out = cmd
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?} failed ({})\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `url` with its database (path) replaced by `database`, keeping any query string.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(i) => &base[..authority_start + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn database_is_replaced_and_query_kept() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
            "postgres://postgres@127.0.0.1:5432/t1"
        );
        assert_eq!(
            with_database("postgres://u:p@h:1", "t1"),
            "postgres://u:p@h:1/t1"
        );
        assert_eq!(
            with_database("postgres://h/db?sslmode=disable", "t1"),
            "postgres://h/t1?sslmode=disable"
        );
    }
}
