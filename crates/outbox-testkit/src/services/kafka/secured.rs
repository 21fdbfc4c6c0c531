//! TLS and SASL/SCRAM for [`Kafka::start_secured`](super::Kafka::start_secured): the options,
//! the settings clients need, and the creation of SCRAM users.
//!
//! tansu (0.6) keeps SCRAM credentials only in a SQL storage engine (its memory and S3
//! storage accept `AlterUserScramCredentials` and forget it), and refuses that request from an
//! unauthenticated client once `--authentication` is on. So a secured broker stores its data
//! in a SQLite database of its own (`sqlite://`, tansu's `libsql` feature): a first tansu
//! without authentication creates the users in it with `tansu user create`, then the real
//! one starts on it with `--authentication`. tansu offers SCRAM-SHA-256 and SCRAM-SHA-512;
//! it refuses PLAIN (`NoSharedMechanism`).

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::super::process::{self, Launch, Supervised};
use crate::tls::TestCa;

/// How long the user-creating tansu gets to listen.
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(30);

/// The name of the testkit's own SCRAM user on a broker with SASL.
const TESTKIT_USER: &str = "outbox-testkit";

/// What [`Kafka::start_secured`](super::Kafka::start_secured) sets up.
#[derive(Debug, Clone, Default)]
pub struct KafkaSecurity {
    /// Clients reach the broker over TLS with the server certificate of this CA (no client
    /// certificate asked for).
    pub tls: Option<TestCa>,
    /// SASL/SCRAM users to create; when not empty the broker requires authentication
    /// (`--authentication`).
    pub users: Vec<KafkaUser>,
}

/// A SASL/SCRAM user of a secured broker.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaUser {
    /// `sasl.username`.
    pub name: String,
    /// `sasl.password`.
    pub password: String,
    /// The SCRAM mechanism the credential is stored for (a user has one per mechanism).
    pub mechanism: Scram,
}

impl fmt::Debug for KafkaUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaUser")
            .field("name", &self.name)
            .field("password", &"***")
            .field("mechanism", &self.mechanism)
            .finish()
    }
}

impl KafkaUser {
    /// A user `name` with `password`, for `mechanism`.
    pub fn new(name: impl Into<String>, password: impl Into<String>, mechanism: Scram) -> Self {
        Self {
            name: name.into(),
            password: password.into(),
            mechanism,
        }
    }

    /// The librdkafka settings that authenticate as this user: `sasl.mechanism`,
    /// `sasl.username`, `sasl.password`.
    pub fn sasl_settings(&self) -> Vec<(String, String)> {
        vec![
            (
                "sasl.mechanism".to_owned(),
                self.mechanism.sasl_mechanism().to_owned(),
            ),
            ("sasl.username".to_owned(), self.name.clone()),
            ("sasl.password".to_owned(), self.password.clone()),
        ]
    }
}

/// A SCRAM mechanism tansu supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scram {
    /// `SCRAM-SHA-256`.
    Sha256,
    /// `SCRAM-SHA-512`.
    Sha512,
}

impl Scram {
    /// The mechanism's name, as librdkafka's `sasl.mechanism` takes it.
    pub fn sasl_mechanism(self) -> &'static str {
        match self {
            Scram::Sha256 => "SCRAM-SHA-256",
            Scram::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// The name `tansu user create --mechanism` takes.
    fn tansu_name(self) -> &'static str {
        match self {
            Scram::Sha256 => "scram256",
            Scram::Sha512 => "scram512",
        }
    }
}

/// The security of a started broker.
#[derive(Debug)]
pub(super) struct Secured {
    pub(super) tls: Option<TestCa>,
    users: Vec<KafkaUser>,
    /// The testkit's own user, when SASL is on.
    admin: Option<KafkaUser>,
    /// Where [`create_users`] makes the SQLite database of a broker with SASL (copied into the
    /// broker's own directory before it starts); removed on drop.
    pub(super) db: Option<tempfile::TempDir>,
}

