//! [`MariaDb`]: a MariaDB (MySQL-compatible) server for tests on 127.0.0.1, with a fresh
//! database per test.
//!
//! A started server gets its own data directory (`mariadb-install-db`, root without a
//! password over TCP) and listens on 127.0.0.1 only.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use sqlx::Connection as _;
use sqlx::mysql::MySqlConnection;

use super::methods::launcher;
use super::process;
use super::server::{Server, ServerSpec};

/// Environment variable with the URL of an existing server as a user that may create
/// databases (`mysql://root@127.0.0.1:PORT`) that [`MariaDb::shared`] uses instead of starting
/// its own. `scripts/test.sh` sets it so a whole test run shares one server.
pub const MYSQL_URL_ENV: &str = "OUTBOX_TEST_MYSQL_URL";

launcher! {
    /// A MariaDB server: either one started by this process from the installed binaries, or an
    /// existing one (MariaDB or MySQL) named by [`MYSQL_URL_ENV`].
    ///
    /// ```no_run
    /// # async fn example() -> anyhow::Result<()> {
    /// use outbox_testkit::services::MariaDb;
    ///
    /// let url = MariaDb::shared().await?.fresh_database().await?;
    /// let pool = sqlx::MySqlPool::connect(&url).await?;
    /// # Ok(()) }
    /// ```
    pub struct MariaDb(Server<MariaDbServer>), server named by MYSQL_URL_ENV;
    shared: "take a [`MariaDb::fresh_database`] of your own"; start: "stopped and its data removed";
    url: "`mysql://root@127.0.0.1:PORT` (no database)."; stop: "Clients are disconnected; the data \
        is kept."; restart: "with the same data", "it answers `SELECT 1`";
}

/// A `mariadbd` this process starts.
#[derive(Debug)]
struct MariaDbServer {
    bin: PathBuf,
    root: PathBuf,
    /// `--server-id` (1 unless a replication set chooses).
    server_id: u32,
    /// Options after the defaults (`--log-slave-updates`, `--read-only`, ...).
    extra: Vec<String>,
}

impl MariaDb {
    /// Creates a database with a unique name and returns its URL.
    pub async fn fresh_database(&self) -> anyhow::Result<String> {
        let name = format!("outbox_test_{}", uuid::Uuid::now_v7().simple());
        let mut conn = MySqlConnection::connect(self.url())
            .await
            .with_context(|| format!("connecting to {}", self.url()))?;
        // `name` is built here from hex digits only: safe to splice.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .with_context(|| format!("creating database {name}"))?;
        conn.close().await.ok();
        Ok(format!("{}/{name}", self.url().trim_end_matches('/')))
    }

