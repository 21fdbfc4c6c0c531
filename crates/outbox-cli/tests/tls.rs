//! PostgreSQL over TLS, as an operator configures it: `sslmode=verify-full` with the CA in
//! `sslrootcert`. `outbox migrate` and the relay in both modes connect; every connection the
//! relay opens — its pools and, in CDC mode, the replication session — is encrypted (checked
//! in `pg_stat_ssl`); a CA that did not sign the server's certificate is refused with a clear
//! error.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use outbox_testkit::tls::TestCa;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use support::{Workdir, terminate};

/// Relay sessions on `database` that are not encrypted, and all relay sessions (the test's
/// own, named `tls-test`, excluded), with the replication sessions among them.
const SESSIONS: &str = "SELECT count(*) FILTER (WHERE NOT s.ssl), count(*), \
     count(*) FILTER (WHERE a.backend_type = 'walsender' AND s.ssl) \
     FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
     WHERE a.datname = $1 AND a.application_name <> 'tls-test' \
     AND a.backend_type IN ('client backend', 'walsender')";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_relays_in_both_modes_use_verified_tls_and_refuse_a_foreign_ca()
-> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let work = Workdir::new()?;
    let ca = TestCa::generate(&work.path().join("tls"))?;
    let foreign = TestCa::generate(&work.path().join("other"))?;
    let pg = Postgres::start_private().await?;
    pg.enable_tls(&ca.server_cert, &ca.server_key).await?;
    let plain = pg.fresh_database().await?;
    let database = plain
        .rsplit('/')
        .next()
        .context("database name")?
        .to_owned();
    let verified = |ca: &TestCa| {
        format!(
            "{plain}?sslmode=verify-full&sslrootcert={}",
            ca.ca_cert.display()
        )
    };
    let hooks = HttpReceiver::start().await?;
    let options: PgConnectOptions = plain
        .parse::<PgConnectOptions>()?
        .application_name("tls-test");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await?;

    for (round, mode) in ["poll", "cdc"].into_iter().enumerate() {
        let tag = format!("tls{round}{}", uuid::Uuid::new_v4().simple());
        let config = |url: &str| {
            format!(
                "[source]\nkind = \"postgres\"\nurl = \"{url}\"\nmode = \"{mode}\"\ntable = \"{tag}\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
                hooks.url_for("/in")
            )
        };
        // A CA that did not sign the server's certificate: refused, and said so.
        let wrong =
            work.write_config(&format!("wrong-{mode}.toml"), &config(&verified(&foreign)))?;
        let out = work
            .run(&["migrate", "--config", wrong.to_str().context("path")?])
            .await?;
        out.assert_clear_error("invalid peer certificate")?;

        let path = work.write_config(&format!("{mode}.toml"), &config(&verified(&ca)))?;
        let cfg = path.to_str().context("path")?;
        let out = work.run(&["migrate", "--config", cfg]).await?;
        ensure!(out.code == Some(0), "migrate over TLS: {out:?}");
        let mut relay = work.spawn_relay(&path, &format!("relay-{mode}.log"))?;
        let before = hooks.received().len();
        for i in 0..5 {
            // `tag` is hex and letters only: safe to splice as the table name.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO \"{tag}\" (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o1', 'order.step', '{i}')"
            )))
            .execute(&pool)
            .await?;
        }
        hooks
            .wait_until(
                &format!("five events relayed in {mode} mode"),
                Duration::from_secs(60),
                |reqs| reqs.iter().skip(before).filter(|r| r.accepted()).count() >= 5,
            )
            .await
            .with_context(|| work.read_log(&format!("relay-{mode}.log")))?;
        let (unencrypted, sessions, replication): (i64, i64, i64) = sqlx::query_as(SESSIONS)
            .bind(&database)
            .fetch_one(&pool)
            .await?;
        ensure!(sessions > 0, "the relay has sessions on {database}");
        ensure!(
            unencrypted == 0,
            "{unencrypted} of {sessions} relay sessions are not encrypted in {mode} mode"
        );
        if mode == "cdc" {
            ensure!(replication == 1, "the replication session is encrypted");
        }
        ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    }
    Ok(())
}

