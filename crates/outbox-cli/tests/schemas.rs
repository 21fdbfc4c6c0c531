//! `[payload] schemas` through the binary (SQLite source, file sink: no services): an event
//! that does not match its JSON Schema, or is not JSON, is dead-lettered at once with the
//! failing path and rule, while the valid events of the same batches reach the file in order;
//! a broken schema file stops the relay at start, naming the file, and `outbox doctor`
//! reports it red.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use support::{Output, Workdir, terminate};

const ORDER_PLACED: &str = r#"{
  "type": "object",
  "properties": { "total_cents": { "type": "integer", "minimum": 0 } },
  "required": ["total_cents"]
}"#;

/// `default.json`: whatever has no schema of its own must at least be an object.
const DEFAULT: &str = r#"{ "type": "object" }"#;

fn config(schemas: &str) -> String {
    format!(
        "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n[payload]\nschemas = \"{schemas}\"\n"
    )
}

/// `outbox migrate --config CFG`, then a pool on its SQLite file.
async fn migrated(work: &Workdir, cfg: &str) -> anyhow::Result<sqlx::SqlitePool> {
    work.run_ok(&["migrate", "--config", cfg]).await?;
    Ok(sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        work.path().join("app.db").display()
    ))
    .await?)
}

/// A scratch directory with `schemas/` holding `files`, and `outbox.toml` pointing at it.
fn with_schemas(files: &[(&str, &str)]) -> anyhow::Result<(Workdir, PathBuf, PathBuf)> {
    let work = Workdir::new()?;
    let dir = work.path().join("schemas");
    std::fs::create_dir(&dir)?;
    for (name, text) in files {
        std::fs::write(dir.join(name), text)?;
    }
    let cfg = work.write_config("outbox.toml", &config("schemas/"))?;
    Ok((work, dir, cfg))
}

/// `outbox relay --config CONFIG`, which must stop at start; its output.
async fn refused_relay(work: &Workdir, cfg: &str, what: &str) -> anyhow::Result<Output> {
    tokio::time::timeout(
        Duration::from_secs(30),
        work.run(&["relay", "--config", cfg]),
    )
    .await
    .with_context(|| format!("the relay started {what}"))?
}

