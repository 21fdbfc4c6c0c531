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
//! [`Kafka::start_secured`] starts a private broker that clients reach over TLS (a
//! [`TlsFront`] in this process, since tansu 0.6 cannot load a key and a certificate itself)
//! and/or must authenticate to with SASL/SCRAM ([`KafkaUser`]s, stored in a SQLite database,
//! which needs a tansu built with the `libsql` feature: memory storage keeps no users).
//!
//! The binary is found in this order: `$TANSU_BIN`, `tansu` on `PATH`, the prebuilt copy in
//! `../shared/tools/tansu` beside the repository; otherwise the error says how to install it.

mod client;
mod front;
mod secured;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::OwnedMessage;

use self::client::{client_config, consume_blocking, probe, wait_for_topic};
use self::front::Front;
pub use self::secured::{KafkaSecurity, KafkaUser, Scram};
use self::secured::{Secured, create_users};
use super::methods::launcher;
use super::process;
use super::server::{Server, ServerSpec, poll};
use crate::tls::TlsFront;

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

const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

launcher! {
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
    pub struct Kafka(Server<Tansu>), broker named by KAFKA_BROKERS_ENV;
    shared: "use unique topic names"; start: "killed and its directory removed";
    brokers: "The bootstrap address, `127.0.0.1:PORT` (what `bootstrap.servers` takes).";
    stop: "It is killed: clients see their connections drop and, with memory storage, every \
        topic and message is lost."; restart: "empty: create topics again", "it answers metadata \
        requests";
}

/// A `tansu` this process starts.
#[derive(Debug)]
struct Tansu {
    bin: PathBuf,
    /// Whether clients go through a [`Front`].
    fronted: bool,
    /// The port tansu listens on (the front's when there is one is what clients use).
    listen_port: u16,
    front: Option<Front>,
    /// TLS and SASL of a broker started with [`Kafka::start_secured`].
    secured: Option<Secured>,
    /// The TLS terminator clients reach when [`Secured::tls`] is set.
    tls_front: Option<TlsFront>,
}

impl Kafka {
    /// A private broker that clients reach through a TCP front in this process (tansu
    /// advertises the front's address), so that [`Kafka::disconnect`] and
    /// [`Kafka::reconnect`] can simulate an outage that keeps the broker's data. The front
    /// runs on the Tokio runtime that calls this.
    pub async fn start_with_front() -> anyhow::Result<Kafka> {
        let setup = |root: &Path| {
            Tansu::setup(root).map(|tansu| Tansu {
                fronted: true,
                ..tansu
            })
        };
        Server::launch(true, setup).await.map(Kafka)
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
        probe(
            self.brokers().to_owned(),
            Vec::new(),
            Duration::from_secs(10),
        )
        .await
    }

    /// A private broker with TLS and/or SASL/SCRAM authentication (see [`KafkaSecurity`]):
    /// with `tls`, clients reach it through a TLS terminator presenting the CA's server
    /// certificate (tansu advertises the terminator's address); with `users`, it is started
    /// with `--authentication` after the users (and the testkit's own) were created. The
    /// testkit's own clients ([`Kafka::create_topic`], [`Kafka::consume`]) use
    /// [`Kafka::client_settings`]. Runs its TLS terminator on the Tokio runtime that calls
    /// this.
    ///
    /// ```no_run
    /// # async fn example() -> anyhow::Result<()> {
    /// use outbox_testkit::services::{Kafka, KafkaSecurity, KafkaUser, Scram};
    /// # let ca: outbox_testkit::tls::TestCa = unimplemented!();
    /// let kafka = Kafka::start_secured(KafkaSecurity {
    ///     tls: Some(ca),
    ///     users: vec![KafkaUser::new("relay", "s3cret", Scram::Sha512)],
    /// })
    /// .await?;
    /// assert_eq!(kafka.security_protocol(), "SASL_SSL");
    /// # Ok(()) }
    /// ```
    pub async fn start_secured(security: KafkaSecurity) -> anyhow::Result<Kafka> {
        let bin = find_tansu()?;
        let secured = Secured::new(security)?;
        if let Some(db) = &secured.db {
            create_users(&bin, db.path(), &secured.all_users()).await?;
        }
        let setup = move |root: &Path| {
            if let Some(db) = &secured.db {
                secured::copy_database(db.path(), root)?;
            }
            Ok(Tansu {
                bin,
                fronted: false,
                listen_port: 0,
                front: None,
                secured: Some(secured),
                tls_front: None,
            })
        };
        Server::launch(true, setup).await.map(Kafka)
    }

