//! [`Kafka`]: a Kafka-protocol broker for tests on 127.0.0.1 (feature `kafka`).
//!
//! The broker is [tansu](https://crates.io/crates/tansu), a single binary that speaks the
//! Apache Kafka protocol, started with in-memory storage. Two facts shape how tests use it:
//!
//! - it never creates a topic on produce: tests call [`Kafka::create_topic`] first;
//! - memory storage is lost when the broker stops, so after [`Kafka::restart`] every topic is
//!   gone (and so is the idempotent producers' state). An outage test recreates its topic
//!   after the restart, or lets the sink create it (`create_topics = true`).
//!
//! Tests share one broker and keep apart with unique topic names; a test that simulates a
//! broker outage starts its own with [`Kafka::start`], or with [`Kafka::start_with_front`] when
//! the data must survive the outage: clients then reach tansu through a small TCP front in
//! this process, and [`Kafka::disconnect`] / [`Kafka::reconnect`] cut and restore it (every
//! client connection dropped, new ones refused) while tansu keeps running with its topics.
//!
//! The binary is found in this order: `$TANSU_BIN`, `tansu` on `PATH`, the prebuilt copy in
//! `../shared/tools/tansu` beside the repository; otherwise the error says how to install it.

mod client;
mod front;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::OwnedMessage;
use tokio::sync::OnceCell;

use self::client::{client_config, consume_blocking, probe, wait_for_topic};
use self::front::Front;
use super::process::{self, Launch, Supervised};
use crate::lock;

/// Environment variable with the bootstrap address of an existing Kafka-protocol broker
/// (`127.0.0.1:PORT`) that [`Kafka::shared`] uses instead of starting its own.
/// `scripts/test.sh` sets it so a whole test run shares one broker.
pub const KAFKA_BROKERS_ENV: &str = "OUTBOX_TEST_KAFKA_BROKERS";

/// Environment variable naming the `tansu` binary to run.
pub const TANSU_BIN_ENV: &str = "TANSU_BIN";

/// How to get `tansu` when it is nowhere to be found.
const INSTALL_HINT: &str = "install it with `cargo install tansu --version 0.6.0 --locked \
     --no-default-features --features dynostore` (or run scripts/test.sh, which does), set \
     TANSU_BIN to the binary, or set OUTBOX_TEST_KAFKA_BROKERS to an existing broker";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const PORT_ATTEMPTS: usize = 3;
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

static SHARED: OnceCell<Kafka> = OnceCell::const_new();

/// A Kafka-protocol broker: either a `tansu` started by this process, or an existing broker
/// named by [`KAFKA_BROKERS_ENV`].
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::Kafka;
///
/// let kafka = Kafka::start().await?;             // private: this test may stop it
/// kafka.create_topic("orders", 3).await?;        // tansu never auto-creates topics
/// kafka.stop().await?;                           // broker outage
/// kafka.restart().await?;                        // same port, but every topic is gone
/// kafka.create_topic("orders", 3).await?;
///
/// let kafka = Kafka::start_with_front().await?;  // clients go through a TCP front
/// kafka.create_topic("orders", 3).await?;
/// kafka.disconnect().await?;                     // outage: connections dropped, refused
/// kafka.reconnect().await?;                      // back, topics and messages intact
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Kafka {
    brokers: String,
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
    /// The port tansu listens on (the front's when there is one is what clients use).
    listen_port: u16,
    front: Option<Front>,
}

