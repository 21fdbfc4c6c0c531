//! Broker authentication against real servers that require it. NATS: a token (`sink.token`,
//! here read from a file) and a user/password in the URL; Redis: an ACL user with a password
//! in the URL (the default user disabled). With the right secret the relay delivers every
//! event; with a wrong one `doctor` is red with the reason and no command prints the secret.

#![cfg(all(feature = "nats", feature = "redis"))]

mod support;

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use support::{Workdir, read_stream, terminate};

const TOKEN: &str = "natsAuthTok31";
const PASSWORD: &str = "natsAuthPw32";
const REDIS_PASSWORD: &str = "redisAclPw33";

/// A broker process on a free port of 127.0.0.1, with a scratch directory; killed on drop.
struct AuthServer {
    child: std::process::Child,
    port: u16,
    _store: tempfile::TempDir,
}

impl AuthServer {
    /// A nats-server with JetStream, requiring `auth` (nats-server arguments).
    async fn nats(auth: &[&str]) -> anyhow::Result<AuthServer> {
        Self::start(&["nats-server", "/usr/sbin/nats-server"], |port, store| {
            let mut args = vec![
                "-a".to_owned(),
                "127.0.0.1".to_owned(),
                "-p".to_owned(),
                port.to_string(),
                "-js".to_owned(),
                "-sd".to_owned(),
                store.to_owned(),
            ];
            args.extend(auth.iter().map(|a| (*a).to_owned()));
            args
        })
        .await
    }

    /// A redis-server whose only user is `relay` with `password` (ACL).
    async fn redis(password: &str) -> anyhow::Result<AuthServer> {
        Self::start(&["redis-server", "/usr/bin/redis-server"], |port, store| {
            [
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--dir",
                store,
                "--save",
                "",
                "--appendonly",
                "no",
                "--user",
                "default",
                "off",
                "--user",
                "relay",
                "on",
                &format!(">{password}"),
                "~*",
                "&*",
                "+@all",
            ]
            .iter()
            .map(|a| (*a).to_owned())
            .collect()
        })
        .await
    }

