//! [`Nats`]: a NATS server with JetStream for tests on 127.0.0.1.
//!
//! Tests share one server and keep apart by using unique stream and subject names; a test that
//! simulates a broker outage starts its own with [`Nats::start`] and stops and restarts it
//! (JetStream's store directory is kept, so streams and their messages survive).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::methods::launcher;
use super::process;
use super::server::ServerSpec;

/// Environment variable with the URL of an existing JetStream-enabled server
/// (`nats://127.0.0.1:PORT`) that [`Nats::shared`] uses instead of starting its own.
/// `scripts/test.sh` sets it so a whole test run shares one server.
pub const NATS_URL_ENV: &str = "OUTBOX_TEST_NATS_URL";

launcher! {
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
    pub struct Nats(Server<NatsServer>), server named by NATS_URL_ENV;
    shared: "use unique stream and subject names"; start: "stopped and its store removed";
    url: "`nats://127.0.0.1:PORT`."; stop: "Clients see the connection drop; the JetStream \
        store is kept."; restart: "with the same JetStream store", "JetStream answers";
}

/// A `nats-server` this process starts.
#[derive(Debug)]
struct NatsServer {
    bin: PathBuf,
    /// The JetStream store directory, kept across restarts.
    store: PathBuf,
}

impl Nats {
    /// A new client connection to this server.
    pub async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .connect(self.url())
            .await
            .with_context(|| format!("connecting to NATS at {}", self.url()))
    }
}

impl ServerSpec for NatsServer {
    const NAME: &'static str = "nats-server";
    const SHARED: &'static str = "the shared NATS server";
    const START_PRIVATE: &'static str = "Nats::start()";
    const DIR_PREFIX: &'static str = "outbox-nats-";
    const URL_ENV: &'static str = NATS_URL_ENV;
    const DEFAULT_PORT: Option<u16> = Some(4222);

    fn setup(root: &Path) -> anyhow::Result<Self> {
        let bin = process::find_program("nats-server").context(
            "`nats-server` not found in PATH or /usr/sbin: install it (`apt-get install -y nats-server`, \
             or run scripts/test.sh), or set OUTBOX_TEST_NATS_URL to an existing server",
        )?;
        Ok(NatsServer {
            bin,
            store: root.join("jetstream"),
        })
    }

    fn url(port: u16) -> String {
        format!("nats://127.0.0.1:{port}")
    }

    /// Connects and asks JetStream for the account info: succeeds once JetStream is usable.
    /// (A raw `$JS.API.INFO` request: async-nats' typed `query_account` cannot parse the
    /// answer of the nats-server 2.9 that Debian ships.)
    async fn probe(url: &str, _port: u16) -> anyhow::Result<()> {
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
        let info: serde_json::Value = serde_json::from_slice(&answer.payload)
            .context("JetStream account info is not JSON")?;
        if let Some(error) = info.get("error") {
            anyhow::bail!("JetStream is not available: {error}");
        }
        Ok(())
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn args(&self, port: u16) -> Vec<OsString> {
        vec![
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string().into(),
            "-js".into(),
            "-sd".into(),
            self.store.clone().into_os_string(),
        ]
    }
}
