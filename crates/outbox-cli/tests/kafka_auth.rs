//! Kafka over TLS and with SASL/SCRAM, end to end through the binary against a real broker
//! (tansu, `outbox_testkit::services::Kafka::start_secured`): the relay's librdkafka speaks
//! TLS to a terminator that presents a certificate of a private CA, and/or authenticates with
//! SCRAM to a tansu started with `--authentication`. With the right settings every event
//! arrives (read back by a consumer); with a foreign CA or a wrong password `doctor` is red
//! with the reason and the relay delivers nothing, and nothing is lost once the config is
//! fixed. The SASL password is in no output of `check-config`, `doctor`, `status`, nor in the
//! relay's debug log.
//!
//! SASL needs a tansu built with the `libsql` feature (its SQL storage is where it keeps SCRAM
//! credentials); see `outbox_testkit::services::kafka`.

#![cfg(feature = "kafka")]

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{Kafka, KafkaSecurity, KafkaUser, Postgres, Scram};
use outbox_testkit::tls::TestCa;
use support::{Output, Workdir, terminate, wait_drained};

/// The relay's SCRAM password: no command may print it.
const PASSWORD: &str = "kafkaScramPw41";
/// A wrong password, as secret as the right one.
const WRONG_PASSWORD: &str = "kafkaWrongPw42";
/// Events per run.
const EVENTS: usize = 30;
/// Generous deadline of every wait (each one polls and ends as soon as it is satisfied).
const WAIT: Duration = Duration::from_secs(60);

/// One relay configuration against `kafka`: a fresh database, topic `topic` (created), and
/// `[sink.settings]` as given.
struct Setup<'a> {
    work: &'a Workdir,
    kafka: &'a Kafka,
    url: String,
    topic: String,
    pool: sqlx::PgPool,
}

