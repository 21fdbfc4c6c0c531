//! `[[subscription]]` fan-out with `kind = "mysql"` (polling), against a real MariaDB: each
//! subscription's table gets its own copy of the matching events, numbered gap-free per
//! aggregate in order, relayed to its own sink; a relay killed mid-fan-out loses nothing and
//! copies nothing twice; one subscription's dead letter does not hold back another.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_mysql::MySqlOutbox;
use outbox_testkit::services::{MariaDb, Nats};
use support::{Workdir, terminate};

const EVENTS: u32 = 2000;
const AGGREGATES: u32 = 7;

fn event_type(n: u32) -> &'static str {
    if n.is_multiple_of(4) {
        "invoice.paid"
    } else {
        "order.placed"
    }
}

/// Per aggregate of subscription table `table`: the `seq` values in position order, paired
/// with the payload counter `n`.
async fn table_rows(
    pool: &sqlx::MySqlPool,
    table: &str,
) -> anyhow::Result<BTreeMap<String, Vec<(i64, u64)>>> {
    let rows: Vec<(String, String, i64, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, aggregate_id, seq, payload FROM {table} ORDER BY position"
    )))
    .fetch_all(pool)
    .await?;
    let ids: BTreeSet<&String> = rows.iter().map(|r| &r.0).collect();
    ensure!(
        ids.len() == rows.len(),
        "{table}: {} rows but {} distinct ids (a copy was made twice)",
        rows.len(),
        ids.len()
    );
    let mut by_aggregate: BTreeMap<String, Vec<(i64, u64)>> = BTreeMap::new();
    for (_, aggregate, seq, payload) in rows {
        let v: serde_json::Value = serde_json::from_slice(&payload)?;
        let n = v["n"].as_u64().context("payload n")?;
        by_aggregate.entry(aggregate).or_default().push((seq, n));
    }
    Ok(by_aggregate)
}

/// Two file subscriptions (`all`, and `paid` filtered on `*.paid`) over a MariaDB outbox;
/// the relay is killed with SIGKILL while it fans out, then restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_outbox_fans_out_to_files_through_a_sigkill() -> anyhow::Result<()> {
    let url = MariaDb::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "mysql"
