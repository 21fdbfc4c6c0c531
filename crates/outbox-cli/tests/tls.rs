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