/// MySQL/MariaDB over TLS, as an operator configures it: `ssl-mode=verify_identity` with the
/// CA in `ssl-ca`, for a user the server accepts only over TLS (`REQUIRE SSL`, so every
/// session the relay opens is encrypted or refused). `migrate`, `doctor` (which reports the
/// session's TLS) and the relay work; a CA that did not sign the server's certificate is
/// refused with a clear error, as is a plain connection, and no command prints the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_migrate_doctor_and_relay_use_verified_tls_and_refuse_a_foreign_ca()
-> anyhow::Result<()> {
    use outbox_testkit::services::MariaDb;

    outbox_testkit::init_tracing();
    let work = Workdir::new()?;
    let ca = TestCa::generate(&work.path().join("tls"))?;
    let foreign = TestCa::generate(&work.path().join("other"))?;
    let server = MariaDb::start().await?;
    server.enable_tls(&ca.server_cert, &ca.server_key).await?;
    let admin_url = server.fresh_database().await?;
    let database = admin_url.rsplit('/').next().context("database")?.to_owned();
    let admin = sqlx::MySqlPool::connect(&admin_url).await?;
    // `database` is built by the test kit from hex digits: safe to splice.
    for sql in [
        // The private server writes a binlog: let the relay's user create the trigger.
        "SET GLOBAL log_bin_trust_function_creators = 1".to_owned(),
        "CREATE USER 'relay'@'%' IDENTIFIED BY 'Tls%Pa55:w0rd' REQUIRE SSL".to_owned(),
        format!("GRANT ALL ON {database}.* TO 'relay'@'%'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await?;
    }
    let hooks = HttpReceiver::start().await?;
    let port = server.port();
    let config = |name: &str, query: &str| {
        work.write_config(
            name,
            &format!(
                "[source]\nkind = \"mysql\"\nurl = \"mysql://relay:Tls%25Pa55%3Aw0rd@127.0.0.1:{port}/{database}?{query}\"\n\
                 connect_timeout = \"5s\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
                hooks.url_for("/in")
            ),
        )
    };
    let verified =
        |ca: &TestCa| format!("ssl-mode=verify_identity&ssl-ca={}", ca.ca_cert.display());
    let no_password = |out: &support::Output, what: &str| {
        ensure!(
            !out.stdout.contains("Pa55") && !out.stderr.contains("Pa55"),
            "{what} printed the password: {out:?}"
        );
        Ok(())
    };

    // A CA that did not sign the server's certificate: refused, and said so.
    let wrong = config("wrong.toml", &verified(&foreign))?;
    let out = work
        .run(&["migrate", "--config", wrong.to_str().context("path")?])
        .await?;
    out.assert_clear_error("invalid peer certificate")?;
    no_password(&out, "migrate with a foreign CA")?;
    // No TLS: the server refuses this user.
    let plain = config("plain.toml", "ssl-mode=disabled")?;
    let out = work
        .run(&["migrate", "--config", plain.to_str().context("path")?])
        .await?;
    out.assert_clear_error("Access denied")?;
    no_password(&out, "migrate without TLS")?;

    let path = config("tls.toml", &verified(&ca))?;
    let cfg = path.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "migrate over TLS: {out:?}");
    let out = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "doctor over TLS: {out:?}");
    ensure!(
        out.stdout
            .lines()
            .any(|l| l.contains("connection") && l.contains("TLS (TLSv1.")),
        "doctor reports the session's TLS: {}",
        out.stdout
    );
    no_password(&out, "doctor")?;

    let mut relay = work.spawn_relay(&path, "relay-mysql.log")?;
    let producer = sqlx::MySqlPool::connect(&admin_url).await?;
    let outbox = outbox_mysql::MySqlOutbox::default();
    for i in 0..5 {
        let mut tx = producer.begin().await?;
        outbox
            .enqueue(
                &mut tx,
                &outbox_core::NewEvent::new("Order", "o1", "order.step", format!("{i}")),
            )
            .await?;
        tx.commit().await?;
    }
    hooks
        .wait_until(
            "five events relayed over TLS",
            Duration::from_secs(60),
            |reqs| reqs.iter().filter(|r| r.accepted()).count() >= 5,
        )
        .await
        .with_context(|| work.read_log("relay-mysql.log"))?;
    let sessions: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'relay'",
    )
    .fetch_one(&admin)
    .await?;
    ensure!(
        sessions > 0,
        "the relay's sessions (all TLS: the user requires it)"
    );
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    ensure!(
        !work.read_log("relay-mysql.log").contains("Pa55"),
        "the relay's log holds the password"
    );
    Ok(())
}