    async fn start(
        programs: &[&str],
        args: impl FnOnce(u16, &str) -> Vec<String>,
    ) -> anyhow::Result<AuthServer> {
        let bin = programs
            .iter()
            .copied()
            .find(|b| {
                std::process::Command::new(b)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok()
            })
            .with_context(|| {
                format!(
                    "{} not installed (scripts/test.sh installs it)",
                    programs[0]
                )
            })?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let store = tempfile::tempdir()?;
        let child = std::process::Command::new(bin)
            .args(args(port, &store.path().display().to_string()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let server = AuthServer {
            child,
            port,
            _store: store,
        };
        outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await
        .with_context(|| format!("{bin} never listened on {port}"))?;
        Ok(server)
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a relay with `sink` over 50 fresh events until they are all delivered, then counts
/// them at the broker with `count`; the relay's log must hold no secret.
async fn relay_delivers<F, Fut>(
    work: &Workdir,
    sink: &str,
    name: &str,
    count: F,
) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    relay_delivers_hiding(work, sink, name, &[], count)
        .await
        .map(drop)
}

/// [`relay_delivers`], and `hidden` (secrets of this test) appears nowhere: not in what
/// `check-config`, `migrate` and `doctor` (green) print, nor in the relay's log, which is at
/// `debug` level for every crate when `hidden` is not empty. Returns `check-config`'s output.
async fn relay_delivers_hiding<F, Fut>(
    work: &Workdir,
    sink: &str,
    name: &str,
    hidden: &[&str],
    count: F,
) -> anyhow::Result<String>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    let url = Postgres::shared().await?.fresh_database().await?;
    let config = work.write_config(
        &format!("{name}.toml"),
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n{sink}"),
    )?;
    let cfg = config.to_str().context("path")?;
    let prints_nothing_hidden = |what: &str, out: &support::Output| {
        ensure!(
            hidden
                .iter()
                .all(|s| !out.stdout.contains(s) && !out.stderr.contains(s)),
            "{what} printed a secret: {out:?}"
        );
        Ok(())
    };
    let checked = work.run(&["check-config", "--config", cfg]).await?;
    ensure!(checked.code == Some(0), "check-config: {checked:?}");
    prints_nothing_hidden("check-config", &checked)?;
    let migrated = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(migrated.code == Some(0), "migrate: {migrated:?}");
    prints_nothing_hidden("migrate", &migrated)?;
    let pool = sqlx::PgPool::connect(&url).await?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'Order', 'o' || (g % 5), 'order.step', 'x' FROM generate_series(1, 50) AS g")
        .execute(&pool)
        .await?;
    let log = format!("{name}.log");
    let mut relay = if hidden.is_empty() {
        work.spawn_relay(&config, &log)?
    } else {
        let doctor = work.run(&["doctor", "--config", cfg]).await?;
        ensure!(doctor.code == Some(0), "doctor: {doctor:?}");
        prints_nothing_hidden("doctor", &doctor)?;
        let file = std::fs::File::create(work.path().join(&log))?;
        work.command(&["relay", "--config", cfg])
            .env("OUTBOX_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .context("spawning outbox relay")?
    };
    support::wait_drained(&pool, Duration::from_secs(60))
        .await
        .with_context(|| work.read_log(&log))?;
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    let got = count().await?;
    ensure!(got == 50, "{got} messages at the broker ({name})");
    let text = work.read_log(&log);
    ensure!(
        [TOKEN, PASSWORD, REDIS_PASSWORD]
            .iter()
            .chain(hidden)
            .all(|s| !text.contains(s)),
        "the relay log printed a secret:\n{text}"
    );
    ensure!(
        hidden.is_empty() || text.contains(" DEBUG "),
        "the relay logged at debug level:\n{text}"
    );
    Ok(checked.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_sink_authenticates_with_a_token_or_a_password_and_says_when_refused()
-> anyhow::Result<()> {
    let work = Workdir::new()?;

    // A token, read from a file.
    let server = AuthServer::nats(&["--auth", TOKEN]).await?;
    let token_file = work.path().join("nats.token");
    std::fs::write(&token_file, format!("{TOKEN}\n"))?;
    let client = async_nats::ConnectOptions::with_token(TOKEN.into())
        .connect(format!("nats://127.0.0.1:{}", server.port))
        .await?;
    let sink = format!(
        "[sink]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:{}\"\ntoken_file = \"{}\"\n{}",
        server.port,
        token_file.display(),
        nats_stream("AUTHTOK")
    );
    relay_delivers(&work, &sink, "nats-token", || {
        count_stream(client, "AUTHTOK")
    })
    .await?;

    // The wrong token: doctor is red, says why, prints no token.
    let wrong = format!(
        "[sink]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:{}\"\ntoken = \"{TOKEN}-wrong\"\nconnect_timeout = \"2s\"\n",
        server.port
    );
    doctor_refuses(
        &work,
        "wrong-nats",
        &wrong,
        "credentials refused: authorization violation",
    )
    .await?;
    drop(server);

    // A user and password in the URL.
    let server = AuthServer::nats(&["--user", "relay", "--pass", PASSWORD]).await?;
    let client =
        async_nats::ConnectOptions::with_user_and_password("relay".into(), PASSWORD.into())
            .connect(format!("nats://127.0.0.1:{}", server.port))
            .await?;
    let sink = format!(
        "[sink]\nkind = \"nats\"\nurl = \"nats://relay:{PASSWORD}@127.0.0.1:{}\"\n{}",
        server.port,
        nats_stream("AUTHPW")
    );
    relay_delivers(&work, &sink, "nats-password", || {
        count_stream(client, "AUTHPW")
    })
    .await?;
    Ok(())
}

/// NKey user authentication (`authorization { users = [ { nkey: "U..." } ] }`): the relay signs
/// the server's nonce with the seed from `nkey_seed_file` and delivers every event; the seed
/// appears in no command's output (`check-config` shows `nkey_seed = "***"`) and not in the
/// relay's debug log. A seed the server does not list, and a seed that is not a user's: `doctor`
/// is red and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_sink_authenticates_with_an_nkey_seed_and_never_prints_it() -> anyhow::Result<()> {
    use outbox_testkit::nats_auth;

    let work = Workdir::new()?;
    let user = nats_auth::nkey_user()?;
    let stranger = nats_auth::nkey_user()?;
    let conf = work.path().join("nkey-server.conf");
    std::fs::write(&conf, nats_auth::nkey_authorization(&[&user]))?;
    let server = AuthServer::nats(&["-c", conf.to_str().context("path")?]).await?;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let client = async_nats::ConnectOptions::new()
        .nkey(user.seed.clone())
        .connect(&url)
        .await?;
    // Without the key the server refuses: the test is about NKey authentication.
    ensure!(
        async_nats::connect(&url).await.is_err(),
        "the server admits clients without a key"
    );
    let sink_with = |name: &str, seed: &str| -> anyhow::Result<String> {
        let file = work.path().join(name);
        std::fs::write(&file, format!("{seed}\n"))?;
        Ok(format!(
            "[sink]\nkind = \"nats\"\nurl = \"{url}\"\nnkey_seed_file = \"{}\"\nconnect_timeout = \"2s\"\n{}",
            file.display(),
            nats_stream("AUTHNKEY")
        ))
    };
    let hidden = [user.seed.as_str(), stranger.seed.as_str()];
    let printed = relay_delivers_hiding(
        &work,
        &sink_with("relay.nk", &user.seed)?,
        "nats-nkey",
        &hidden,
        || count_stream(client, "AUTHNKEY"),
    )
    .await?;
    ensure!(
        printed.contains("nkey_seed = \"***\""),
        "check-config shows the seed as ***: {printed}"
    );

    doctor_refuses_hiding(
        &work,
        "nats-nkey-unknown",
        &sink_with("stranger.nk", &stranger.seed)?,
        "credentials refused: authorization violation",
        &hidden,
    )
    .await?;
    let account_seed = nkeys::KeyPair::new_account().seed()?;
    doctor_refuses_hiding(
        &work,
        "nats-nkey-account",
        &sink_with("account.nk", &account_seed)?,
        "sink.nkey_seed: is the seed of a key of type Account, not of a user key",
        &[&account_seed],
    )
    .await?;
    Ok(())
}

/// Operator (decentralised JWT) mode: the server trusts an operator and preloads its accounts
/// (`resolver: MEMORY`); the relay's `.creds` file (`credentials`) holds a user JWT signed by
/// a JetStream-enabled account and the user's NKey seed. The relay delivers every event, and
/// the seed appears in no command's output nor in the relay's debug log. A `.creds` file of a
/// user of an account the server does not trust: `doctor` is red and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_sink_authenticates_with_a_creds_file_in_operator_mode() -> anyhow::Result<()> {
    use outbox_testkit::nats_auth::{Account, Operator};

    let work = Workdir::new()?;
    let mut operator = Operator::new("outbox-test")?;
    let account = operator.add_account("OUTBOX")?;
    let conf = work.path().join("operator-server.conf");
    std::fs::write(&conf, operator.server_config())?;
    let server = AuthServer::nats(&["-c", conf.to_str().context("path")?]).await?;
    let url = format!("nats://127.0.0.1:{}", server.port);
    let client = async_nats::ConnectOptions::with_credentials(&account.user_creds("test")?)?
        .connect(&url)
        .await?;
    ensure!(
        async_nats::connect(&url).await.is_err(),
        "the server admits clients without credentials"
    );
    let creds_sink = |name: &str, creds: &str| -> anyhow::Result<String> {
        let file = work.path().join(name);
        std::fs::write(&file, creds)?;
        Ok(format!(
            "[sink]\nkind = \"nats\"\nurl = \"{url}\"\ncredentials = \"{}\"\nconnect_timeout = \"2s\"\n{}",
            file.display(),
            nats_stream("AUTHCREDS")
        ))
    };
    let relay_creds = account.user_creds("relay")?;
    let foreign_creds = Account::untrusted("OTHER")?.user_creds("relay")?;
    let seeds = [creds_seed(&relay_creds)?, creds_seed(&foreign_creds)?];
    let hidden = [seeds[0].as_str(), seeds[1].as_str()];
    relay_delivers_hiding(
        &work,
        &creds_sink("relay.creds", &relay_creds)?,
        "nats-creds",
        &hidden,
        || count_stream(client, "AUTHCREDS"),
    )
    .await?;
    doctor_refuses_hiding(
        &work,
        "nats-creds-foreign",
        &creds_sink("foreign.creds", &foreign_creds)?,
        "credentials refused: authorization violation",
        &hidden,
    )
    .await?;
    Ok(())
}

/// The NKey seed (`SU...`) in the text of a `.creds` file.
fn creds_seed(creds: &str) -> anyhow::Result<String> {
    creds
        .lines()
        .find(|l| l.starts_with("SU"))
        .map(str::to_owned)
        .context("no seed in the creds file")
}

/// TLS: the server's certificate verified with the configured CA (`tls_ca`), and a server that
/// verifies clients accepts the relay's certificate (`tls_cert`, `tls_key`). A CA that did
/// not sign the server's certificate: `doctor` is red and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nats_sink_verifies_the_server_with_the_configured_ca_and_presents_its_certificate()
-> anyhow::Result<()> {
    outbox_testkit::tls::install_crypto_provider();
    let work = Workdir::new()?;
    let ca = outbox_testkit::tls::TestCa::generate(&work.path().join("tls"))?;
    let foreign = outbox_testkit::tls::TestCa::generate(&work.path().join("foreign"))?;
    let (cert, key, ca_file) = (
        ca.server_cert.display().to_string(),
        ca.server_key.display().to_string(),
        ca.ca_cert.display().to_string(),
    );
    let server = AuthServer::nats(&[
        "--tls",
        "--tlscert",
        &cert,
        "--tlskey",
        &key,
        "--tlsverify",
        "--tlscacert",
        &ca_file,
    ])
    .await?;
    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(ca.ca_cert.clone())
        .add_client_certificate(ca.client_cert.clone(), ca.client_key.clone())
        .require_tls(true)
        .connect(format!("nats://127.0.0.1:{}", server.port))
        .await?;
    let tls = |trusted: &std::path::Path| {
        format!(
            "[sink]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:{}\"\ntls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nconnect_timeout = \"2s\"\n",
            server.port,
            trusted.display(),
            ca.client_cert.display(),
            ca.client_key.display(),
        )
    };
    let sink = format!("{}{}", tls(&ca.ca_cert), nats_stream("TLSMUTUAL"));
    relay_delivers(&work, &sink, "nats-tls", || {
        count_stream(client, "TLSMUTUAL")
    })
    .await?;
    doctor_refuses(
        &work,
        "nats-foreign-ca",
        &tls(&foreign.ca_cert),
        "cannot connect to NATS",
    )
    .await?;
    Ok(())
}

fn nats_stream(stream: &str) -> String {
    format!("stream = \"{stream}\"\ndestination = \"{stream}.{{aggregate_id}}\"\n")
}

async fn count_stream(client: async_nats::Client, stream: &str) -> anyhow::Result<usize> {
    Ok(read_stream(&client, stream).await?.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_sink_authenticates_as_an_acl_user_and_says_when_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let server = AuthServer::redis(REDIS_PASSWORD).await?;
    let url = format!("redis://relay:{REDIS_PASSWORD}@127.0.0.1:{}", server.port);
    let sink = format!("[sink]\nkind = \"redis\"\nurl = \"{url}\"\ndestination = \"acl.orders\"\n");
    relay_delivers(&work, &sink, "redis-acl", || async {
        let mut conn = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let n: usize = redis::cmd("XLEN")
            .arg("acl.orders")
            .query_async(&mut conn)
            .await?;
        Ok(n)
    })
    .await?;

    let wrong = format!(
        "[sink]\nkind = \"redis\"\nurl = \"redis://relay:{REDIS_PASSWORD}-wrong@127.0.0.1:{}\"\nconnect_timeout = \"2s\"\n",
        server.port
    );
    doctor_refuses(&work, "wrong-redis", &wrong, "refused the credentials").await?;
    Ok(())
}

/// `rediss://`: the server verified with `tls_ca`, the relay's client certificate accepted by
/// a server that requires one; a foreign CA makes `doctor` red.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_sink_speaks_tls_verifying_the_server_and_presenting_its_certificate()
-> anyhow::Result<()> {
    outbox_testkit::tls::install_crypto_provider();
    let work = Workdir::new()?;
    let ca = outbox_testkit::tls::TestCa::generate(&work.path().join("tls"))?;
    let foreign = outbox_testkit::tls::TestCa::generate(&work.path().join("foreign"))?;
    let files = [&ca.server_cert, &ca.server_key, &ca.ca_cert].map(|p| p.display().to_string());
    let server = AuthServer::start(&["redis-server", "/usr/bin/redis-server"], |port, store| {
        [
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &files[0],
            "--tls-key-file",
            &files[1],
            "--tls-ca-cert-file",
            &files[2],
            "--tls-auth-clients",
            "yes",
            "--dir",
            store,
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect()
    })
    .await?;
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let sink = |trusted: &std::path::Path| {
        format!(
            "[sink]\nkind = \"redis\"\nurl = \"{url}\"\ndestination = \"tls.orders\"\ntls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nconnect_timeout = \"2s\"\n",
            trusted.display(),
            ca.client_cert.display(),
            ca.client_key.display()
        )
    };
    let certificates = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: std::fs::read(&ca.client_cert)?,
            client_key: std::fs::read(&ca.client_key)?,
        }),
        root_cert: Some(std::fs::read(&ca.ca_cert)?),
    };
    relay_delivers(&work, &sink(&ca.ca_cert), "redis-tls", || async {
        let mut conn = redis::Client::build_with_tls(url.as_str(), certificates)?
            .get_multiplexed_async_connection()
            .await?;
        let n: usize = redis::cmd("XLEN")
            .arg("tls.orders")
            .query_async(&mut conn)
            .await?;
        Ok(n)
    })
    .await?;
    doctor_refuses(
        &work,
        "redis-foreign-ca",
        &sink(&foreign.ca_cert),
        "cannot connect",
    )
    .await?;
    Ok(())
}

/// `amqps://`: the broker verified with `tls_ca`, the relay's client certificate required by
/// the broker (`verify_peer`, `fail_if_no_peer_cert`); a foreign CA makes `doctor` red. Then
/// `EXTERNAL` authentication (`rabbitmq_auth_mechanism_ssl`, the user name from the
/// certificate's common name): with `?auth_mechanism=external` and no password in the URL the
/// relay logs in as its certificate's CN and delivers every event; a certificate (signed by
/// the same CA) whose CN is no user is refused, and `doctor` says so. The test's own
/// connection (queue set-up, counting) uses the broker's plain listener.
#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rabbitmq_sink_speaks_tls_verifying_the_broker_and_presenting_its_certificate()
-> anyhow::Result<()> {
    use lapin::options::{QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    use lapin::{Connection, ConnectionProperties};

    outbox_testkit::tls::install_crypto_provider();
    let work = Workdir::new()?;
    let ca = outbox_testkit::tls::TestCa::generate(&work.path().join("tls"))?;
    let foreign = outbox_testkit::tls::TestCa::generate(&work.path().join("foreign"))?;
    let broker = outbox_testkit::services::RabbitMq::start().await?;
    let amqps = broker.enable_tls_and_external_auth(&ca).await?;
    let connection = Connection::connect(broker.url(), ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    for prefix in ["tls", "ext"] {
        channel
            .queue_declare(
                format!("{prefix}.orders").as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                format!("{prefix}.orders").as_str().into(),
                "amq.topic".into(),
                format!("{prefix}.#").as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }
    let count = |queue: &'static str| {
        let channel = channel.clone();
        async move {
            let queue = channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            Ok(queue.message_count() as usize)
        }
    };
    let sink = |trusted: &std::path::Path| {
        format!(
            "[sink]\nkind = \"rabbitmq\"\nurl = \"{amqps}\"\nexchange = \"amq.topic\"\ndeclare_exchange = false\ndestination = \"tls.{{aggregate_id}}\"\ntls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nconnect_timeout = \"3s\"\n",
            trusted.display(),
            ca.client_cert.display(),
            ca.client_key.display()
        )
    };
    relay_delivers(&work, &sink(&ca.ca_cert), "rabbitmq-tls", || {
        count("tls.orders")
    })
    .await?;
    doctor_refuses(
        &work,
        "rabbitmq-foreign-ca",
        &sink(&foreign.ca_cert),
        "RabbitMQ",
    )
    .await?;

    // EXTERNAL: no user or password in the URL; the certificate's CN is the user.
    broker.add_certificate_user("outbox-relay").await?;
    let external = format!(
        "{}?auth_mechanism=external",
        amqps.replacen("guest:guest@", "", 1)
    );
    let by_certificate = |cert: &std::path::Path, key: &std::path::Path| {
        format!(
            "[sink]\nkind = \"rabbitmq\"\nurl = \"{external}\"\nexchange = \"amq.topic\"\ndeclare_exchange = false\ndestination = \"ext.{{aggregate_id}}\"\ntls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\nconnect_timeout = \"3s\"\n",
            ca.ca_cert.display(),
            cert.display(),
            key.display()
        )
    };
    relay_delivers(
        &work,
        &by_certificate(&ca.client_cert, &ca.client_key),
        "rabbitmq-external",
        || count("ext.orders"),
    )
    .await?;
    let users = broker.list_users().await?;
    ensure!(
        users.contains("outbox-relay") && !users.contains("not-a-user"),
        "the broker has a user `outbox-relay` and none `not-a-user`: {users}"
    );
    let (stranger_cert, stranger_key) = client_certificate(&ca, "not-a-user")?;
    doctor_refuses(
        &work,
        "rabbitmq-external-unknown",
        &by_certificate(&stranger_cert, &stranger_key),
        // Refused as EXTERNAL: had the sink fallen back to PLAIN, lapin's default guest would
        // have been let in.
        "ACCESS_REFUSED - Login was refused using authentication mechanism EXTERNAL",
    )
    .await?;
    Ok(())
}

/// A client certificate for `cn` signed by `ca` (with `openssl`, like `TestCa`'s own), in
/// `ca`'s directory: `(certificate, key)`.
#[cfg(feature = "rabbitmq")]
fn client_certificate(
    ca: &outbox_testkit::tls::TestCa,
    cn: &str,
) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    let dir = ca.ca_cert.parent().context("the CA's directory")?;
    let file = |ext: &str| dir.join(format!("{cn}.{ext}"));
    let run = |cmd: &mut std::process::Command| -> anyhow::Result<()> {
        let out = cmd.output().context("running openssl")?;
        ensure!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    run(std::process::Command::new("openssl")
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-subj", &format!("/CN={cn}")])
        .arg("-keyout")
        .arg(file("key"))
        .arg("-out")
        .arg(file("csr")))?;
    std::fs::write(
        file("ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )?;
    run(std::process::Command::new("openssl")
        .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
        .arg("-in")
        .arg(file("csr"))
        .arg("-CA")
        .arg(&ca.ca_cert)
        .arg("-CAkey")
        .arg(dir.join("ca.key"))
        .arg("-extfile")
        .arg(file("ext"))
        .arg("-out")
        .arg(file("pem")))?;
    Ok((file("pem"), file("key")))
}

/// HTTPS with mutual TLS: the endpoint verified with `tls_ca` only (a private CA), the
/// relay's client certificate required by the endpoint; a foreign CA makes `doctor` red.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_sink_verifies_a_private_ca_and_presents_its_client_certificate()
-> anyhow::Result<()> {
    outbox_testkit::tls::install_crypto_provider();
    let work = Workdir::new()?;
    let ca = outbox_testkit::tls::TestCa::generate(&work.path().join("tls"))?;
    let foreign = outbox_testkit::tls::TestCa::generate(&work.path().join("foreign"))?;
    let hooks = outbox_testkit::services::HttpReceiver::start().await?;
    let front = outbox_testkit::tls::TlsFront::start(&ca, hooks.addr()).await?;
    let sink = |trusted: &std::path::Path| {
        format!(
            "[sink]\nkind = \"http\"\nurl = \"{}/in\"\ntls_ca = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\ntimeout = \"3s\"\n",
            front.url(),
            trusted.display(),
            ca.client_cert.display(),
            ca.client_key.display()
        )
    };
    relay_delivers(&work, &sink(&ca.ca_cert), "http-tls", || async {
        // Events are POSTs; the relay's start-up health check is not one.
        Ok(hooks
            .received()
            .iter()
            .filter(|r| r.accepted() && r.method == "POST")
            .count())
    })
    .await?;
    doctor_refuses(
        &work,
        "http-foreign-ca",
        &sink(&foreign.ca_cert),
        "certificate",
    )
    .await?;
    Ok(())
}

/// `outbox doctor` on `sink` (a wrong secret): red, exit 1, the verdict says `expected`, no
/// log chatter beside it, and no secret of this file printed.
async fn doctor_refuses(
    work: &Workdir,
    name: &str,
    sink: &str,
    expected: &str,
) -> anyhow::Result<()> {
    doctor_refuses_hiding(work, name, sink, expected, &[]).await
}

/// [`doctor_refuses`], and none of `hidden` printed either.
async fn doctor_refuses_hiding(
    work: &Workdir,
    name: &str,
    sink: &str,
    expected: &str,
    hidden: &[&str],
) -> anyhow::Result<()> {
    let config = work.write_config(&format!("{name}.toml"), sink)?;
    let out = work
        .run_as_user(&["doctor", "--config", config.to_str().context("path")?])
        .await?;
    ensure!(out.code == Some(1), "{out:?}");
    ensure!(
        !out.stderr.contains("ERROR") && !out.stderr.contains("WARN"),
        "log chatter beside the verdict: {}",
        out.stderr
    );
    let all = format!("{}{}", out.stdout, out.stderr);
    ensure!(
        all.contains(expected),
        "the verdict should say `{expected}`: {all}"
    );
    ensure!(
        [TOKEN, PASSWORD, REDIS_PASSWORD]
            .iter()
            .chain(hidden)
            .all(|s| !all.contains(s)),
        "a secret was printed: {all}"
    );
    Ok(())
}
