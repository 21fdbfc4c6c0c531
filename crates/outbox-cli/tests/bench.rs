//! `outbox bench`: small runs against real databases with the null sink. The assertions are on
//! counts (what the JSON report says, checked against the table), never on speed.

mod support;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use serde_json::Value;
use support::Workdir;

/// Runs `outbox bench ARGS --json` with `config` and returns the parsed report.
async fn bench_json(work: &Workdir, config: &str, args: &[&str]) -> anyhow::Result<Value> {
    let mut all = vec!["--config", config, "bench"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = work.run(&all).await?;
    ensure!(out.code == Some(0), "outbox bench failed: {out:?}");
    serde_json::from_str(&out.stdout).with_context(|| format!("report is not JSON: {out:?}"))
}

fn sqlite_config(work: &Workdir) -> anyhow::Result<String> {
    let path = work.write_config(
        "outbox.toml",
        "[source]\nkind = \"sqlite\"\npath = \"bench.db\"\n[sink]\nkind = \"stdout\"\n",
    )?;
    Ok(path.to_str().context("utf-8 path")?.to_owned())
}

async fn sqlite_count(work: &Workdir, state: &str) -> anyhow::Result<i64> {
    let config = outbox_sqlite::SqliteConfig::new(work.path().join("bench.db"));
    let pool = outbox_sqlite::connect(&config).await?;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = ?")
        .bind(state)
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_bench_drains_every_event_from_sqlite_into_the_null_sink() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let config = sqlite_config(&work)?;
    let report = bench_json(
        &work,
        &config,
        &[
            "backlog",
            "--events",
            "3000",
            "--sink",
            "null",
            "--batch-size",
            "250",
        ],
    )
    .await?;
    ensure!(report["mode"] == "backlog", "{report}");
    ensure!(
        report["source"] == "sqlite" && report["sink"] == "null",
        "{report}"
    );
    ensure!(
        report["batch_size"] == 250 && report["workers"] == 1,
        "{report}"
    );
    ensure!(report["events"] == 3000, "{report}");
    ensure!(report["delivered"] == 3000, "{report}");
    ensure!(report["pending_after"] == 0, "{report}");
    ensure!(report["dead_lettered"] == 0, "{report}");
    ensure!(report["interrupted"] == false, "{report}");
    ensure!(report["latency_ms"].is_null(), "{report}");
    ensure!(report["peak_rss_mib"].as_f64().is_some(), "{report}");
    // The table agrees with the report: every event written and marked delivered.
    ensure!(sqlite_count(&work, "delivered").await? == 3000);
    ensure!(sqlite_count(&work, "pending").await? == 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_bench_drains_every_event_from_postgres_into_the_null_sink() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[relay]\nworkers = 2\n"),
    )?;
    let config = config.to_str().context("utf-8 path")?;
    let report = bench_json(
        &work,
        config,
        &[
            "backlog",
            "--events",
            "4000",
            "--sink",
            "null",
            "--aggregates",
            "50",
        ],
    )
    .await?;
    ensure!(report["source"] == "postgres-poll", "{report}");
    ensure!(
        report["workers"] == 2 && report["batch_size"] == 500,
        "{report}"
    );
    ensure!(report["events"] == 4000, "{report}");
    ensure!(report["delivered"] == 4000, "{report}");
    ensure!(report["pending_after"] == 0, "{report}");
    let pool = sqlx::PgPool::connect(&url).await?;
    let (delivered, total): (i64, i64) =
        sqlx::query_as("SELECT count(*) FILTER (WHERE state = 'delivered'), count(*) FROM outbox")
            .fetch_one(&pool)
            .await?;
    ensure!(
        (delivered, total) == (4000, 4000),
        "table: {delivered} delivered of {total}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_bench_drains_every_event_through_postgres_cdc() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    // Replication slots are per server: a name of this test's own.
    let tag = uuid::Uuid::now_v7().simple().to_string();
    let slot = format!("s_{}", &tag[20..]);
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"{slot}\"\npublication = \"p_{}\"\n",
            &tag[20..]
        ),
    )?;
    let config = config.to_str().context("utf-8 path")?;
    let result = bench_json(
        &work,
        config,
        &["backlog", "--events", "3000", "--sink", "null"],
    )
    .await;
    let pool = sqlx::PgPool::connect(&url).await?;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&pool)
        .await?;
    // The slot retains WAL on the shared server: drop it whatever happened.
    let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&pool)
        .await;
    let report = result?;
    ensure!(
        report["source"] == "postgres-cdc" && report["workers"] == 1,
        "{report}"
    );
    ensure!(
        report["events"] == 3000 && rows == 3000,
        "{report}, {rows} rows"
    );
    ensure!(report["delivered"] == 3000, "{report}");
    ensure!(report["pending_after"] == 0, "{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_bench_measures_the_latency_of_every_produced_event() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n"),
    )?;
    let config = config.to_str().context("utf-8 path")?;
    let report = bench_json(
        &work,
        config,
        &[
            "steady",
            "--rate",
            "200",
            "--duration",
            "1s",
            "--producers",
            "2",
            "--per-transaction",
            "3",
            "--sink",
            "null",
        ],
    )
    .await?;
    ensure!(report["mode"] == "steady", "{report}");
    let events = report["events"].as_u64().context("events")?;
    ensure!(
        events > 0 && events % 3 == 0,
        "3 events per transaction: {report}"
    );
    ensure!(
        report["producer"]["events_per_transaction"] == 3,
        "{report}"
    );
    ensure!(report["delivered"] == events, "{report}");
    ensure!(report["pending_after"] == 0, "{report}");
    ensure!(report["producer"]["producers"] == 2, "{report}");
    // One latency sample per delivered event, percentiles in order.
    let latency = &report["latency_ms"];
    ensure!(latency["count"] == events, "{report}");
    let (p50, p99, max) = (
        latency["p50"].as_f64().context("p50")?,
        latency["p99"].as_f64().context("p99")?,
        latency["max"].as_f64().context("max")?,
    );
    ensure!(0.0 < p50 && p50 <= p99 && p99 <= max, "{report}");
    ensure!(
        latency["percentiles"].as_array().map(Vec::len) == Some(101),
        "{report}"
    );
    let pool = sqlx::PgPool::connect(&url).await?;
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'delivered'")
        .fetch_one(&pool)
        .await?;
    ensure!(total as u64 == events, "table holds {total} delivered");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_refuses_bad_input_with_a_clear_error() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let config = sqlite_config(&work)?;
    let config = config.as_str();

    let out = work
        .run(&["--config", config, "bench", "backlog", "--events", "0"])
        .await?;
    out.assert_clear_error("--events")?;
    let out = work
        .run(&[
            "--config",
            config,
            "bench",
            "steady",
            "--rate",
            "0",
            "--duration",
            "1s",
        ])
        .await?;
    out.assert_clear_error("greater than 0")?;
    let out = work
        .run(&[
            "--config",
            config,
            "bench",
            "steady",
            "--rate",
            "10",
            "--duration",
            "soon",
        ])
        .await?;
    out.assert_clear_error("`soon`")?;
    // The configured sink is stdout: it would print the events into the report.
    let out = work
        .run(&["--config", config, "bench", "backlog", "--events", "10"])
        .await?;
    out.assert_clear_error("--sink null")?;
    ensure!(
        sqlite_count(&work, "pending").await? == 0,
        "nothing written"
    );

    // A table with pending events is refused, and nothing is added to it.
    let db = outbox_sqlite::SqliteConfig::new(work.path().join("bench.db"));
    let pool = outbox_sqlite::connect(&db).await?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o_1', 'order.placed', '{}')")
        .execute(&pool)
        .await?;
    pool.close().await;
    let out = work
        .run(&[
            "--config", config, "bench", "backlog", "--events", "10", "--sink", "null",
        ])
        .await?;
    out.assert_clear_error("already holds 1 pending")?;
    ensure!(sqlite_count(&work, "pending").await? == 1);
    Ok(())
}