    /// Turns TLS on for a private server: installs `cert` and `key` (PEM) and restarts it,
    /// which then accepts TLS on its port (plain connections too, unless a user is created
    /// `REQUIRE SSL`). The server's certificate and key are read only at start in MariaDB.
    pub async fn enable_tls(&self, cert: &Path, key: &Path) -> anyhow::Result<()> {
        let dir = self.0.private_root("enable TLS")?.join(TLS_DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (from, name) in [(cert, TLS_CERT), (key, TLS_KEY)] {
            let to = dir.join(name);
            std::fs::copy(from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        self.restart().await?;
        let mut conn = MySqlConnection::connect(self.url()).await?;
        let have: String = sqlx::query_scalar("SELECT CAST(@@have_ssl AS CHAR)")
            .fetch_one(&mut conn)
            .await?;
        anyhow::ensure!(
            have == "YES",
            "MariaDB did not turn TLS on (have_ssl = {have})"
        );
        conn.close().await.ok();
        Ok(())
    }
}

impl MariaDb {
    /// Replaces the certificate and key of a private server with TLS on
    /// ([`enable_tls`](Self::enable_tls)) without a restart (`FLUSH SSL`): new connections get
    /// the new certificate, open ones keep theirs.
    pub async fn replace_tls(&self, cert: &Path, key: &Path) -> anyhow::Result<()> {
        let dir = self.0.private_root("replace TLS")?.join(TLS_DIR);
        anyhow::ensure!(
            dir.join(TLS_CERT).exists(),
            "TLS is not on: call enable_tls first"
        );
        for (from, name) in [(cert, TLS_CERT), (key, TLS_KEY)] {
            let to = dir.join(name);
            std::fs::copy(from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        let mut conn = MySqlConnection::connect(self.url()).await?;
        sqlx::raw_sql("FLUSH SSL")
            .execute(&mut conn)
            .await
            .context("FLUSH SSL")?;
        conn.close().await.ok();
        Ok(())
    }
}

impl MariaDb {
    /// A private server with `server_id` and the options `extra` after the defaults (a
    /// replication set's members), started like [`MariaDb::start`].
    pub(crate) async fn start_with(server_id: u32, extra: Vec<String>) -> anyhow::Result<MariaDb> {
        Server::launch(true, |root| {
            let mut server = MariaDbServer::setup(root)?;
            server.server_id = server_id;
            server.extra = extra;
            Ok(server)
        })
        .await
        .map(MariaDb)
    }

    /// Kills a private server with SIGKILL, as a power cut or the OOM killer would (InnoDB
    /// recovers at the next start), and waits until it is gone. Refused for the shared
    /// server.
    pub async fn kill(&self) -> anyhow::Result<()> {
        let pid = process::pid_in(&self.0.private_root("kill")?.join("mariadb.pid"))?;
        process::signal("KILL", &[pid])?;
        self.0.wait_exited("SIGKILL").await
    }
}

/// Where [`MariaDb::enable_tls`] puts the certificate and key, under the server's root.
const TLS_DIR: &str = "tls";
const TLS_CERT: &str = "server.pem";
const TLS_KEY: &str = "server.key";

impl ServerSpec for MariaDbServer {
    const NAME: &'static str = "mariadbd";
    const LABEL: &'static str = "MariaDB";
    const SHARED: &'static str = "the shared MariaDB server";
    const START_PRIVATE: &'static str = "MariaDb::start()";
    const DIR_PREFIX: &'static str = "outbox-mariadb-";
    const URL_ENV: &'static str = MYSQL_URL_ENV;
    const DEFAULT_PORT: Option<u16> = Some(3306);

    /// Finds `mariadbd` and creates the data directory with `mariadb-install-db`.
    fn setup(root: &Path) -> anyhow::Result<Self> {
        let hint = "install MariaDB (`apt-get install -y mariadb-server`, or run scripts/test.sh), \
                    or set OUTBOX_TEST_MYSQL_URL to an existing server";
        let bin = process::find_program("mariadbd")
            .with_context(|| format!("`mariadbd` not found in PATH or /usr/sbin: {hint}"))?;
        let install = process::find_program("mariadb-install-db")
            .with_context(|| format!("`mariadb-install-db` not found: {hint}"))?;
        let data = root.join("data");
        // Its own temporary directory: in a shared /tmp, a bootstrap's temporary tables were
        // seen vanishing under load ("Error on delete of '/tmp/#sql-temptable-…'").
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&tmp).context("creating MariaDB's tmpdir")?;
        let output = std::process::Command::new(install)
            .arg("--no-defaults")
            .arg(format!("--user={}", current_user()))
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .context("running mariadb-install-db")?;
        anyhow::ensure!(
            output.status.success(),
            "mariadb-install-db failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(Self {
            bin,
            root: root.to_owned(),
            server_id: 1,
            extra: Vec::new(),
        })
    }

    fn url(port: u16) -> String {
        format!("mysql://root@127.0.0.1:{port}")
    }

    async fn probe(url: &str, _port: u16) -> anyhow::Result<()> {
        let mut conn = MySqlConnection::connect(url).await?;
        sqlx::query("SELECT 1").execute(&mut conn).await?;
        conn.close().await.ok();
        Ok(())
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn args(&self, port: u16) -> Vec<OsString> {
        let path = |name: &str| self.root.join(name).into_os_string();
        let mut args: Vec<OsString> = vec![
            "--no-defaults".into(),
            format!("--user={}", current_user()).into(),
            "--bind-address=127.0.0.1".into(),
            format!("--port={port}").into(),
            "--skip-name-resolve".into(),
            // Tests want speed, not durability across power cuts.
            "--innodb-flush-log-at-trx-commit=2".into(),
            "--max-connections=500".into(),
            // A row-based binlog, as scripts/services.sh starts it: the CDC source reads it.
            "--binlog-format=ROW".into(),
            format!("--server-id={}", self.server_id).into(),
        ];
        for (flag, name) in [
            ("--log-bin=", "data/binlog"),
            ("--datadir=", "data"),
            ("--socket=", "mariadb.sock"),
            ("--pid-file=", "mariadb.pid"),
            ("--tmpdir=", "tmp"),
        ] {
            let mut arg = OsString::from(flag);
            arg.push(path(name));
            args.push(arg);
        }
        let tls = self.root.join(TLS_DIR);
        if tls.join(TLS_CERT).exists() {
            for (flag, name) in [("--ssl-cert=", TLS_CERT), ("--ssl-key=", TLS_KEY)] {
                let mut arg = OsString::from(flag);
                arg.push(tls.join(name));
                args.push(arg);
            }
        }
        args.extend(self.extra.iter().map(OsString::from));
        args
    }
}

/// The user name to run the server as: itself (root may run it with `--user=root`).
fn current_user() -> String {
    if process::running_as_root() {
        "root".to_owned()
    } else {
        std::env::var("USER").unwrap_or_else(|_| "nobody".to_owned())
    }
}