url = "{url}"
[relay]
batch_size = 50
[sinks.all]
kind = "file"
path = "{}"
[sinks.paid]
kind = "file"
path = "{}"
[[subscription]]
name = "all"
sink = "all"
[[subscription]]
name = "paid"
sink = "paid"
event_type = "*.paid"
"#,
            work.path().join("all.jsonl").display(),
            work.path().join("paid.jsonl").display()
        ),
    )?;
    let cfg_arg = cfg.to_str().context("path")?;
    let migrated = work.run(&["migrate", "--config", cfg_arg]).await?;
    ensure!(
        migrated.code == Some(0)
            && migrated.stdout.contains("subscription `all`")
            && migrated.stdout.contains("subscription `paid`"),
        "migrate: {}{}",
        migrated.stdout,
        migrated.stderr
    );
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    // One transaction per 100 events, written while the relay runs: it is killed while the
    // outbox still fills.
    let write = {
        let pool = pool.clone();
        async move {
            let outbox = MySqlOutbox::default();
            for start in (0..EVENTS).step_by(100) {
                let events: Vec<NewEvent> = (start..start + 100)
                    .map(|n| {
                        NewEvent::new(
                            "Order",
                            format!("o{}", n % AGGREGATES),
                            event_type(n),
                            format!("{{\"n\":{n}}}"),
                        )
                    })
                    .collect();
                let mut tx = pool.begin().await?;
                outbox.enqueue_batch(&mut tx, &events).await?;
                tx.commit().await?;
            }
            anyhow::Ok(())
        }
    };
    let mut relay = work.spawn_relay(&cfg, "relay.log")?;
    let writer = tokio::spawn(write);
    // Killed once the fan-out has copied some events and before it copied them all.
    let count = |table: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table}"
            )))
            .fetch_one(&pool)
            .await
            .unwrap_or(0)
        }
    };
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        count("outbox_sub_all").await > 0
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    relay.start_kill()?;
    relay.wait().await?;
    let copied = count("outbox_sub_all").await;
    writer.await??;
    work.append_log("relay.log", "\n--- killed with SIGKILL ---\n")?;
    ensure!(
        copied < i64::from(EVENTS),
        "the relay copied everything before the kill ({copied}); the kill tests nothing"
    );

    let mut relay = work.spawn_relay(&cfg, "relay.log")?;
    let lines = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(work.path().join(name))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let distinct = |name: &str| -> usize {
        lines(name)
            .iter()
            .filter_map(|m| m["id"].as_str().map(str::to_owned))
            .collect::<BTreeSet<_>>()
            .len()
    };
    let paid = (0..EVENTS).filter(|n| n.is_multiple_of(4)).count();
    outbox_testkit::wait::eventually(Duration::from_secs(120), || async {
        distinct("all.jsonl") >= EVENTS as usize && distinct("paid.jsonl") >= paid
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");

    // The tables: every matching event once, each aggregate numbered 1, 2, 3, ... in the
    // order of its events.
    for (table, want) in [
        ("outbox_sub_all", EVENTS as usize),
        ("outbox_sub_paid", paid),
    ] {
        let by_aggregate = table_rows(&pool, table).await?;
        let total: usize = by_aggregate.values().map(Vec::len).sum();
        ensure!(total == want, "{table}: {total} rows, {want} expected");
        for (aggregate, rows) in &by_aggregate {
            for (i, (seq, n)) in rows.iter().enumerate() {
                ensure!(
                    *seq == i64::try_from(i)? + 1,
                    "{table}: {aggregate}'s event {n} has seq {seq} at place {}",
                    i + 1
                );
                if i > 0 {
                    ensure!(
                        *n > rows[i - 1].1,
                        "{table}: {aggregate} has {n} after {}",
                        rows[i - 1].1
                    );
                }
            }
        }
        let pending: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE state <> 'delivered'"
        )))
        .fetch_one(&pool)
        .await?;
        ensure!(pending == 0, "{table}: {pending} rows not delivered");
    }
    // The files: every event, only matching ones, aggregate_seq contiguous per aggregate and
    // in event order (a redelivery after the kill may repeat a line, never reorder).
    for (file, want) in [("all.jsonl", EVENTS as usize), ("paid.jsonl", paid)] {
        let mut seqs: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
        for m in lines(file) {
            if file == "paid.jsonl" {
                ensure!(m["event_type"] == "invoice.paid", "{file}: {m}");
            }
            let n = m["payload"]["n"].as_u64().with_context(|| format!("{m}"))?;
            let seq: u64 = m["headers"]["aggregate_seq"]
                .as_str()
                .with_context(|| format!("no aggregate_seq: {m}"))?
                .parse()?;
            let aggregate = m["aggregate_id"].as_str().context("aggregate_id")?;
            let prev = seqs.entry(aggregate.to_owned()).or_default().insert(seq, n);
            ensure!(
                prev.is_none_or(|p| p == n),
                "{file}: {aggregate} aggregate_seq {seq} on events {prev:?} and {n}"
            );
        }
        let mut total = 0;
        for (aggregate, by_seq) in &seqs {
            total += by_seq.len();
            let numbers: Vec<u64> = by_seq.keys().copied().collect();
            let expected: Vec<u64> = (1..=by_seq.len() as u64).collect();
            ensure!(
                numbers == expected,
                "{file}: {aggregate}'s aggregate_seq values are not 1..{}",
                by_seq.len()
            );
            let ns: Vec<u64> = by_seq.values().copied().collect();
            ensure!(
                ns.windows(2).all(|w| w[0] < w[1]),
                "{file}: {aggregate}'s aggregate_seq does not follow event order: {ns:?}"
            );
        }
        ensure!(total == want, "{file}: {total} events, {want} expected");
    }
    Ok(())
}

