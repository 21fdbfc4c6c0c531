//! [`Nats`]: a NATS server with JetStream for tests on 127.0.0.1.
//!
//! Tests share one server and keep apart by using unique stream and subject names; a test that
//! simulates a broker outage starts its own with [`Nats::start`] and stops and restarts it
//! (JetStream's store directory is kept, so streams and their messages survive).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::OnceCell;

use super::process::{self, Launch, Supervised};
use crate::lock;

/// Environment variable with the URL of an existing JetStream-enabled server
/// (`nats://127.0.0.1:PORT`) that [`Nats::shared`] uses instead of starting its own.
/// `scripts/test.sh` sets it so a whole test run shares one server.
pub const NATS_URL_ENV: &str = "OUTBOX_TEST_NATS_URL";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const PORT_ATTEMPTS: usize = 3;

static SHARED: OnceCell<Nats> = OnceCell::const_new();

/// A NATS server with JetStream: either one started by this process from the installed
/// `nats-server`, or an existing one named by [`NATS_URL_ENV`].
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::Nats;
///
/// let nats = Nats::start().await?;          // private: this test may stop it
/// let client = nats.connect().await?;
/// nats.stop().await?;                        // broker outage
/// nats.restart().await?;                     // same port, same JetStream data
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Nats {
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

impl Nats {
    /// The server shared by every test of this process: the one named by [`NATS_URL_ENV`]
    /// when it is set, otherwise one started on first use that stops when the process exits.
    /// Never stop it; use unique stream and subject names.
    pub async fn shared() -> anyhow::Result<&'static Nats> {
        SHARED
            .get_or_try_init(|| async {
                match std::env::var(NATS_URL_ENV) {
                    Ok(url) if !url.trim().is_empty() => {
                        Self::external(url.trim().to_owned()).await
                    }
                    _ => Self::launch(false).await,
                }
            })
            .await
    }

    /// A private server owned by the returned value (killed and its store removed on drop).
    pub async fn start() -> anyhow::Result<Nats> {
        Self::launch(true).await
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A new client connection to this server.
    pub async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(self.url.as_str())
            .await
            .with_context(|| format!("connecting to NATS at {}", self.url))
    }

    /// Stops a private server (clients see the connection drop; the JetStream store is kept).
    /// Refused for the shared server.
    pub async fn stop(&self) -> anyhow::Result<()> {
        let local = self.private_local("stop")?;
        let server = lock(&local.server).take();
        match server {
            Some(server) => server.stop().await,
            None => Ok(()),
        }
    }

    /// Starts a private server again on the same port with the same JetStream store, stopping
    /// it first if it is running, and waits until JetStream answers.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await?;
        let local = self.private_local("restart")?;
        let server = local.spawn(self.port)?;
        let server = wait_ready(&self.url, server).await?;
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
                "cannot {what} the shared NATS server (other tests use it); use Nats::start()"
            ),
        }
    }

    async fn external(url: String) -> anyhow::Result<Nats> {
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or(4222);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match probe(&url).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!(
                        "{NATS_URL_ENV}={url}: server not reachable or JetStream disabled \
                         (unset it to let the tests start their own)"
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(Nats {
            url,
            port,
            local: None,
        })
    }

    async fn launch(private: bool) -> anyhow::Result<Nats> {
        let bin = process::find_program("nats-server").context(
            "`nats-server` not found in PATH or /usr/sbin: install it (`apt-get install -y nats-server`, \
             or run scripts/test.sh), or set OUTBOX_TEST_NATS_URL to an existing server",
        )?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-nats-")
            .tempdir()
            .context("creating a temporary directory for nats-server")?;
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
            let url = format!("nats://127.0.0.1:{port}");
            let server = local.spawn(port)?;
            match wait_ready(&url, server).await {
                Ok(server) => {
                    *lock(&local.server) = Some(server);
                    if private {
                        local._dir = Some(dir);
                    } else {
                        // The shared server is never dropped: its watchdog removes the
                        // directory when the process exits. (On failure `dir` removes it.)
                        let _ = dir.keep();
                    }
                    return Ok(Nats {
                        url,
                        port,
                        local: Some(local),
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && process::port_was_taken(&local.log()) => {
                    tracing::debug!(port, error = %e, "port taken; retrying nats-server on another");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Local {
    fn log(&self) -> PathBuf {
        self.root.join("nats-server.log")
    }

    fn spawn(&self, port: u16) -> anyhow::Result<Supervised> {
        let args = vec![
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string().into(),
            "-js".into(),
            "-sd".into(),
            self.root.join("jetstream").into_os_string(),
        ];
        Supervised::spawn(Launch {
            name: "nats-server",
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

impl Drop for Nats {
    fn drop(&mut self) {
        if let Some(local) = &self.local
            && let Some(mut server) = lock(&local.server).take()
        {
            server.stop_blocking();
        }
    }
}

/// Connects and asks JetStream for the account info: succeeds once JetStream is usable.
/// (A raw `$JS.API.INFO` request: async-nats' typed `query_account` cannot parse the answer of
/// the nats-server 2.9 that Debian ships.)
async fn probe(url: &str) -> anyhow::Result<()> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(1))
        .connect(url)
        .await?;
    let answer = tokio::time::timeout(
        Duration::from_secs(2),
        client.request("$JS.API.INFO", bytes::Bytes::new()),
    )
    .await
    .context("JetStream did not answer")?
    .context("JetStream account info request failed")?;
    let info: serde_json::Value =
        serde_json::from_slice(&answer.payload).context("JetStream account info is not JSON")?;
    if let Some(error) = info.get("error") {
        anyhow::bail!("JetStream is not available: {error}");
    }
    Ok(())
}

async fn wait_ready(url: &str, mut server: Supervised) -> anyhow::Result<Supervised> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let last_error = match probe(url).await {
            Ok(()) => return Ok(server),
            Err(e) => e,
        };
        if let Some(status) = server.exited() {
            anyhow::bail!(
                "nats-server exited ({status}) before accepting connections on {url}\n{}",
                server.log_tail()
            );
        }
        if Instant::now() >= deadline {
            let tail = server.log_tail();
            server.stop().await.ok();
            anyhow::bail!(
                "nats-server not ready on {url} within {READY_TIMEOUT:?} (last error: {last_error:#})\n{tail}"
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