    /// librdkafka's `security.protocol` for this broker: `PLAINTEXT`, `SSL`,
    /// `SASL_PLAINTEXT` or `SASL_SSL`.
    pub fn security_protocol(&self) -> &'static str {
        self.secured()
            .map_or("PLAINTEXT", |s| s.security_protocol(true))
    }

    /// The librdkafka settings the testkit's own clients use with this broker
    /// (`security.protocol`, `ssl.ca.location`, and SASL as the testkit's own user); empty
    /// for a plain broker.
    pub fn client_settings(&self) -> Vec<(String, String)> {
        self.secured()
            .map(|s| s.client_settings(true))
            .unwrap_or_default()
    }

    fn secured(&self) -> Option<&Secured> {
        self.0.spec().and_then(|t| t.secured.as_ref())
    }

    fn front(&self, what: &str) -> anyhow::Result<&Front> {
        match self.0.spec().and_then(|t| t.front.as_ref()) {
            Some(front) => Ok(front),
            None => anyhow::bail!(
                "cannot {what}: this broker has no front; start it with Kafka::start_with_front()"
            ),
        }
    }

    /// Creates `name` with `partitions` partitions (replication factor 1) and waits until
    /// its metadata shows every partition. A topic that already exists is an error.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let admin: AdminClient<DefaultClientContext> =
            client_config(self.brokers(), &self.client_settings())
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
        .with_context(|| format!("creating topic `{name}` on {}: timed out", self.brokers()))?
        .with_context(|| format!("creating topic `{name}` on {}", self.brokers()))?;
        for result in results {
            if let Err((topic, code)) = result {
                anyhow::bail!("creating topic `{topic}` on {}: {code}", self.brokers());
            }
        }
        let brokers = self.brokers().to_owned();
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
        let brokers = self.brokers().to_owned();
        let settings = self.client_settings();
        let topics: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            consume_blocking(&brokers, &settings, &topics, expected, timeout)
        })
        .await
        .context("consumer thread")?
    }
}

impl ServerSpec for Tansu {
    const NAME: &'static str = "tansu";
    const SHARED: &'static str = "the shared Kafka broker";
    const START_PRIVATE: &'static str = "Kafka::start()";
    const DIR_PREFIX: &'static str = "outbox-tansu-";
    const URL_ENV: &'static str = KAFKA_BROKERS_ENV;
    /// tansu's SIGTERM shutdown waits for clients to disconnect, which producers never do:
    /// an outage must be immediate, and memory storage has nothing to save.
    const STOP_SIGNAL: &'static str = "KILL";

    fn setup(_root: &Path) -> anyhow::Result<Self> {
        Ok(Tansu {
            bin: find_tansu()?,
            fronted: false,
            listen_port: 0,
            front: None,
            secured: None,
            tls_front: None,
        })
    }

    /// tansu's own port, and in front of it a new [`Front`] when clients go through one.
    async fn choose_port(&mut self) -> anyhow::Result<u16> {
        self.listen_port = process::free_port()?;
        self.front = None;
        self.tls_front = None;
        if self.fronted {
            self.front = Some(Front::bind(self.listen_port).await?);
        }
        if let Some(ca) = self.secured.as_ref().and_then(|s| s.tls.as_ref()) {
            let target = std::net::SocketAddr::from(([127, 0, 0, 1], self.listen_port));
            self.tls_front = Some(
                TlsFront::start_without_client_auth(ca, target)
                    .await
                    .context("starting the TLS terminator in front of tansu")?,
            );
        }
        Ok(self.advertised_port())
    }

    fn url(port: u16) -> String {
        format!("127.0.0.1:{port}")
    }

    fn external_port(brokers: &str) -> anyhow::Result<u16> {
        Ok(brokers
            .split(',')
            .next()
            .and_then(|b| b.rsplit(':').next())
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(9092))
    }

    async fn probe(brokers: &str, _port: u16) -> anyhow::Result<()> {
        probe(brokers.to_owned(), Vec::new(), Duration::from_secs(10)).await
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn args(&self, port: u16) -> Vec<OsString> {
        let listen = format!("tcp://127.0.0.1:{}", self.listen_port);
        let advertised = format!("tcp://127.0.0.1:{port}");
        let sasl = self.secured.as_ref().is_some_and(|s| s.db.is_some());
        let storage = if sasl {
            secured::STORAGE_URL
        } else {
            "memory://tansu/"
        };
        let mut args: Vec<OsString> = vec![
            "broker".into(),
            "--listener-url".into(),
            listen.into(),
            "--advertised-listener-url".into(),
            advertised.into(),
            "--storage-engine".into(),
            storage.into(),
        ];
        if sasl {
            args.push("--authentication".into());
        }
        args
    }

    /// Cheap TCP connects until tansu's own port is open (a disconnected front must not make a
    /// restart fail), then one real metadata request (authenticated when SASL is on; straight
    /// to tansu, without TLS).
    async fn ready(&self, _brokers: &str, _port: u16) -> anyhow::Result<()> {
        let own = format!("127.0.0.1:{}", self.listen_port);
        let connect = || async {
            tokio::net::TcpStream::connect(own.as_str()).await?;
            Ok(())
        };
        poll(Self::READY_TIMEOUT, Duration::from_millis(10), connect)
            .await
            .context("not listening")?;
        let settings = self
            .secured
            .as_ref()
            .map(|s| s.client_settings(false))
            .unwrap_or_default();
        probe(own, settings, Duration::from_secs(10)).await
    }
}

impl Tansu {
    /// The port clients are told to use: the front's (plain or TLS), else tansu's own.
    fn advertised_port(&self) -> u16 {
        match (&self.front, &self.tls_front) {
            (Some(front), _) => front.port(),
            (None, Some(tls)) => tls.addr().port(),
            (None, None) => self.listen_port,
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
