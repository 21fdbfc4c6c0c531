//! [`Redis`]: a Redis server for tests on 127.0.0.1.
//!
//! Tests share one server and keep apart by using unique stream names; a test that simulates a
//! broker outage starts its own with [`Redis::start`] and stops and restarts it. The server
//! keeps an append-only file in its directory, so streams survive a restart like they would on
//! a production Redis with persistence on.
//!
//! Servers this process starts accept at most 1 MiB per argument (`proto-max-bulk-len 1mb`,
//! the smallest value Redis allows) so that size-limit tests need only a 1 MiB payload; see
//! [`Redis::MAX_BULK_LEN`].

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::OnceCell;

use super::process::{self, Launch, Supervised};
use crate::lock;

/// Environment variable with the URL of an existing Redis server (`redis://127.0.0.1:PORT`)
/// that [`Redis::shared`] uses instead of starting its own. `scripts/test.sh` sets it so a
/// whole test run shares one server.
pub const REDIS_URL_ENV: &str = "OUTBOX_TEST_REDIS_URL";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const PORT_ATTEMPTS: usize = 3;

static SHARED: OnceCell<Redis> = OnceCell::const_new();

/// A Redis server: either one started by this process from the installed `redis-server`, or
/// an existing one named by [`REDIS_URL_ENV`].
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::Redis;
///
/// let redis = Redis::start().await?;   // private: this test may stop it
/// println!("{}", redis.url());          // redis://127.0.0.1:PORT
/// redis.stop().await?;                  // broker outage
/// redis.restart().await?;               // same port, same data
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Redis {
    url: String,
    port: u16,
    local: Option<Local>,
}

#[derive(Debug)]
struct Local {
    private: bool,
    bin: PathBuf,
    root: PathBuf,
    _dir: Option<tempfile::TempDir>,
    server: Mutex<Option<Supervised>>,
}

impl Redis {
    /// The largest argument (`proto-max-bulk-len`) that servers started by this module accept:
    /// 1 MiB. An external server ([`REDIS_URL_ENV`]) has its own limit (Redis' default is
    /// 512 MiB); ask it with `CONFIG GET proto-max-bulk-len`.
    pub const MAX_BULK_LEN: usize = 1024 * 1024;

    /// The server shared by every test of this process: the one named by [`REDIS_URL_ENV`]
    /// when it is set, otherwise one started on first use that stops when the process exits.
    /// Never stop it; use unique stream names.
    pub async fn shared() -> anyhow::Result<&'static Redis> {
        SHARED
            .get_or_try_init(|| async {
                match std::env::var(REDIS_URL_ENV) {
                    Ok(url) if !url.trim().is_empty() => {
                        Self::external(url.trim().to_owned()).await
                    }
                    _ => Self::launch(false).await,
                }
            })
            .await
    }

    /// A private server owned by the returned value (stopped and its directory removed on
    /// drop).
    pub async fn start() -> anyhow::Result<Redis> {
        Self::launch(true).await
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops a private server (clients see the connection drop; the data is kept). Refused for
    /// the shared server.
    pub async fn stop(&self) -> anyhow::Result<()> {
        let local = self.private_local("stop")?;
        let server = lock(&local.server).take();
        match server {
            Some(server) => server.stop().await,
            None => Ok(()),
        }
    }

    /// Starts a private server again on the same port with the same data, stopping it first
    /// if it is running, and waits until it answers `PING`.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await?;
        let local = self.private_local("restart")?;
        let server = local.spawn(self.port)?;
        let server = wait_ready(&self.url, self.port, server).await?;
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

    fn private_local(&self, what: &str) -> anyhow::Result<&Local> {
        match &self.local {
            Some(local) if local.private => Ok(local),
            _ => anyhow::bail!(
                "cannot {what} the shared Redis server (other tests use it); use Redis::start()"
            ),
        }
    }

    async fn external(url: String) -> anyhow::Result<Redis> {
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(6379);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match ping(port).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!(
                        "{REDIS_URL_ENV}={url}: server not reachable on 127.0.0.1:{port} \
                         (unset it to let the tests start their own)"
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(Redis {
            url,
            port,
            local: None,
        })
    }

    async fn launch(private: bool) -> anyhow::Result<Redis> {
        let bin = process::find_program("redis-server").context(
            "`redis-server` not found in PATH: install it (`apt-get install -y redis-server`, \
             or run scripts/test.sh), or set OUTBOX_TEST_REDIS_URL to an existing server",
        )?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-redis-")
            .tempdir()
            .context("creating a temporary directory for redis-server")?;
        let mut local = Local {
            private,
            bin,
            root: dir.path().to_owned(),
            _dir: None,
            server: Mutex::new(None),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = process::free_port()?;
            let url = format!("redis://127.0.0.1:{port}");
            let server = local.spawn(port)?;
            match wait_ready(&url, port, server).await {
                Ok(server) => {
                    *lock(&local.server) = Some(server);
                    if private {
                        local._dir = Some(dir);
                    } else {
                        // The shared server is never dropped: its watchdog removes the
                        // directory when the process exits. (On failure `dir` removes it.)
                        let _ = dir.keep();
                    }
                    return Ok(Redis {
                        url,
                        port,
                        local: Some(local),
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && process::port_was_taken(&local.log()) => {
                    tracing::debug!(port, error = %e, "port taken; retrying redis-server on another");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Local {
    fn log(&self) -> PathBuf {
        self.root.join("redis-server.log")
    }

    fn spawn(&self, port: u16) -> anyhow::Result<Supervised> {
        let args = [
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--daemonize",
            "no",
            "--save",
            "",
            // An append-only file (flushed on the graceful shutdown a stop is) keeps streams
            // across a restart, as a production Redis with persistence would.
            "--appendonly",
            "yes",
            "--appendfsync",
            "no",
            "--dir",
            &self.root.to_string_lossy(),
            "--proto-max-bulk-len",
            "1mb",
        ]
        .map(Into::into)
        .to_vec();
        Supervised::spawn(Launch {
            name: "redis-server",
            program: &self.bin,
            args,
            run_as: None,
            stop_signal: "TERM",
            cleanup: Some(&self.root),
            log: &self.log(),
            cwd: &self.root,
        })
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(local) = &self.local
            && let Some(mut server) = lock(&local.server).take()
        {
            server.stop_blocking();
        }
    }
}

/// Sends `PING` over a raw connection and expects `+PONG` (a server still loading its data
/// answers `-LOADING`, which is not ready).
async fn ping(port: u16) -> anyhow::Result<()> {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut answer = [0u8; 64];
        let n = stream.read(&mut answer).await?;
        anyhow::ensure!(
            answer[..n].starts_with(b"+PONG"),
            "Redis answered {:?}",
            String::from_utf8_lossy(&answer[..n]).trim_end()
        );
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .context("Redis did not answer PING in time")?
}

async fn wait_ready(url: &str, port: u16, mut server: Supervised) -> anyhow::Result<Supervised> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let last_error = match ping(port).await {
            Ok(()) => return Ok(server),
            Err(e) => e,
        };
        if let Some(status) = server.exited() {
            anyhow::bail!(
                "redis-server exited ({status}) before accepting connections on {url}\n{}",
                server.log_tail()
            );
        }
        if Instant::now() >= deadline {
            let tail = server.log_tail();
            server.stop().await.ok();
            anyhow::bail!(
                "redis-server not ready on {url} within {READY_TIMEOUT:?} (last error: {last_error:#})\n{tail}"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