impl Secured {
    pub(super) fn new(security: KafkaSecurity) -> anyhow::Result<Self> {
        let KafkaSecurity { tls, users } = security;
        anyhow::ensure!(
            !users.iter().any(|u| u.name == TESTKIT_USER),
            "the user name `{TESTKIT_USER}` is the testkit's own"
        );
        let (admin, db) = if users.is_empty() {
            (None, None)
        } else {
            let admin = KafkaUser::new(
                TESTKIT_USER,
                uuid::Uuid::new_v4().simple().to_string(),
                Scram::Sha512,
            );
            let db = tempfile::Builder::new()
                .prefix("outbox-tansu-sasl-")
                .tempdir()
                .context("creating a directory for tansu's SQLite storage")?;
            (Some(admin), Some(db))
        };
        Ok(Self {
            tls,
            users,
            admin,
            db,
        })
    }

    /// Every user to create: the test's and the testkit's own.
    pub(super) fn all_users(&self) -> Vec<KafkaUser> {
        self.users.iter().chain(&self.admin).cloned().collect()
    }

    /// `security.protocol` for a client going through the TLS front (`through_tls`), or
    /// straight to tansu's own port.
    pub(super) fn security_protocol(&self, through_tls: bool) -> &'static str {
        match (through_tls && self.tls.is_some(), self.admin.is_some()) {
            (false, false) => "PLAINTEXT",
            (true, false) => "SSL",
            (false, true) => "SASL_PLAINTEXT",
            (true, true) => "SASL_SSL",
        }
    }

    /// The settings of the testkit's own clients (see
    /// [`Secured::security_protocol`] for `through_tls`).
    pub(super) fn client_settings(&self, through_tls: bool) -> Vec<(String, String)> {
        let mut settings = vec![(
            "security.protocol".to_owned(),
            self.security_protocol(through_tls).to_owned(),
        )];
        if let Some(ca) = self.tls.as_ref().filter(|_| through_tls) {
            settings.push((
                "ssl.ca.location".to_owned(),
                ca.ca_cert.display().to_string(),
            ));
        }
        if let Some(admin) = &self.admin {
            settings.extend(admin.sasl_settings());
        }
        settings
    }
}

/// tansu's `--storage-engine` for a SQLite database: `tansu.db` in its working directory
/// (tansu takes the URL's path relative to it, even an absolute one).
pub(super) const STORAGE_URL: &str = "sqlite:///tansu.db";

/// Copies the SQLite database made by [`create_users`] in `from` (with its write-ahead log,
/// if any) into `to`, the broker's working directory.
pub(super) fn copy_database(from: &Path, to: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with("tansu.db") {
            std::fs::copy(entry.path(), to.join(&name))
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Creates `users` in a SQLite storage in `dir`: starts tansu on it without authentication,
/// runs `tansu user create` for each user, stops it.
pub(super) async fn create_users(
    bin: &Path,
    dir: &Path,
    users: &[KafkaUser],
) -> anyhow::Result<()> {
    let port = process::free_port()?;
    let listen = format!("tcp://127.0.0.1:{port}");
    let log = dir.join("create-users.log");
    let mut broker = Supervised::spawn(Launch {
        name: "tansu",
        program: bin,
        args: vec![
            "broker".into(),
            "--listener-url".into(),
            listen.clone().into(),
            "--advertised-listener-url".into(),
            listen.clone().into(),
            "--storage-engine".into(),
            STORAGE_URL.into(),
        ],
        run_as: None,
        stop_signal: "KILL",
        cleanup: None,
        log: &log,
        cwd: dir,
    })?;
    let created = async {
        let deadline = Instant::now() + BOOTSTRAP_TIMEOUT;
        loop {
            if let Some(status) = broker.exited() {
                anyhow::bail!(
                    "tansu with SQLite storage exited ({status}) before listening; SASL users \
                     need a tansu built with `--features dynostore,libsql`\n{}",
                    broker.log_tail()
                );
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "tansu did not listen on {listen} within {BOOTSTRAP_TIMEOUT:?}\n{}",
                broker.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for user in users {
            let out = tokio::process::Command::new(bin)
                .args(["user", "create", "--broker", &listen, "--mechanism"])
                .arg(user.mechanism.tansu_name())
                .arg(&user.name)
                .arg(&user.password)
                .output()
                .await
                .context("running `tansu user create`")?;
            anyhow::ensure!(
                out.status.success(),
                "`tansu user create {}` failed: {}",
                user.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
    .await;
    broker.stop().await?;
    created
}