/// MySQL binlog CDC (`mode = "cdc"`) over TLS: the binlog session (`mysql_async`, configured
/// from the same URL's `ssl-mode=verify_identity&ssl-ca=…`) is encrypted and verifies the
/// server. The relay's user is created `REQUIRE SSL`, so the server admits its binlog session
/// (seen as `Binlog Dump` in the process list) only over TLS. `doctor`'s replication check
/// opens a binlog session too. Then the server's certificate is replaced by one a foreign CA
/// signed (`FLUSH SSL`) and the binlog session is cut: the relay cannot stream again (it
/// reconnects its CDC lock session first, with the same TLS settings, and that is refused with
/// `invalid peer certificate`), says so, and no binlog session comes back; with the right
/// certificate restored, the relay reconnects and delivers the events committed meanwhile.
/// (Every binlog connection is preceded by a sqlx one from the same URL, so a refusal of the
/// binlog connection alone cannot be provoked through the binary.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_binlog_cdc_uses_verified_tls_and_refuses_a_foreign_certificate() -> anyhow::Result<()>
{
    use outbox_testkit::services::MariaDb;

    outbox_testkit::init_tracing();
    let work = Workdir::new()?;
    let ca = TestCa::generate(&work.path().join("tls"))?;
    let foreign = TestCa::generate(&work.path().join("other"))?;
    let server = MariaDb::start().await?;
    server.enable_tls(&ca.server_cert, &ca.server_key).await?;
    let admin_url = server.fresh_database().await?;
    let database = admin_url.rsplit('/').next().context("database")?.to_owned();
    let admin = sqlx::MySqlPool::connect(&admin_url).await?;
    // `database` is built by the test kit from hex digits: safe to splice.
    for sql in [
        "SET GLOBAL log_bin_trust_function_creators = 1".to_owned(),
        "CREATE USER 'relay'@'%' IDENTIFIED BY 'Cdc%Pa55:w0rd' REQUIRE SSL".to_owned(),
        format!("GRANT ALL ON {database}.* TO 'relay'@'%'"),
        // Binlog CDC reads the binlog as this user (MariaDB: REPLICATION REPLICA, BINLOG MONITOR).
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'%'".to_owned(),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await?;
    }
    let hooks = HttpReceiver::start().await?;
    let port = server.port();
    let path = work.write_config(
        "cdc.toml",
        &format!(
            "[source]\nkind = \"mysql\"\nurl = \"mysql://relay:Cdc%25Pa55%3Aw0rd@127.0.0.1:{port}/{database}?ssl-mode=verify_identity&ssl-ca={}\"\n\
             mode = \"cdc\"\nconnect_timeout = \"5s\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            ca.ca_cert.display(),
            hooks.url_for("/in")
        ),
    )?;
    let cfg = path.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "migrate in CDC mode over TLS: {out:?}");
    let out = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "doctor in CDC mode over TLS: {out:?}");
    ensure!(
        out.stdout
            .lines()
            .any(|l| l.contains("replication") && l.contains("may read the binlog")),
        "doctor read the binlog over TLS: {}",
        out.stdout
    );
    ensure!(
        !out.stdout.contains("Pa55") && !out.stderr.contains("Pa55"),
        "doctor printed the password: {out:?}"
    );

    let log = "relay-cdc.log";
    let mut relay = work.spawn_relay(&path, log)?;
    let producer = sqlx::MySqlPool::connect(&admin_url).await?;
    let outbox = outbox_mysql::MySqlOutbox::default();
    let enqueue = |from: usize, to: usize| {
        let (producer, outbox) = (&producer, &outbox);
        async move {
            for i in from..to {
                let mut tx = producer.begin().await?;
                outbox
                    .enqueue(
                        &mut tx,
                        &outbox_core::NewEvent::new("Order", "o1", "order.step", format!("{i}")),
                    )
                    .await?;
                tx.commit().await?;
            }
            anyhow::Ok(())
        }
    };
    enqueue(0, 5).await?;
    let delivered = |n: usize| {
        move |reqs: &[outbox_testkit::services::Request]| {
            reqs.iter().filter(|r| r.accepted()).count() >= n
        }
    };
    hooks
        .wait_until(
            "five events streamed from the binlog over TLS",
            Duration::from_secs(60),
            delivered(5),
        )
        .await
        .with_context(|| work.read_log(log))?;
    // The relay's binlog session: admitted (the user requires TLS), hence encrypted.
    let dumps = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT ID FROM information_schema.PROCESSLIST \
             WHERE USER = 'relay' AND COMMAND LIKE 'Binlog Dump%'",
        )
        .fetch_all(&admin)
        .await
    };
    let sessions = dumps().await?;
    ensure!(
        sessions.len() == 1,
        "one binlog session of the relay's TLS-only user: {sessions:?}"
    );

    // A certificate the configured CA did not sign: the stream cannot come back.
    server
        .replace_tls(&foreign.server_cert, &foreign.server_key)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {}", sessions[0])))
        .execute(&admin)
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        let text = work.read_log(log);
        text.contains("binlog stream lost")
            && text
                .lines()
                .any(|l| l.contains("connecting for the") && l.contains("invalid peer certificate"))
    })
    .await
    .with_context(|| {
        format!(
            "the relay said why the binlog session failed: {}",
            work.read_log(log)
        )
    })?;
    ensure!(
        dumps().await?.is_empty(),
        "a binlog session came back with a foreign certificate"
    );
    enqueue(5, 7).await?;

    // The right certificate again: the relay reconnects on its own and catches up.
    server.replace_tls(&ca.server_cert, &ca.server_key).await?;
    hooks
        .wait_until(
            "the events committed meanwhile, once the certificate is right again",
            Duration::from_secs(90),
            delivered(7),
        )
        .await
        .with_context(|| work.read_log(log))?;
    // The killed session may linger in the process list a moment.
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        dumps()
            .await
            .is_ok_and(|d| d.len() == 1 && d[0] != sessions[0])
    })
    .await
    .context("a new binlog session, alone")?;
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    ensure!(
        !work.read_log(log).contains("Pa55"),
        "the relay's log holds the password"
    );
    Ok(())
}
