//! `outbox replay`: with a real relay writing to a file sink, a replay re-publishes exactly the
//! selected delivered events (same ids, aggregate order), `--dry-run` changes nothing, large
//! selections go in batches, and bad input (a bad time, no confirmation, delete mode) is a
//! clear error.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use sqlx::PgPool;
use support::{Workdir, terminate};
use uuid::Uuid;

/// The ids the file sink wrote, in order.
fn published(work: &Workdir) -> Vec<String> {
    std::fs::read_to_string(work.path().join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect()
}

async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state <> 'delivered'")
        .fetch_one(pool)
        .await
        .unwrap_or(-1)
}

/// Waits until the sink wrote `n` events and nothing is left to deliver.
async fn settled(work: &Workdir, pool: &PgPool, n: usize) -> anyhow::Result<Vec<String>> {
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        published(work).len() >= n && pending(pool).await == 0
    })
    .await
    .with_context(|| format!("expected {n} published: {:?}", published(work)))?;
    Ok(published(work))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_republishes_exactly_the_selected_events() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let work = Workdir::new()?;
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n"),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = PgPool::connect(&url).await?;
    let mut ids = std::collections::HashMap::new();
    for (name, aggregate, event_type, age) in [
        ("old_o1", "o1", "order.changed", "3 hours"),
        ("old_o2", "o2", "order.paid", "3 hours"),
        ("o1_a", "o1", "order.changed", "0"),
        ("o2_a", "o2", "order.paid", "0"),
        ("o1_b", "o1", "order.changed", "0"),
    ] {
        let id = Uuid::now_v7();
        sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) VALUES ($1, 'Order', $2, $3, '{}', clock_timestamp() - $4::interval)")
            .bind(id)
            .bind(aggregate)
            .bind(event_type)
            .bind(age)
            .execute(&pool)
            .await?;
        ids.insert(name, id.to_string());
    }
    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    ensure!(settled(&work, &pool, 5).await?.len() == 5);

    // Dry run: the count and the first events; nothing changes.
    let out = work
        .run(&["replay", "--since", "1h", "--dry-run", "--config", cfg])
        .await?;
    ensure!(
        out.code == Some(0)
            && out.stdout.contains("3 delivered event(s)")
            && out.stdout.contains(&ids["o1_a"])
            && out.stdout.contains("dry run: nothing replayed"),
        "{out:?}"
    );
    ensure!(pending(&pool).await == 0, "--dry-run changed rows");

    // No terminal and no --yes: refused, nothing replayed.
    let out = work
        .run(&["replay", "--since", "1h", "--config", cfg])
        .await?;
    out.assert_clear_error("--yes")?;
    ensure!(pending(&pool).await == 0, "replayed without confirmation");

    // One aggregate, recent events: exactly o1_a then o1_b again, same ids.
    let out = work
        .run(&[
            "replay",
            "--since",
            "1h",
            "--aggregate",
            "o1",
            "--yes",
            "--config",
            cfg,
        ])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("2 event(s) put back"),
        "{out:?}"
    );
    let got = settled(&work, &pool, 7).await?;
    ensure!(
        got[5..] == [ids["o1_a"].clone(), ids["o1_b"].clone()],
        "{got:?}"
    );

    // One event type over an RFC 3339 window that covers only the old events.
    let since = (time::OffsetDateTime::now_utc() - time::Duration::hours(4))
        .format(&time::format_description::well_known::Rfc3339)?;
    let until = (time::OffsetDateTime::now_utc() - time::Duration::hours(2))
        .format(&time::format_description::well_known::Rfc3339)?;
    let out = work
        .run(&[
            "replay",
            "--since",
            &since,
            "--until",
            &until,
            "--type",
            "order.paid",
            "--yes",
            "--config",
            cfg,
        ])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("1 event(s) put back"),
        "{out:?}"
    );
    let got = settled(&work, &pool, 8).await?;
    ensure!(got[7..] == [ids["old_o2"].clone()], "{got:?}");

    // An empty window is not an error.
    let out = work
        .run(&[
            "replay",
            "--since",
            "2020-01-01T00:00:00Z",
            "--until",
            "2020-01-02T00:00:00Z",
            "--config",
            cfg,
        ])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("nothing to replay"),
        "{out:?}"
    );
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    ensure!(
        published(&work).len() == 8,
        "extra events published: {:?}",
        published(&work)
    );

    // A large selection goes back in batches (relay stopped: count what was put back).
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, state, delivered_at) SELECT 'Bulk', 'b' || (n % 7), 'bulk', 'x', 'delivered', now() FROM generate_series(1, 12345) AS n")
        .execute(&pool)
        .await?;
    let out = work
        .run(&[
            "replay", "--since", "10m", "--type", "bulk", "--yes", "--config", cfg,
        ])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("12345 event(s) put back"),
        "{out:?}"
    );
    ensure!(pending(&pool).await == 12_345);

    // Bad input.
    let out = work
        .run(&["replay", "--since", "yesterday", "--config", cfg])
        .await?;
    out.assert_clear_error("`yesterday` is neither an RFC 3339 time")?;
    let out = work
        .run(&["replay", "--since", "1h", "--until", "2h", "--config", cfg])
        .await?;
    out.assert_clear_error("must be after --since")?;
    let delete = work.write_config(
        "delete.toml",
        &format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\non_delivered = \"delete\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n"),
    )?;
    let out = work
        .run(&[
            "replay",
            "--since",
            "1h",
            "--config",
            delete.to_str().context("path")?,
        ])
        .await?;
    out.assert_clear_error("nothing can be replayed")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_replay_restreams_the_selected_events_in_order() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let work = Workdir::new()?;
    // Slots are cluster-wide: each run gets its own.
    let tag = format!("replay{}", Uuid::new_v4().simple());
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n"
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = PgPool::connect(&url).await?;
    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    let mut ids = Vec::new();
    for aggregate in ["o1", "o2", "o1"] {
        let id = Uuid::now_v7();
        sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'Order', $2, 'order.changed', '{}')")
            .bind(id)
            .bind(aggregate)
            .execute(&pool)
            .await?;
        ids.push(id.to_string());
    }
    let wait_for = |n: usize| {
        let work = &work;
        async move {
            outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
                published(work).len() >= n
            })
            .await
            .with_context(|| {
                format!(
                    "expected {n} published: {:?}\n{}",
                    published(work),
                    work.read_log("relay.log")
                )
            })
        }
    };
    wait_for(3).await?;
    let out = work
        .run(&[
            "replay",
            "--since",
            "1h",
            "--aggregate",
            "o1",
            "--yes",
            "--config",
            cfg,
        ])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("2 event(s) put back"),
        "{out:?}"
    );
    wait_for(5).await?;
    let got = published(&work);
    ensure!(got[3..] == [ids[0].clone(), ids[2].clone()], "{got:?}");
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    ensure!(published(&work).len() == 5, "{:?}", published(&work));
    // The walsender may still be ending after the relay exited: drop once it let go.
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(format!("s_{tag}"))
            .execute(&pool)
            .await
            .is_ok()
    })
    .await
    .context("dropping the test's replication slot")?;
    Ok(())
}