/// Writes `(aggregate_type, aggregate_id, event_type, payload)` rows as a producer would.
async fn insert(
    pool: &sqlx::SqlitePool,
    events: &[(&str, &str, &str, &str)],
) -> anyhow::Result<()> {
    for (aggregate_type, aggregate_id, event_type, payload) in events {
        sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)")
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(event_type)
            .bind(payload.as_bytes())
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Runs the relay of `cfg` until `table` holds `n` settled (delivered or dead) events.
async fn relay_until_settled(
    work: &Workdir,
    cfg: &std::path::Path,
    pool: &sqlx::SqlitePool,
    table: &str,
    n: i64,
) -> anyhow::Result<()> {
    let mut relay = work.spawn_relay(cfg, "relay.log")?;
    let query = format!("SELECT count(*) FROM {table} WHERE state IN ('dead', 'delivered')");
    let settled = outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(query.clone()))
            .fetch_one(pool)
            .await
            .is_ok_and(|found| found == n)
    })
    .await;
    terminate(&mut relay, Duration::from_secs(10)).await?;
    settled.with_context(|| format!("not every event settled:\n{}", work.read_log("relay.log")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_events_are_dead_lettered_with_the_path_and_rule_while_valid_ones_flow()
-> anyhow::Result<()> {
    let (work, _, cfg) = with_schemas(&[
        ("order.placed.json", ORDER_PLACED),
        ("default.json", DEFAULT),
        ("README.md", "not a schema: left alone"),
    ])?;
    let cfg_str = cfg.to_str().context("utf-8 path")?;
    let pool = migrated(&work, cfg_str).await?;
    // Valid: o1 (three), i1; invalid: o2 (minimum), o3 (not JSON), i2 (default.json: not an
    // object).
    insert(
        &pool,
        &[
            ("Order", "o1", "order.placed", r#"{"total_cents":100}"#),
            ("Order", "o2", "order.placed", r#"{"total_cents":-5}"#),
            ("Order", "o3", "order.placed", "not json"),
            ("Order", "o1", "order.placed", r#"{"total_cents":200}"#),
            ("Invoice", "i1", "invoice.sent", r#"{"n":1}"#),
            ("Invoice", "i2", "invoice.sent", "42"),
            ("Order", "o1", "order.placed", r#"{"total_cents":300}"#),
        ],
    )
    .await?;
    relay_until_settled(&work, &cfg, &pool, "outbox", 7).await?;

    // Dead-lettered at once: refused by the schema, never retried.
    let dead: Vec<(String, i64)> = sqlx::query_as(
        "SELECT aggregate_id, attempts FROM outbox WHERE state = 'dead' ORDER BY aggregate_id",
    )
    .fetch_all(&pool)
    .await?;
    let ids: Vec<&str> = dead.iter().map(|(id, _)| id.as_str()).collect();
    ensure!(ids == ["i2", "o2", "o3"], "{dead:?}");
    ensure!(
        dead.iter().all(|(_, attempts)| *attempts <= 1),
        "retried: {dead:?}"
    );

    // The valid ones reached the file, each aggregate in order.
    let lines = std::fs::read_to_string(work.path().join("events.jsonl"))?;
    let arrived: Vec<(String, String)> = lines
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)?;
            Ok((
                v["aggregate_id"]
                    .as_str()
                    .context("aggregate_id")?
                    .to_owned(),
                v["payload"].to_string(),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let o1: Vec<&str> = arrived
        .iter()
        .filter(|(id, _)| id == "o1")
        .map(|(_, p)| p.as_str())
        .collect();
    ensure!(
        o1 == [
            r#"{"total_cents":100}"#,
            r#"{"total_cents":200}"#,
            r#"{"total_cents":300}"#
        ],
        "{lines}"
    );
    ensure!(
        arrived.len() == 4 && arrived.iter().any(|(id, _)| id == "i1"),
        "{lines}"
    );

    // `outbox dead list` and `dead show` give the reason: the file, the path and the rule.
    let list = work
        .run_ok(&["dead", "list", "--config", cfg_str, "--json"])
        .await?;
    let list: serde_json::Value = serde_json::from_str(&list)?;
    let reasons: Vec<(String, String, String)> = list
        .as_array()
        .context("a list")?
        .iter()
        .map(|d| {
            (
                d["aggregate_id"].as_str().unwrap_or_default().to_owned(),
                d["id"].as_str().unwrap_or_default().to_owned(),
                d["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let reason = |aggregate_id: &str| {
        reasons
            .iter()
            .find(|(a, _, _)| a == aggregate_id)
            .with_context(|| format!("no dead letter for {aggregate_id}: {list}"))
    };
    let (_, o2, why) = reason("o2")?;
    ensure!(
        why.contains("order.placed.json")
            && why.contains("/total_cents: -5 is less than the minimum of 0"),
        "{why}"
    );
    let (_, _, why) = reason("o3")?;
    ensure!(
        why.contains("payload is not JSON") && why.contains("order.placed.json"),
        "{why}"
    );
    let (_, _, why) = reason("i2")?;
    ensure!(
        why.contains("default.json") && why.contains("/: 42 is not of type \"object\""),
        "{why}"
    );
    let show = work
        .run_ok(&["dead", "show", o2, "--config", cfg_str])
        .await?;
    ensure!(
        show.contains("/total_cents: -5 is less than the minimum of 0"),
        "{show}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_schema_is_refused_at_start_naming_the_file_and_doctor_reports_it()
-> anyhow::Result<()> {
    let (work, dir, cfg) = with_schemas(&[("order.placed.json", ORDER_PLACED)])?;
    let cfg = cfg.to_str().context("utf-8 path")?;
    work.run_ok(&["migrate", "--config", cfg]).await?;
    let doctor = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(
        doctor.stdout.lines().any(|l| l.contains("ok")
            && l.contains("payload_schemas")
            && l.contains("order.placed.json")),
        "{doctor:?}"
    );

    // Not a schema (`type` must be a string or an array), and not JSON at all.
    std::fs::write(dir.join("order.paid.json"), r#"{"type": 12}"#)?;
    let relay = refused_relay(&work, cfg, "with a broken schema").await?;
    relay.assert_clear_error("order.paid.json")?;
    ensure!(
        relay.stderr.contains("not a valid JSON Schema"),
        "{relay:?}"
    );

    std::fs::write(dir.join("order.paid.json"), "{\"type\":")?;
    let relay = refused_relay(&work, cfg, "with a schema that is not JSON").await?;
    relay.assert_clear_error("order.paid.json")?;
    ensure!(relay.stderr.contains("not JSON"), "{relay:?}");

    let doctor = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(doctor.code.is_some_and(|c| c != 0), "{doctor:?}");
    ensure!(
        doctor.stdout.lines().any(|l| l.contains("RED")
            && l.contains("payload_schemas")
            && l.contains("order.paid.json")),
        "{doctor:?}"
    );

    // A directory that is not there is refused too, named.
    let missing = work.write_config("missing.toml", &config("no-such-dir"))?;
    let relay = refused_relay(
        &work,
        missing.to_str().context("utf-8 path")?,
        "without its schema directory",
    )
    .await?;
    relay.assert_clear_error("no-such-dir")?;
    Ok(())
}

/// With `[[subscription]]` entries, each subscription's sink validates: the invalid event is
/// dead-lettered in the subscription's own table, the valid one reaches its file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subscription_validates_and_dead_letters_in_its_own_table() -> anyhow::Result<()> {
    let (work, _, _) = with_schemas(&[("order.placed.json", ORDER_PLACED)])?;
    let cfg = work.write_config(
        "fanout.toml",
        "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sinks.files]\nkind = \"file\"\npath = \"events.jsonl\"\n[[subscription]]\nname = \"all\"\nsink = \"files\"\n[payload]\nschemas = \"schemas/\"\n",
    )?;
    let cfg_str = cfg.to_str().context("utf-8 path")?;
    let pool = migrated(&work, cfg_str).await?;
    insert(
        &pool,
        &[
            ("Order", "o1", "order.placed", r#"{"total_cents":-1}"#),
            ("Order", "o2", "order.placed", r#"{"total_cents":1}"#),
        ],
    )
    .await?;
    relay_until_settled(&work, &cfg, &pool, "outbox_sub_all", 2).await?;
    let list = work
        .run_ok(&[
            "dead",
            "list",
            "--config",
            cfg_str,
            "--subscription",
            "all",
            "--json",
        ])
        .await?;
    let list: serde_json::Value = serde_json::from_str(&list)?;
    ensure!(
        list.as_array().is_some_and(|a| a.len() == 1)
            && list[0]["aggregate_id"] == "o1"
            && list[0]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("/total_cents: -1 is less than the minimum of 0")),
        "{list}"
    );
    let lines = std::fs::read_to_string(work.path().join("events.jsonl"))?;
    ensure!(
        lines.lines().count() == 1 && lines.contains("\"aggregate_id\":\"o2\""),
        "{lines}"
    );
    Ok(())
}