/// A subscription whose sink rejects an event dead-letters it in its own table; the other
/// subscription delivers every event, and the rejected event's aggregate continues there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_dead_letter_belongs_to_its_subscription() -> anyhow::Result<()> {
    let url = MariaDb::shared().await?.fresh_database().await?;
    let nats = Nats::shared().await?;
    let tag = format!(
        "mysubdl{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let work = Workdir::new()?;
    // `strict` puts the aggregate id in the subject: an id with a space is not a valid NATS
    // subject, so its sink rejects that event. `lenient` writes a file.
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "mysql"
url = "{url}"
[sinks.by_id]
kind = "nats"
url = "{url_nats}"
stream = "{tag}"
destination = "{tag}.by_id.{{aggregate_id}}"
[sinks.file]
kind = "file"
path = "{file}"
[[subscription]]
name = "strict"
sink = "by_id"
[[subscription]]
name = "lenient"
sink = "file"
"#,
            url_nats = nats.url(),
            file = work.path().join("lenient.jsonl").display()
        ),
    )?;
    let cfg = cfg.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = sqlx::MySqlPool::connect(&url).await?;
    let mut tx = pool.begin().await?;
    let outbox = MySqlOutbox::default();
    let poison = outbox
        .enqueue(
            &mut tx,
            &NewEvent::new("Order", "bad id", "order.placed", "{\"n\":0}"),
        )
        .await?;
    let good = outbox
        .enqueue(
            &mut tx,
            &NewEvent::new("Order", "good", "order.placed", "{\"n\":1}"),
        )
        .await?;
    tx.commit().await?;
    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;
    let state = |table: &'static str, id: uuid::Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "SELECT state FROM {table} WHERE id = ?"
            )))
            .bind(id.hyphenated().to_string())
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten()
        }
    };
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        state("outbox_sub_strict", poison).await.as_deref() == Some("dead")
            && state("outbox_sub_strict", good).await.as_deref() == Some("delivered")
            && state("outbox_sub_lenient", poison).await.as_deref() == Some("delivered")
            && state("outbox_sub_lenient", good).await.as_deref() == Some("delivered")
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    // The same aggregate later: `lenient` delivers it, `strict` holds it behind its dead
    // letter (per-aggregate order), and neither holds back the other.
    let later = outbox
        .enqueue(
            &mut *pool.acquire().await?,
            &NewEvent::new("Order", "bad id", "order.placed", "{\"n\":2}"),
        )
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        state("outbox_sub_lenient", later).await.as_deref() == Some("delivered")
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    ensure!(
        state("outbox_sub_strict", later).await.as_deref() == Some("pending"),
        "strict delivered an event behind its dead letter"
    );
    let lenient = std::fs::read_to_string(work.path().join("lenient.jsonl"))?;
    for id in [poison, good, later] {
        ensure!(
            lenient.contains(&id.to_string()),
            "lenient.jsonl lacks {id}"
        );
    }
    let strict = work
        .run(&[
            "dead",
            "list",
            "--config",
            cfg,
            "--subscription",
            "strict",
            "--json",
        ])
        .await?;
    ensure!(
        strict.code == Some(0) && strict.stdout.contains(&poison.to_string()),
        "strict's dead letters: {}{}",
        strict.stdout,
        strict.stderr
    );
    let lenient = work
        .run(&[
            "dead",
            "list",
            "--config",
            cfg,
            "--subscription",
            "lenient",
            "--json",
        ])
        .await?;
    ensure!(
        lenient.code == Some(0) && !lenient.stdout.contains(&poison.to_string()),
        "lenient lists strict's dead letter: {}{}",
        lenient.stdout,
        lenient.stderr
    );
    Ok(())
}

/// The binlog source does not fan out: refused before anything is created, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_cdc_outbox_with_subscriptions_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"mysql\"\nurl = \"mysql://app@127.0.0.1:1/app\"\nmode = \"cdc\"\n[sinks.a]\nkind = \"file\"\npath = \"{}\"\n[[subscription]]\nname = \"a\"\nsink = \"a\"\n",
            work.path().join("a.jsonl").display()
        ),
    )?;
    let out = work
        .run(&["relay", "--config", cfg.to_str().context("path")?])
        .await?;
    out.assert_clear_error("source.mode: [[subscription]] needs mode = \"poll\"")?;
    Ok(())
}