/// SQLite, the embedded default: the same selection rules; a replayed event keeps its `seq`,
/// so it goes out again ahead of its aggregate's later pending events, and its aggregate's
/// next `aggregate_seq`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_replay_republishes_the_selected_events() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let cfg_path = work.write_config(
        "outbox.toml",
        "[source]\nkind = \"sqlite\"\npath = \"outbox.db\"\n[relay]\npoll_interval = \"10ms\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n",
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let db = work.path().join("outbox.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display())).await?;
    let sqlite_pending = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state <> 'delivered'")
            .fetch_one(&pool)
            .await
            .unwrap_or(-1)
    };
    let now = time::OffsetDateTime::now_utc();
    let mut ids = std::collections::HashMap::new();
    for (name, aggregate, event_type, age_hours) in [
        ("old_o1", "o1", "order.changed", 3),
        ("old_o2", "o2", "order.paid", 3),
        ("o1_a", "o1", "order.changed", 0),
        ("o2_a", "o2", "order.paid", 0),
        ("o1_b", "o1", "order.changed", 0),
    ] {
        let id = Uuid::now_v7();
        let created = now - time::Duration::hours(age_hours);
        let micros = i64::try_from(created.unix_timestamp_nanos() / 1_000)?;
        sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) VALUES (?1, 'Order', ?2, ?3, '{}', ?4)")
            .bind(id.to_string())
            .bind(aggregate)
            .bind(event_type)
            .bind(micros)
            .execute(&pool)
            .await?;
        ids.insert(name, id.to_string());
    }
    let settled = |n: usize| {
        let work = &work;
        let sqlite_pending = &sqlite_pending;
        async move {
            outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
                published(work).len() >= n && sqlite_pending().await == 0
            })
            .await
            .with_context(|| format!("expected {n} published: {:?}", published(work)))?;
            anyhow::Ok(published(work))
        }
    };
    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    ensure!(settled(5).await?.len() == 5);

    let out = work
        .run(&["replay", "--since", "1h", "--dry-run", "--config", cfg])
        .await?;
    ensure!(
        out.code == Some(0)
            && out.stdout.contains("3 delivered event(s)")
            && out.stdout.contains(&ids["o1_a"])
            && out.stdout.contains("dry run: nothing replayed"),
        "{out:?}"
    );
    ensure!(sqlite_pending().await == 0, "--dry-run changed rows");

    // One aggregate, recent events: exactly o1_a then o1_b again, same ids, in order.
    let out = work
        .run(&[
            "replay",
            "--since",
            "1h",
            "--aggregate",
            "o1",
            "--yes",
            "--config",
            cfg,
        ])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("2 event(s) put back"),
        "{out:?}"
    );
    let got = settled(7).await?;
    ensure!(
        got[5..] == [ids["o1_a"].clone(), ids["o1_b"].clone()],
        "{got:?}"
    );

    // One event type over a window that covers only the old events.
    let out = work
        .run(&[
            "replay",
            "--since",
            "4h",
            "--until",
            "2h",
            "--type",
            "order.paid",
            "--yes",
            "--config",
            cfg,
        ])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("1 event(s) put back"),
        "{out:?}"
    );
    let got = settled(8).await?;
    ensure!(got[7..] == [ids["old_o2"].clone()], "{got:?}");
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));

    // The replayed copies carry the aggregate's next numbers: o1 went 1, 2, 3, then 4, 5.
    let lines = std::fs::read_to_string(work.path().join("events.jsonl"))?;
    let o1_seqs: Vec<String> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["aggregate_id"] == "o1")
        .map(|v| v["headers"]["aggregate_seq"].to_string())
        .collect();
    ensure!(
        o1_seqs == ["\"1\"", "\"2\"", "\"3\"", "\"4\"", "\"5\""],
        "{o1_seqs:?}\n{lines}"
    );

    // Delete mode keeps nothing to replay: a clear error.
    let delete = work.write_config(
        "delete.toml",
        "[source]\nkind = \"sqlite\"\npath = \"outbox.db\"\non_delivered = \"delete\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n",
    )?;
    let out = work
        .run(&[
            "replay",
            "--since",
            "1h",
            "--config",
            delete.to_str().context("path")?,
        ])
        .await?;
    out.assert_clear_error("nothing can be replayed")?;
    Ok(())
}
