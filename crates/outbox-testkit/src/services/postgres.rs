//! [`Postgres`]: a PostgreSQL server for tests on 127.0.0.1, with a fresh database per test.
//!
//! The server is configured for the relay's needs (`wal_level=logical` and replication slots
//! for CDC tests) and for speed (`fsync=off`; `synchronous_commit` stays on because turning it
//! off delays logical decoding).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::Context;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use super::methods::launcher;
use super::process;
use super::server::{Server, ServerSpec};

/// Environment variable with the admin URL of an existing server
/// (`postgres://postgres@127.0.0.1:PORT/postgres`) that [`Postgres::shared`] uses instead of
/// starting its own. `scripts/test.sh` sets it so a whole test run shares one server.
pub const DATABASE_URL_ENV: &str = "OUTBOX_TEST_DATABASE_URL";

launcher! {
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
    pub struct Postgres(Server<PostgresServer>), server named by DATABASE_URL_ENV;
    shared: "call [`Postgres::fresh_database`] for a database of your own";
    start_private: "stopped and its data removed";
    admin_url: "The URL of the `postgres` database as the `postgres` superuser."; stop: "A fast \
        shutdown: clients are disconnected, the data is kept."; restart: "with the same data",
        "it accepts connections";
}

/// A PostgreSQL server this process starts: its binary and directories.
#[derive(Debug)]
pub(crate) struct PostgresServer {
    /// The directory of `postgres`, `initdb`, `pg_ctl`, `pg_basebackup`.
    bin_dir: PathBuf,
    /// The `postgres` binary.
    bin: PathBuf,
    /// The server's directory, holding `data/`, the socket and `postgres.log`.
    root: PathBuf,
    /// `postgres` when we run as root (PostgreSQL refuses to run as root).
    run_as: Option<&'static str>,
    /// Settings (`name=value`) after the defaults of [`ServerSpec::args`], which they override.
    settings: Vec<String>,
}

impl Postgres {
    /// The URL of `database` on this server, as the admin user.
    pub fn url_for(&self, database: &str) -> String {
        with_database(self.admin_url(), database)
    }

    /// Creates a database with a unique name and returns its URL. Tests run in parallel on one
    /// server; each takes its own database.
    pub async fn fresh_database(&self) -> anyhow::Result<String> {
        let admin_url = self.admin_url();
        let name = format!("outbox_test_{}", uuid::Uuid::now_v7().simple());
        let mut conn = PgConnection::connect(admin_url)
            .await
            .with_context(|| format!("connecting to {admin_url}"))?;
        // `name` is built here from hex digits only: safe to splice.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .with_context(|| format!("creating database {name} on {admin_url}"))?;
        conn.close().await.ok();
        Ok(self.url_for(&name))
    }

    /// Crashes a private server as a power cut or `pg_ctl stop -m immediate` would: SIGQUIT
    /// to the postmaster, so no shutdown checkpoint runs and the next start replays the WAL
    /// (replication slots come back at their last checkpointed position). Waits until the
    /// server is gone; [`Postgres::restart`] starts it again. Refused for the shared server.
    pub async fn crash(&self) -> anyhow::Result<()> {
        let pid = process::pid_in(&self.0.private_root("crash")?.join("data/postmaster.pid"))?;
        process::signal("QUIT", &[pid])?;
        self.0.wait_exited("SIGQUIT").await
    }

    /// Kills a private server as a machine that dies would: SIGKILL to the postmaster and to
    /// every one of its processes at once, so no process finishes anything (no shutdown, no
    /// WAL sent to a standby, clients cut off). Waits until the postmaster is gone. Refused
    /// for the shared server.
    pub async fn kill(&self) -> anyhow::Result<()> {
        let pid = process::pid_in(&self.0.private_root("kill")?.join("data/postmaster.pid"))?;
        // Stopped first, the postmaster starts no backend between the listing of its
        // children and the kill (an orphan would live on, serving its client).
        process::signal("STOP", &[pid])?;
        let mut victims = vec![pid];
        victims.extend(process::children(pid));
        process::signal("KILL", &victims)?;
        self.0.wait_exited("SIGKILL").await
    }

