//! `outbox crash-test` through the binary, against the real servers of the testkit: it passes
//! on PostgreSQL (polling and CDC), MariaDB and SQLite with NATS JetStream, fails against a
//! relay built with ordering broken on purpose (the `fault-injection` feature), and refuses
//! what it cannot run: a destination that cannot be read back, a database that looks like
//! production, an unreachable broker. Every run must leave no scratch table, slot or stream.
//!
//! The runs last 8 s (`--duration 8s`); everything else waits on the command itself, which
//! waits on the table's backlog, never on a fixed sleep.
//!
//! The failing run needs a binary built with `--features fault-injection`: scripts/test.sh
//! builds it as `target/debug/outbox-fault-injection` and passes it in `OUTBOX_FAULT_BIN`.
//! Without that variable the test says so and passes, except on CI (`CI=true`), where it fails.

mod support;

use std::path::Path;

use anyhow::{Context, ensure};
use outbox_testkit::services::{Kafka, MariaDb, Nats, Postgres, Redis};
use serde_json::Value;
use support::{BIN, Workdir};

const RUN: &str = "8s";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_test_passes_on_postgres_polling_with_nats() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let report = passing_run(&format!("kind = \"postgres\"\nurl = \"{url}\"\n")).await?;
    pg_leftovers_are_gone(&url).await?;
    ensure!(report["kills"].as_u64() > Some(0), "{report:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_test_passes_on_postgres_cdc_with_nats() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    passing_run(&format!(
        "kind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\n"
    ))
    .await?;
    pg_leftovers_are_gone(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_test_passes_on_mariadb_with_nats() -> anyhow::Result<()> {
    let url = MariaDb::shared().await?.fresh_database().await?;
    passing_run(&format!("kind = \"mysql\"\nurl = \"{url}\"\n")).await?;
    let pool = sqlx::MySqlPool::connect(&url).await?;
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'outbox\\_crash\\_%'",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(left == 0, "{left} scratch table(s) left behind");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_test_passes_on_sqlite_with_nats() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("app.db");
    passing_run(&format!(
        "kind = \"sqlite\"\npath = \"{}\"\n",
        path.display()
    ))
    .await?;
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await?;
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE name LIKE 'outbox\\_crash\\_%' ESCAPE '\\'",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(left == 0, "{left} scratch object(s) left behind");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_test_passes_on_sqlite_with_redis_streams() -> anyhow::Result<()> {
    let redis = Redis::shared().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"redis\"\nurl = \"{}\"\n",
            redis.url()
        ),
    )?;
    let out = crash_test(BIN, &work, &config, &["--json"]).await?;
    let report: Value =
        serde_json::from_str(&out.stdout).with_context(|| format!("the --json report: {out:?}"))?;
    ensure!(
        out.code == Some(0),
        "expected PASS: {report:#}\n{}",
        out.stderr
    );
    scratch_removed(&report)?;
    let client = ::redis::Client::open(redis.url())?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let left: Vec<String> = ::redis::cmd("KEYS")
        .arg("outbox_crash_*")
        .query_async(&mut connection)
        .await?;
    ensure!(left.is_empty(), "scratch key(s) left behind: {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_test_passes_on_sqlite_with_kafka() -> anyhow::Result<()> {
    let kafka = Kafka::shared().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"kafka\"\nbrokers = \"{}\"\n",
            kafka.brokers()
        ),
    )?;
    let out = crash_test(BIN, &work, &config, &["--json"]).await?;
    let report: Value =
        serde_json::from_str(&out.stdout).with_context(|| format!("the --json report: {out:?}"))?;
    ensure!(
        out.code == Some(0),
        "expected PASS: {report:#}\n{}",
        out.stderr
    );
    scratch_removed(&report)?;
    // The scratch topic is gone from the cluster's metadata.
    use rdkafka::consumer::Consumer;
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()?;
    let metadata = consumer.fetch_metadata(None, std::time::Duration::from_secs(30))?;
    let left: Vec<&str> = metadata
        .topics()
        .iter()
        .map(rdkafka::metadata::MetadataTopic::name)
        .filter(|t| t.starts_with("outbox_crash_"))
        .collect();
    ensure!(left.is_empty(), "scratch topic(s) left behind: {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_test_fails_against_a_relay_that_breaks_order_on_purpose() -> anyhow::Result<()> {
    let Some(fault_bin) = std::env::var_os("OUTBOX_FAULT_BIN") else {
        ensure!(
            std::env::var("CI").as_deref() != Ok("true"),
            "OUTBOX_FAULT_BIN is not set: scripts/test.sh builds the fault-injection binary"
        );
        eprintln!(
            "skipped: OUTBOX_FAULT_BIN is not set (scripts/test.sh builds target/debug/outbox-fault-injection with `cargo build -p outbox-cli --features fault-injection`)"
        );
        return Ok(());
    };
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let config =
        config_with_nats(&work, &format!("kind = \"postgres\"\nurl = \"{url}\"\n")).await?;
    let out = crash_test(&fault_bin, &work, &config, &["--json"]).await?;
    ensure!(out.code == Some(1), "expected FAIL (exit 1): {out:?}");
    let report: Value = serde_json::from_str(&out.stdout).context("the --json report")?;
    ensure!(report["verdict"] == "fail", "{report:#}");
    ensure!(
        report["order_breaks"]["count"].as_u64() > Some(0),
        "no order break caught: {report:#}"
    );
    ensure!(
        report["lost"]["count"] == 0 && report["phantom"]["count"] == 0,
        "{report:#}"
    );
    scratch_removed(&report)?;
    pg_leftovers_are_gone(&url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_cannot_be_read_back_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"sqs\"\nqueue_url = \"http://127.0.0.1:1/000000000000/q\"\nregion = \"us-east-1\"\n",
    )?;
    let out = crash_test(BIN, &work, &config, &[]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    ensure!(
        out.stderr
            .contains("no scratch destination for sink kind = \"sqs\"")
            && out.stderr.contains("canary"),
        "{out:?}"
    );
    ensure!(!out.stdout.contains("PASS"), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_database_host_is_refused_and_yes_overrides_it() -> anyhow::Result<()> {
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    // 192.0.2.1 (TEST-NET-1, documentation only): public, and nothing answers there.
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"postgres://app:secret@192.0.2.1:5432/app\"\nconnect_timeout = \"1s\"\n[sink]\nkind = \"nats\"\nurl = \"{}\"\n",
            nats.url()
        ),
    )?;
    let out = crash_test(BIN, &work, &config, &[]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    ensure!(
        out.stderr
            .contains("`192.0.2.1` is neither local nor on a private network")
            && !out.stderr.contains("secret"),
        "{out:?}"
    );
    // With --yes it runs, finds the database unreachable, and says so: exit 2, never a PASS.
    let out = crash_test(BIN, &work, &config, &["--yes"]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    ensure!(
        out.stderr.contains("crash-test cannot run")
            && out.stderr.contains("192.0.2.1")
            && !out.stderr.contains("looks like production")
            && !out.stderr.contains("secret"),
        "{out:?}"
    );
    ensure!(!out.stdout.contains("PASS"), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duration_under_a_second_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let out = work.run(&["crash-test", "--duration", "0s"]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    ensure!(out.stderr.contains("must be at least 1s"), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_looks_like_production_is_refused_without_yes() -> anyhow::Result<()> {
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"shop_prod.db\"\n[sink]\nkind = \"nats\"\nurl = \"{}\"\n",
            nats.url()
        ),
    )?;
    let out = crash_test(BIN, &work, &config, &[]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    ensure!(
        out.stderr.contains("looks like production")
            && out.stderr.contains("\"prod\"")
            && out.stderr.contains("--yes"),
        "{out:?}"
    );
    ensure!(
        !work.path().join("shop_prod.db").exists(),
        "the refused run touched the database"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_a_clear_error_and_the_scratch_table_is_removed()
-> anyhow::Result<()> {
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"nats\"\nurl = \"nats://127.0.0.1:1\"\nconnect_timeout = \"1s\"\n",
    )?;
    let out = crash_test(BIN, &work, &config, &["--json"]).await?;
    ensure!(out.code == Some(2), "{out:?}");
    ensure!(
        out.stderr.contains("crash-test cannot run") && out.stderr.contains("127.0.0.1:1"),
        "{out:?}"
    );
    let report: Value = serde_json::from_str(&out.stdout).context("the --json report")?;
    ensure!(report["verdict"] == "cannot_run", "{report:#}");
    scratch_removed(&report)?;
    Ok(())
}

/// Runs `PROGRAM crash-test --duration 8s --config CONFIG EXTRA...` in `work`, with no
/// OUTBOX_* variable of the test's environment and quiet relays.
async fn crash_test(
    program: impl AsRef<std::ffi::OsStr>,
    work: &Workdir,
    config: &Path,
    extra: &[&str],
) -> anyhow::Result<support::Output> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(["crash-test", "--duration", RUN, "--config"])
        .arg(config)
        .args(extra)
        .current_dir(work.path())
        .kill_on_drop(true);
    for (k, _) in std::env::vars() {
        if k.starts_with("OUTBOX_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("OUTBOX_LOG", "warn");
    support::output(cmd).await
}

/// A config of `[source]` (its lines) with the shared NATS server as the sink.
async fn config_with_nats(work: &Workdir, source: &str) -> anyhow::Result<std::path::PathBuf> {
    let nats = Nats::shared().await?;
    work.write_config(
        "outbox.toml",
        &format!(
            "[source]\n{source}[relay]\nbatch_size = 50\npoll_interval = \"5ms\"\n[sink]\nkind = \"nats\"\nurl = \"{}\"\n",
            nats.url()
        ),
    )
}

/// Runs a crash test that must pass; its `--json` report.
async fn passing_run(source: &str) -> anyhow::Result<Value> {
    let work = Workdir::new()?;
    let config = config_with_nats(&work, source).await?;
    let out = crash_test(BIN, &work, &config, &["--json"]).await?;
    let report: Value =
        serde_json::from_str(&out.stdout).with_context(|| format!("the --json report: {out:?}"))?;
    ensure!(
        out.code == Some(0),
        "expected PASS: {report:#}\n{}",
        out.stderr
    );
    ensure!(report["verdict"] == "pass", "{report:#}");
    ensure!(
        report["committed"].as_u64() > Some(0) && report["rolled_back"].as_u64() > Some(0),
        "{report:#}"
    );
    ensure!(
        report["verify"]["source"]["delivered"] == report["committed"],
        "{report:#}"
    );
    scratch_removed(&report)?;
    Ok(report)
}

/// Every scratch object the report lists was removed.
fn scratch_removed(report: &Value) -> anyhow::Result<()> {
    let removals = report["scratch"].as_array().context("scratch removals")?;
    ensure!(!removals.is_empty(), "{report:#}");
    for removal in removals {
        ensure!(
            removal["removed"].is_array() && removal["error"].is_null(),
            "not removed: {removal:#}"
        );
    }
    Ok(())
}

/// No scratch table, replication slot or publication is left in the PostgreSQL database.
async fn pg_leftovers_are_gone(url: &str) -> anyhow::Result<()> {
    let pool = sqlx::PgPool::connect(url).await?;
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_class WHERE relname LIKE 'outbox\\_crash\\_%'")
            .fetch_one(&pool)
            .await?;
    let slots: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'outbox\\_crash\\_%' AND database = current_database()",
    )
    .fetch_one(&pool)
    .await?;
    let publications: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_publication WHERE pubname LIKE 'outbox\\_crash\\_%'",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(
        (tables, slots, publications) == (0, 0, 0),
        "left behind: {tables} relation(s), {slots} slot(s), {publications} publication(s)"
    );
    Ok(())
}