impl<'a> Setup<'a> {
    async fn new(work: &'a Workdir, kafka: &'a Kafka) -> anyhow::Result<Setup<'a>> {
        let url = Postgres::shared().await?.fresh_database().await?;
        let topic = format!("auth-{}", &uuid::Uuid::now_v7().simple().to_string()[16..]);
        kafka.create_topic(&topic, 2).await?;
        let pool = sqlx::PgPool::connect(&url).await?;
        Ok(Setup {
            work,
            kafka,
            url,
            topic,
            pool,
        })
    }

    /// Writes `NAME.toml` with `settings` (TOML lines of `[sink.settings]`); migrates once.
    async fn config(&self, name: &str, settings: &str) -> anyhow::Result<String> {
        let path = self.work.write_config(
            &format!("{name}.toml"),
            &format!(
                r#"
[source]
kind = "postgres"
url = "{url}"
[relay]
publish_timeout = "15s"
[sink]
kind = "kafka"
brokers = "{brokers}"
destination = "{topic}"
delivery_timeout = "10s"
metadata_timeout = "3s"
[sink.settings]
{settings}
"#,
                url = self.url,
                brokers = self.kafka.brokers(),
                topic = self.topic,
            ),
        )?;
        let path = path.to_str().context("utf-8 path")?.to_owned();
        let migrated = self.work.run(&["migrate", "--config", &path]).await?;
        ensure!(migrated.code == Some(0), "migrate: {migrated:?}");
        Ok(path)
    }

    /// Inserts `n` events, each with a payload of its own.
    async fn insert(&self, n: usize) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'Order', 'o' || (g % 5), 'order.step', \
                    convert_to($2 || '-' || g, 'UTF8') \
             FROM generate_series(1, $1) AS g",
        )
        .bind(i32::try_from(n)?)
        .bind(uuid::Uuid::now_v7().to_string())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn pending(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'pending'")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Starts `outbox relay` with `config`, logging at `debug` for every crate to `log`.
    fn spawn_relay(&self, config: &str, log: &str) -> anyhow::Result<tokio::process::Child> {
        let file = std::fs::File::create(self.work.path().join(log))?;
        self.work
            .command(&["relay", "--config", config])
            .env("OUTBOX_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .context("spawning outbox relay")
    }

    /// `doctor` is green with `config`.
    async fn doctor_green(&self, config: &str) -> anyhow::Result<Output> {
        let out = self.work.run(&["doctor", "--config", config]).await?;
        ensure!(out.code == Some(0), "doctor: {out:?}");
        Ok(out)
    }

    /// `doctor` is red with `config`, and its verdict (stdout, not the log lines on stderr)
    /// says `reason`.
    async fn doctor_red(&self, config: &str, reason: &str) -> anyhow::Result<Output> {
        let out = self
            .work
            .run_as_user(&["doctor", "--config", config])
            .await?;
        eprintln!("doctor with {config}:\n{}{}", out.stdout, out.stderr);
        ensure!(out.code == Some(1), "doctor should be red: {out:?}");
        let verdict = out
            .stdout
            .lines()
            .find(|l| l.contains("RED") && l.contains("sink"))
            .with_context(|| format!("no red sink check: {out:?}"))?;
        ensure!(
            verdict.contains(reason),
            "doctor should say `{reason}`: {verdict}"
        );
        Ok(out)
    }

    /// Inserts `EVENTS` events, runs the relay with `config` until they are delivered, and
    /// reads them back from the topic (as many as were delivered in all, `total`).
    async fn relay_delivers(&self, config: &str, log: &str, total: usize) -> anyhow::Result<()> {
        let mut relay = self.spawn_relay(config, log)?;
        wait_drained(&self.pool, WAIT)
            .await
            .with_context(|| self.work.read_log(log))?;
        ensure!(terminate(&mut relay, WAIT).await? == Some(0));
        self.expect_at_broker(total).await
    }

    /// Exactly `n` messages on the topic, every payload a different event's.
    async fn expect_at_broker(&self, n: usize) -> anyhow::Result<()> {
        use rdkafka::Message as _;
        let messages = self.kafka.consume(&[&self.topic], n, WAIT).await?;
        let mut payloads: Vec<Vec<u8>> = messages
            .iter()
            .map(|m| m.payload().unwrap_or_default().to_vec())
            .collect();
        payloads.sort();
        payloads.dedup();
        ensure!(
            messages.len() == n && payloads.len() == n,
            "{} messages ({} distinct) on `{}`, expected {n}",
            messages.len(),
            payloads.len(),
            self.topic
        );
        Ok(())
    }
}

/// Fails when any of `hidden` is in `text`.
/// A broker with SCRAM users. tansu keeps users only in its SQL storage (`--features
/// dynostore,libsql`; `scripts/services.sh` builds it so): with an older build the test says
/// it was skipped and why, and passes.
async fn with_users(security: KafkaSecurity, test: &str) -> anyhow::Result<Option<Kafka>> {
    match Kafka::start_secured(security).await {
        Ok(kafka) => Ok(Some(kafka)),
        Err(e) if format!("{e:#}").contains("FeatureNotEnabled") => {
            eprintln!("SKIPPED {test}: this tansu cannot store SCRAM users: {e:#}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn prints_none(what: &str, text: &str, hidden: &[&str]) -> anyhow::Result<()> {
    for secret in hidden {
        ensure!(!text.contains(secret), "{what} printed a secret:\n{text}");
    }
    Ok(())
}

fn both(out: &Output) -> String {
    format!("{}{}", out.stdout, out.stderr)
}

/// `[sink.settings]` lines for SASL/SCRAM as `user` with `password` over `protocol`.
fn sasl_settings(protocol: &str, mechanism: Scram, user: &str, password: &str) -> String {
    format!(
        "\"security.protocol\" = \"{protocol}\"\n\"sasl.mechanism\" = \"{}\"\n\"sasl.username\" = \"{user}\"\n\"sasl.password\" = \"{password}\"\n",
        mechanism.sasl_mechanism()
    )
}

fn ca_setting(ca: &Path) -> String {
    format!("\"ssl.ca.location\" = \"{}\"\n", ca.display())
}

/// SASL/SCRAM without TLS (`SASL_PLAINTEXT`), both mechanisms tansu offers: the right password
/// delivers every event. A wrong password: `doctor` is red with the broker's reason, the relay
/// delivers nothing and keeps the events, and once the password is fixed they all arrive.
/// Neither password appears in `check-config`, `doctor`, `status` or the relay's debug log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_authenticates_to_kafka_with_scram_and_never_prints_the_password()
-> anyhow::Result<()> {
    let work = Workdir::new()?;
    let Some(kafka) = with_users(
        KafkaSecurity {
            tls: None,
            users: vec![
                KafkaUser::new("relay", PASSWORD, Scram::Sha512),
                KafkaUser::new("relay256", PASSWORD, Scram::Sha256),
            ],
        },
        "the_relay_authenticates_to_kafka_with_scram_and_never_prints_the_password",
    )
    .await?
    else {
        return Ok(());
    };
    ensure!(kafka.security_protocol() == "SASL_PLAINTEXT");
    let setup = Setup::new(&work, &kafka).await?;
    let hidden = [PASSWORD, WRONG_PASSWORD];

    // Without credentials the broker refuses the relay: the test is about authentication.
    let anonymous = setup.config("anonymous", "").await?;
    setup.doctor_red(&anonymous, "Kafka").await?;

    // A wrong password: red, with the reason; the relay keeps the events.
    let wrong = setup
        .config(
            "wrong",
            &sasl_settings("SASL_PLAINTEXT", Scram::Sha512, "relay", WRONG_PASSWORD),
        )
        .await?;
    let red = setup.doctor_red(&wrong, "SASL authentication").await?;
    prints_none("doctor (wrong password)", &both(&red), &hidden)?;
    setup.insert(EVENTS).await?;
    let mut relay = setup.spawn_relay(&wrong, "wrong.log")?;
    outbox_testkit::wait::eventually(WAIT, || async {
        work.read_log("wrong.log").contains("SASL authentication")
    })
    .await
    .with_context(|| format!("the relay never said why:\n{}", work.read_log("wrong.log")))?;
    let status = work.run(&["status", "--config", &wrong]).await?;
    prints_none("status", &both(&status), &hidden)?;
    ensure!(terminate(&mut relay, WAIT).await? == Some(0));
    // Nothing delivered (and so, below, exactly EVENTS messages once the password is right).
    ensure!(
        setup.pending().await? == i64::try_from(EVENTS)?,
        "events lost"
    );
    prints_none(
        "the relay's debug log",
        &work.read_log("wrong.log"),
        &hidden,
    )?;

    // The right password (SCRAM-SHA-512): everything arrives, nothing printed.
    let right = setup
        .config(
            "right",
            &sasl_settings("SASL_PLAINTEXT", Scram::Sha512, "relay", PASSWORD),
        )
        .await?;
    let checked = work.run(&["check-config", "--config", &right]).await?;
    ensure!(checked.code == Some(0), "check-config: {checked:?}");
    prints_none("check-config", &both(&checked), &hidden)?;
    ensure!(
        checked.stdout.contains(r#""sasl.password" = "***""#),
        "check-config shows the password as ***: {}",
        checked.stdout
    );
    let green = setup.doctor_green(&right).await?;
    prints_none("doctor", &both(&green), &hidden)?;
    setup.relay_delivers(&right, "right.log", EVENTS).await?;
    let log = work.read_log("right.log");
    prints_none("the relay's debug log", &log, &hidden)?;
    ensure!(log.contains(" DEBUG "), "the relay logged at debug level");
    let status = work.run(&["status", "--config", &right]).await?;
    ensure!(status.code == Some(0), "status: {status:?}");
    prints_none("status", &both(&status), &hidden)?;

    // SCRAM-SHA-256 as well.
    let sha256 = setup
        .config(
            "sha256",
            &sasl_settings("SASL_PLAINTEXT", Scram::Sha256, "relay256", PASSWORD),
        )
        .await?;
    setup.doctor_green(&sha256).await?;
    setup.insert(EVENTS).await?;
    setup
        .relay_delivers(&sha256, "sha256.log", 2 * EVENTS)
        .await?;
    prints_none(
        "the relay's debug log",
        &work.read_log("sha256.log"),
        &hidden,
    )?;
    Ok(())
}

/// TLS (`security.protocol = "SSL"`): the relay verifies the broker's certificate with a
/// private CA (`ssl.ca.location`) and delivers every event. With a CA that did not sign it,
/// `doctor` is red with the reason and the relay delivers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_reaches_kafka_over_tls_verifying_a_private_ca() -> anyhow::Result<()> {
    outbox_testkit::tls::install_crypto_provider();
    let work = Workdir::new()?;
    let ca = TestCa::generate(&work.path().join("tls"))?;
    let foreign = TestCa::generate(&work.path().join("foreign"))?;
    let kafka = Kafka::start_secured(KafkaSecurity {
        tls: Some(ca.clone()),
        users: Vec::new(),
    })
    .await?;
    ensure!(kafka.security_protocol() == "SSL");
    let setup = Setup::new(&work, &kafka).await?;

    // A plain client cannot talk to the TLS port: the test is about TLS.
    let plain = setup.config("plain", "").await?;
    setup.doctor_red(&plain, "Kafka").await?;

    let foreign_ca = setup
        .config(
            "foreign",
            &format!(
                "\"security.protocol\" = \"SSL\"\n{}",
                ca_setting(&foreign.ca_cert)
            ),
        )
        .await?;
    setup
        .doctor_red(&foreign_ca, "certificate verify failed")
        .await?;
    setup.insert(EVENTS).await?;
    let mut relay = setup.spawn_relay(&foreign_ca, "foreign.log")?;
    outbox_testkit::wait::eventually(WAIT, || async {
        work.read_log("foreign.log")
            .contains("certificate verify failed")
    })
    .await
    .with_context(|| {
        format!(
            "the relay never said why:\n{}",
            work.read_log("foreign.log")
        )
    })?;
    ensure!(terminate(&mut relay, WAIT).await? == Some(0));
    ensure!(
        setup.pending().await? == i64::try_from(EVENTS)?,
        "events lost"
    );

    let right = setup
        .config(
            "tls",
            &format!(
                "\"security.protocol\" = \"SSL\"\n{}",
                ca_setting(&ca.ca_cert)
            ),
        )
        .await?;
    setup.doctor_green(&right).await?;
    setup.relay_delivers(&right, "tls.log", EVENTS).await?;
    Ok(())
}

/// SASL/SCRAM over TLS (`SASL_SSL`), the usual production set-up: every event arrives, and the
/// password is in no output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_authenticates_with_scram_over_tls() -> anyhow::Result<()> {
    outbox_testkit::tls::install_crypto_provider();
    let work = Workdir::new()?;
    let ca = TestCa::generate(&work.path().join("tls"))?;
    let Some(kafka) = with_users(
        KafkaSecurity {
            tls: Some(ca.clone()),
            users: vec![KafkaUser::new("relay", PASSWORD, Scram::Sha512)],
        },
        "the_relay_authenticates_with_scram_over_tls",
    )
    .await?
    else {
        return Ok(());
    };
    ensure!(kafka.security_protocol() == "SASL_SSL");
    let setup = Setup::new(&work, &kafka).await?;
    let hidden = [PASSWORD, WRONG_PASSWORD];

    let wrong = setup
        .config(
            "wrong",
            &format!(
                "{}{}",
                sasl_settings("SASL_SSL", Scram::Sha512, "relay", WRONG_PASSWORD),
                ca_setting(&ca.ca_cert)
            ),
        )
        .await?;
    let red = setup.doctor_red(&wrong, "SASL authentication").await?;
    prints_none("doctor (wrong password)", &both(&red), &hidden)?;

    let right = setup
        .config(
            "sasl-ssl",
            &format!(
                "{}{}",
                sasl_settings("SASL_SSL", Scram::Sha512, "relay", PASSWORD),
                ca_setting(&ca.ca_cert)
            ),
        )
        .await?;
    let checked = work.run(&["check-config", "--config", &right]).await?;
    ensure!(checked.code == Some(0), "check-config: {checked:?}");
    prints_none("check-config", &both(&checked), &hidden)?;
    let green = setup.doctor_green(&right).await?;
    prints_none("doctor", &both(&green), &hidden)?;
    setup.insert(EVENTS).await?;
    setup.relay_delivers(&right, "sasl-ssl.log", EVENTS).await?;
    prints_none(
        "the relay's debug log",
        &work.read_log("sasl-ssl.log"),
        &hidden,
    )?;
    Ok(())
}