impl Kafka {
    /// The broker shared by every test of this process: the one named by
    /// [`KAFKA_BROKERS_ENV`] when it is set, otherwise one started on first use that stops
    /// when the process exits. Never stop it; use unique topic names.
    pub async fn shared() -> anyhow::Result<&'static Kafka> {
        SHARED
            .get_or_try_init(|| async {
                match std::env::var(KAFKA_BROKERS_ENV) {
                    Ok(brokers) if !brokers.trim().is_empty() => {
                        Self::external(brokers.trim().to_owned()).await
                    }
                    _ => Self::launch(false, false).await,
                }
            })
            .await
    }

    /// A private broker owned by the returned value (killed on drop).
    pub async fn start() -> anyhow::Result<Kafka> {
        Self::launch(true, false).await
    }

    /// A private broker that clients reach through a TCP front in this process (tansu
    /// advertises the front's address), so that [`Kafka::disconnect`] and
    /// [`Kafka::reconnect`] can simulate an outage that keeps the broker's data. The front
    /// runs on the Tokio runtime that calls this.
    pub async fn start_with_front() -> anyhow::Result<Kafka> {
        Self::launch(true, true).await
    }

    /// The bootstrap address, `127.0.0.1:PORT` (what `bootstrap.servers` takes).
    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// The TCP port on 127.0.0.1 that clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts clients off a broker started with [`Kafka::start_with_front`]: every open
    /// connection is dropped and new ones are refused, as if the broker were down, while
    /// tansu keeps running with its topics and messages.
    pub async fn disconnect(&self) -> anyhow::Result<()> {
        self.front("disconnect")?.cut().await;
        Ok(())
    }

    /// Lets clients reach the broker again after [`Kafka::disconnect`] (same address), and
    /// waits until it answers metadata requests.
    pub async fn reconnect(&self) -> anyhow::Result<()> {
        self.front("reconnect")?.restore().await?;
        probe(self.brokers.clone(), Duration::from_secs(10)).await
    }

    fn front(&self, what: &str) -> anyhow::Result<&Front> {
        match self.local.as_ref().and_then(|l| l.front.as_ref()) {
            Some(front) => Ok(front),
            None => anyhow::bail!(
                "cannot {what}: this broker has no front; start it with Kafka::start_with_front()"
            ),
        }
    }

    /// Kills a private broker (clients see their connections drop). With memory storage
    /// every topic and message is lost. Refused for the shared broker.
    pub async fn stop(&self) -> anyhow::Result<()> {
        let local = self.private_local("stop")?;
        let server = lock(&local.server).take();
        match server {
            Some(server) => server.stop().await,
            None => Ok(()),
        }
    }

    /// Starts a private broker again on the same port, stopping it first if it is running,
    /// and waits until it answers metadata requests. It starts empty: create topics again.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await?;
        let local = self.private_local("restart")?;
        let server = local.spawn()?;
        // tansu's own port: a disconnected front must not make the restart fail.
        let server = wait_ready(&format!("127.0.0.1:{}", local.listen_port), server).await?;
        *lock(&local.server) = Some(server);
        Ok(())
    }

    /// True while a broker this process started is running (always true for an external one).
    pub fn is_running(&self) -> bool {
        match &self.local {
            Some(local) => lock(&local.server)
                .as_mut()
                .is_some_and(|s| s.exited().is_none()),
            None => true,
        }
    }

    /// Creates `name` with `partitions` partitions (replication factor 1) and waits until
    /// its metadata shows every partition. A topic that already exists is an error.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let admin: AdminClient<DefaultClientContext> = client_config(&self.brokers)
            .create()
            .context("creating a Kafka admin client")?;
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let results = tokio::time::timeout(
            ADMIN_TIMEOUT + Duration::from_secs(5),
            admin.create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
                &options,
            ),
        )
        .await
        .with_context(|| format!("creating topic `{name}` on {}: timed out", self.brokers))?
        .with_context(|| format!("creating topic `{name}` on {}", self.brokers))?;
        for result in results {
            if let Err((topic, code)) = result {
                anyhow::bail!("creating topic `{topic}` on {}: {code}", self.brokers);
            }
        }
        let brokers = self.brokers.clone();
        let topic = name.to_owned();
        let expected = usize::try_from(partitions).unwrap_or(0);
        tokio::task::spawn_blocking(move || wait_for_topic(&admin, &brokers, &topic, expected))
            .await
            .context("waiting for the topic's metadata")?
    }

    /// Reads `topics` from the beginning with a real consumer (every partition assigned, no
    /// consumer group) until `expected` messages arrived in all or `timeout` passed, then
    /// returns what arrived, sorted by topic (in the order given), partition and offset.
    /// Waits a little past `expected` so that a test also sees unexpected extra messages.
    pub async fn consume(
        &self,
        topics: &[&str],
        expected: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<OwnedMessage>> {
        let brokers = self.brokers.clone();
        let topics: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
        tokio::task::spawn_blocking(move || consume_blocking(&brokers, &topics, expected, timeout))
            .await
            .context("consumer thread")?
    }

    fn private_local(&self, what: &str) -> anyhow::Result<&Local> {
        match &self.local {
            Some(local) if local.private => Ok(local),
            _ => anyhow::bail!(
                "cannot {what} the shared Kafka broker (other tests use it); use Kafka::start()"
            ),
        }
    }

    async fn external(brokers: String) -> anyhow::Result<Kafka> {
        let port = brokers
            .split(',')
            .next()
            .and_then(|b| b.rsplit(':').next())
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(9092);
        probe(brokers.clone(), Duration::from_secs(10))
            .await
            .with_context(|| {
                format!(
                    "{KAFKA_BROKERS_ENV}={brokers}: broker not reachable (unset it to let the \
                     tests start their own)"
                )
            })?;
        Ok(Kafka {
            brokers,
            port,
            local: None,
        })
    }

    async fn launch(private: bool, fronted: bool) -> anyhow::Result<Kafka> {
        let bin = find_tansu()?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-tansu-")
            .tempdir()
            .context("creating a temporary directory for tansu")?;
        let mut local = Local {
            private,
            bin,
            root: dir.path().to_owned(),
            _dir: None,
            server: Mutex::new(None),
            listen_port: 0,
            front: None,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            local.listen_port = process::free_port()?;
            local.front = None;
            if fronted {
                let front = Front::bind(local.listen_port).await?;
                local.front = Some(front);
            }
            let port = local.advertised_port();
            let brokers = format!("127.0.0.1:{port}");
            let server = local.spawn()?;
            match wait_ready(&brokers, server).await {
                Ok(server) => {
                    *lock(&local.server) = Some(server);
                    if private {
                        local._dir = Some(dir);
                    } else {
                        // The shared broker is never dropped: its watchdog removes the
                        // directory when the process exits. (On failure `dir` removes it.)
                        let _ = dir.keep();
                    }
                    return Ok(Kafka {
                        brokers,
                        port,
                        local: Some(local),
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && process::port_was_taken(&local.log()) => {
                    tracing::debug!(port, error = %e, "port taken; retrying tansu on another");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Local {
    fn log(&self) -> PathBuf {
        self.root.join("tansu.log")
    }

    /// The port clients are told to use: the front's, else tansu's own.
    fn advertised_port(&self) -> u16 {
        self.front.as_ref().map_or(self.listen_port, Front::port)
    }

    fn spawn(&self) -> anyhow::Result<Supervised> {
        let listen = format!("tcp://127.0.0.1:{}", self.listen_port);
        let advertised = format!("tcp://127.0.0.1:{}", self.advertised_port());
        let args = vec![
            "broker".into(),
            "--listener-url".into(),
            listen.into(),
            "--advertised-listener-url".into(),
            advertised.into(),
            "--storage-engine".into(),
            "memory://tansu/".into(),
        ];
        Supervised::spawn(Launch {
            name: "tansu",
            program: &self.bin,
            args,
            run_as: None,
            // tansu's SIGTERM shutdown waits for clients to disconnect, which producers
            // never do: an outage must be immediate, and memory storage has nothing to save.
            stop_signal: "KILL",
            cleanup: Some(&self.root),
            log: &self.log(),
            cwd: &self.root,
        })
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        if let Some(local) = &self.local
            && let Some(mut server) = lock(&local.server).take()
        {
            server.stop_blocking();
        }
    }
}

/// The `tansu` binary: `$TANSU_BIN`, else `tansu` on `PATH`, else the prebuilt copy beside
/// the repository (`../shared/tools/tansu`).
pub fn find_tansu() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os(TANSU_BIN_ENV).filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        anyhow::ensure!(
            bin.is_file(),
            "{TANSU_BIN_ENV}={} is not a file; {INSTALL_HINT}",
            bin.display()
        );
        return Ok(bin);
    }
    if let Some(bin) = process::find_program("tansu") {
        return Ok(bin);
    }
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/tansu");
    if beside_repo.is_file() {
        return Ok(beside_repo);
    }
    anyhow::bail!("`tansu` (a Kafka-protocol broker) not found; {INSTALL_HINT}")
}

async fn wait_ready(brokers: &str, mut server: Supervised) -> anyhow::Result<Supervised> {
    let deadline = Instant::now() + READY_TIMEOUT;
    // Cheap TCP connects until the port is open, then one real metadata request.
    loop {
        if tokio::net::TcpStream::connect(brokers).await.is_ok() {
            break;
        }
        if let Some(status) = server.exited() {
            anyhow::bail!(
                "tansu exited ({status}) before accepting connections on {brokers}\n{}",
                server.log_tail()
            );
        }
        if Instant::now() >= deadline {
            let tail = server.log_tail();
            server.stop().await.ok();
            anyhow::bail!("tansu not listening on {brokers} within {READY_TIMEOUT:?}\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match probe(brokers.to_owned(), Duration::from_secs(10)).await {
        Ok(()) => Ok(server),
        Err(e) => {
            let tail = server.log_tail();
            server.stop().await.ok();
            Err(e.context(format!("tansu on {brokers} does not answer\n{tail}")))
        }
    }
}