    /// Turns TLS on for a private server with this certificate and key (copied into the data
    /// directory, owned by the server's user, mode 0600), by `ALTER SYSTEM` and a reload.
    /// Clients choose: plain connections keep working.
    pub async fn enable_tls(&self, cert: &Path, key: &Path) -> anyhow::Result<()> {
        let data = self.0.private_root("enable TLS")?.join("data");
        for (from, name) in [(cert, "server.crt"), (key, "server.key")] {
            let to = data.join(name);
            std::fs::copy(from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            if process::running_as_root() {
                let status = std::process::Command::new("chown")
                    .arg("postgres:")
                    .arg(&to)
                    .status()
                    .context("running chown")?;
                anyhow::ensure!(status.success(), "chown postgres {} failed", to.display());
            }
        }
        let mut conn = PgConnection::connect(self.admin_url()).await?;
        // Two statements: ALTER SYSTEM cannot run in the implicit transaction of a batch.
        for sql in ["ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()"] {
            sqlx::raw_sql(sql)
                .execute(&mut conn)
                .await
                .with_context(|| format!("turning ssl on: {sql}"))?;
        }
        // The reload is asynchronous: wait until a new session reports it.
        crate::wait::eventually(std::time::Duration::from_secs(30), || async {
            let Ok(mut c) = PgConnection::connect(self.admin_url()).await else {
                return false;
            };
            sqlx::query_scalar::<_, String>("SHOW ssl")
                .fetch_one(&mut c)
                .await
                .is_ok_and(|v| v == "on")
        })
        .await
        .context("PostgreSQL did not turn ssl on")
    }

    /// The server's log file (`None` for an external server).
    pub fn log_path(&self) -> Option<PathBuf> {
        self.0.log_path()
    }

    /// A private server whose directory `prepare` makes (from [`PostgresServer::new`]: an
    /// `initdb`, a `pg_basebackup`), started on a free port like [`Postgres::start_private`].
    pub(crate) async fn launch_with(
        prepare: impl FnOnce(&Path) -> anyhow::Result<PostgresServer>,
    ) -> anyhow::Result<Postgres> {
        Server::launch(true, prepare).await.map(Postgres)
    }

    /// What the launcher made of a private server: its binaries and user.
    pub(crate) fn server(&self) -> anyhow::Result<&PostgresServer> {
        self.0
            .spec()
            .context("an external PostgreSQL server has no local binaries")
    }
}

impl ServerSpec for PostgresServer {
    const NAME: &'static str = "postgres";
    const LABEL: &'static str = "PostgreSQL";
    const SHARED: &'static str = "a shared PostgreSQL server";
    const START_PRIVATE: &'static str = "Postgres::start_private()";
    const DIR_PREFIX: &'static str = "outbox-pg-";
    const URL_ENV: &'static str = DATABASE_URL_ENV;
    /// Fast shutdown: disconnect clients, checkpoint, exit.
    const STOP_SIGNAL: &'static str = "INT";

    /// Finds the binaries and runs `initdb` into `root/data`, as the `postgres` user when we
    /// are root.
    fn setup(root: &Path) -> anyhow::Result<Self> {
        let server = PostgresServer::new(root, Vec::new())?;
        server.initdb()?;
        Ok(server)
    }

    fn url(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }

    fn external_port(url: &str) -> anyhow::Result<u16> {
        let options = PgConnectOptions::from_str(url)
            .with_context(|| format!("{DATABASE_URL_ENV}={url} is not a PostgreSQL URL"))?;
        Ok(options.get_port())
    }

    async fn probe(url: &str, _port: u16) -> anyhow::Result<()> {
        let conn = PgConnection::connect(url).await?;
        conn.close().await.ok();
        Ok(())
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn args(&self, port: u16) -> Vec<OsString> {
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
        let settings = settings
            .into_iter()
            .chain(self.settings.iter().map(String::as_str));
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
        args
    }

    fn run_as(&self) -> Option<&'static str> {
        self.run_as
    }
}

impl PostgresServer {
    /// Finds the binaries and gives `root` to the server's user (when we are root); the data
    /// directory `root/data` is still to be made. `settings` (`name=value`) are passed to every
    /// start after the defaults.
    pub(crate) fn new(root: &Path, settings: Vec<String>) -> anyhow::Result<Self> {
        let bin_dir = bin_dir()?;
        let run_as = process::running_as_root().then_some("postgres");
        if let Some(user) = run_as {
            run(
                std::process::Command::new("chown")
                    .arg(format!("{user}:"))
                    .arg(root),
                root,
            )
            .context("giving the data directory to the `postgres` user")?;
        }
        Ok(PostgresServer {
            bin: bin_dir.join("postgres"),
            bin_dir,
            root: root.to_owned(),
            run_as,
            settings,
        })
    }

    /// `initdb` into the data directory (superuser `postgres`, trust authentication).
    pub(crate) fn initdb(&self) -> anyhow::Result<()> {
        let mut initdb = self.tool("initdb");
        initdb.arg("-D").arg(self.data()).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]);
        self.run(&mut initdb).context("initdb failed")
    }

    /// The data directory.
    pub(crate) fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// A command running the PostgreSQL program `name` (`pg_ctl`, `pg_basebackup`) of the
    /// server's installation as the server's user.
    pub(crate) fn tool(&self, name: &str) -> std::process::Command {
        self.command(&self.bin_dir.join(name))
    }

    /// Runs a short command in the server's directory; on failure the error carries its
    /// output.
    pub(crate) fn run(&self, cmd: &mut std::process::Command) -> anyhow::Result<()> {
        run(cmd, &self.root)
    }

    /// A command running `program` as the server's user.
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
