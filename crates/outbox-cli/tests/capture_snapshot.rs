//! `outbox capture snapshot` (docs/capture.md, "Snapshot") against real servers: the rows
//! already in a captured table become `capture_op: snapshot` events while writers keep
//! updating them.
//!
//! The PostgreSQL test: a table of `ROWS` rows (100,000 here; 1,000,000 in the `#[ignore]`d
//! benchmark variant), four writers updating rows (half of their updates aimed just ahead of
//! the snapshot's recorded key, where a chunk is about to read: the race a snapshot must
//! survive), the snapshot killed with SIGKILL a third of the way and run again. Then:
//! - every row has exactly one snapshot event (the killed run's chunks were not written
//!   twice, and the rerun resumed after the last committed one);
//! - for every row, the last event of its aggregate in `seq` order (the outbox's commit order
//!   per aggregate, which the relay delivers in) carries the row's current value.
//!
//! Without the chunk's `FOR SHARE` the second check fails: a chunk reads a row, a writer
//! commits its update (event first), the chunk's older image lands after it.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use rand::Rng;
use sqlx::PgPool;
use support::Workdir;

const ITEMS_CAPTURE: &str = r#"
[[capture]]
table = "items"
aggregate_type = "Item"
aggregate_id = "id"
event_type = "item.changed"
on = ["insert", "update"]
"#;

fn pg_config(url: &str, extra: &str) -> String {
    format!(
        "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n{extra}"
    )
}

/// A fresh database with the outbox migrated, `ddl` run, and `capture` in `outbox.toml`.
async fn pg_database(work: &Workdir, ddl: &str, capture: &str) -> anyhow::Result<(PgPool, String)> {
    let url = Postgres::shared().await?.fresh_database().await?;
    let cfg = work.write_config("outbox.toml", &pg_config(&url, capture))?;
    let cfg = cfg.to_str().context("path")?.to_owned();
    work.run_ok(&["migrate", "--config", &cfg]).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.to_owned()))
        .execute(&pool)
        .await?;
    Ok((pool, cfg))
}

/// Rows snapshotted so far (0 before the progress table exists).
async fn progress(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT rows FROM outbox_capture_snapshots WHERE name = 'items'")
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// Updates rows until `stop`: half at random, half just after the snapshot's recorded key.
async fn writer(
    pool: PgPool,
    rows: i64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    while !stop.load(Ordering::Relaxed) {
        let last: Option<i64> = sqlx::query_scalar(
            "SELECT (last_key #>> '{}')::bigint FROM outbox_capture_snapshots WHERE name = 'items'",
        )
        .fetch_optional(&pool)
        .await
        .ok()
        .flatten()
        .flatten();
        let id = {
            let mut rng = rand::rng();
            match last {
                Some(k) if rng.random_bool(0.5) => (k + rng.random_range(1..=4_000)).min(rows),
                _ => rng.random_range(1..=rows),
            }
        };
        sqlx::query("UPDATE items SET v = v + 1, note = 'w' || v WHERE id = $1")
            .bind(id)
            .execute(&pool)
            .await?;
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

async fn snapshot_during_updates_with_a_kill(rows: i64) -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let ddl = format!(
        "CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0, note text);
         INSERT INTO items (id, note) SELECT g, 'row ' || g FROM generate_series(1, {rows}) AS g;
         ANALYZE items;"
    );
    let (pool, cfg) = pg_database(&work, &ddl, ITEMS_CAPTURE).await?;
    work.run_ok(&["capture", "install", "--config", &cfg])
        .await?;

    let stop = Arc::new(AtomicBool::new(false));
    let updates = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(writer(pool.clone(), rows, stop.clone(), updates.clone())))
        .collect();

    // The first run, killed a third of the way.
    let mut first = work
        .command(&["capture", "snapshot", "--config", &cfg, "--rate", "1000000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    outbox_testkit::wait::eventually(Duration::from_secs(300), || async {
        progress(&pool).await >= rows / 3
    })
    .await
    .context("the snapshot did not get a third of the way")?;
    first.start_kill()?;
    first.wait().await?;
    let at_kill = progress(&pool).await;
    ensure!(
        at_kill < rows,
        "the snapshot finished before the kill: {at_kill}"
    );
    let updates_at_kill = updates.load(Ordering::Relaxed);

    // The rerun resumes and finishes.
    let out = work
        .run_ok(&["capture", "snapshot", "--config", &cfg, "--rate", "1000000"])
        .await?;
    ensure!(out.contains("resuming after"), "{out}");
    ensure!(out.contains("snapshot finished"), "{out}");
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await??;
    }
    let updates = updates.load(Ordering::Relaxed);
    ensure!(
        updates_at_kill > 0 && updates > updates_at_kill,
        "writers must update during both runs: {updates_at_kill} then {updates}"
    );

    let (recorded, finished): (i64, bool) = sqlx::query_as(
        "SELECT rows, finished_at IS NOT NULL FROM outbox_capture_snapshots WHERE name = 'items'",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(
        recorded == rows && finished,
        "progress: {recorded} rows, finished {finished}"
    );
    // Exactly one snapshot event per row: none lost, none written twice across the kill.
    let (events, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT aggregate_id) FROM outbox WHERE headers->>'capture_op' = 'snapshot'",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(
        events == rows && distinct == rows,
        "{events} snapshot events for {distinct} of {rows} rows"
    );
    // The last event of every row's aggregate, in seq order, is the row as it is now.
    let stale: Vec<(String, i64, Option<i64>, Option<String>)> = sqlx::query_as(
        "WITH last AS (
             SELECT DISTINCT ON (aggregate_id) aggregate_id,
                    convert_from(payload, 'UTF8')::jsonb AS p, headers->>'capture_op' AS op
             FROM outbox WHERE aggregate_type = 'Item'
             ORDER BY aggregate_id, seq DESC
         )
         SELECT i.id::text, i.v, (l.p->>'v')::bigint, l.op
         FROM items AS i LEFT JOIN last AS l ON l.aggregate_id = i.id::text
         WHERE l.p IS NULL OR l.p <> to_jsonb(i)
         LIMIT 10",
    )
    .fetch_all(&pool)
    .await?;
    ensure!(
        stale.is_empty(),
        "rows whose last event is not their current state (id, v, event's v, op): {stale:?}"
    );
    println!("{rows} rows, {updates} concurrent updates, killed at {at_kill}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_snapshot_during_updates_survives_a_kill_and_ends_with_each_rows_state()
-> anyhow::Result<()> {
    snapshot_during_updates_with_a_kill(100_000).await
}

/// The issue's size; minutes on a busy 2-core machine, so run by hand:
/// `cargo test -p outbox-cli --test capture_snapshot -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark size (1,000,000 rows): run with --ignored"]
async fn pg_snapshot_of_a_million_rows_during_updates() -> anyhow::Result<()> {
    snapshot_during_updates_with_a_kill(1_000_000).await
}

/// Events and snapshot progress rows: what a refused snapshot must not have changed.
async fn written(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await?;
    let progress: i64 = sqlx::query_scalar(
        "SELECT CASE WHEN to_regclass('outbox_capture_snapshots') IS NULL THEN 0
                ELSE (xpath('/row/c/text()', query_to_xml('SELECT count(*) AS c FROM outbox_capture_snapshots', false, true, '')))[1]::text::bigint END",
    )
    .fetch_one(pool)
    .await?;
    Ok((events, progress))
}

#[tokio::test]
async fn pg_snapshot_refuses_bad_input_and_changes_nothing() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let capture = r#"
[[capture]]
table = "items"
aggregate_type = "Item"
aggregate_id = "id"
event_type = "item.changed"

[[capture]]
table = "loose"
aggregate_type = "Loose"
aggregate_id = "id"
event_type = "loose.changed"

[[capture]]
table = "pairs"
aggregate_type = "Pair"
aggregate_id = "a"
event_type = "pair.changed"

[[capture]]
table = "docs"
aggregate_type = "Doc"
aggregate_id = "owner"
event_type = "doc.changed"
payload = "body"
"#;
    let ddl = "CREATE TABLE items (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
               INSERT INTO items (id) SELECT generate_series(1, 10);
               CREATE TABLE loose (id bigint NOT NULL, v bigint);
               INSERT INTO loose (id) VALUES (1);
               CREATE TABLE pairs (a int, b int, PRIMARY KEY (a, b));
               INSERT INTO pairs VALUES (1, 1);
               CREATE TABLE docs (id bigint PRIMARY KEY, owner text NOT NULL, body jsonb NOT NULL);
               INSERT INTO docs VALUES (1, 'o1', '{\"k\": 1}');";
    let (pool, cfg) = pg_database(&work, ddl, capture).await?;
    let snapshot = |name: &'static str| {
        let cfg = cfg.clone();
        let work = &work;
        async move {
            work.run(&["capture", "snapshot", "--config", &cfg, "--name", name])
                .await
        }
    };

    // Not installed yet: the snapshot would not be kept current.
    snapshot("items")
        .await?
        .assert_clear_error("capture[0].name: capture `items` is not installed")?;
    ensure!(written(&pool).await? == (0, 0));
    work.run_ok(&["capture", "install", "--config", &cfg])
        .await?;

    work.run(&["capture", "snapshot", "--config", &cfg, "--name", "nope"])
        .await?
        .assert_clear_error("--name nope: no [[capture]] entry has this name")?;
    let out = work
        .run(&["capture", "snapshot", "--config", &cfg, "--rate", "0"])
        .await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("--rate"),
        "{out:?}"
    );
    snapshot("loose")
        .await?
        .assert_clear_error("capture[1].table: table public.loose has no primary key")?;
    snapshot("pairs").await?.assert_clear_error(
        "capture[2].table: table public.pairs has a composite primary key (a, b)",
    )?;
    // The table lost a column the capture reads.
    sqlx::query("ALTER TABLE docs DROP COLUMN body")
        .execute(&pool)
        .await?;
    snapshot("docs").await?.assert_clear_error(
        "capture[3].payload: column `body` does not exist in table public.docs",
    )?;
    let (events, _) = written(&pool).await?;
    ensure!(events == 0, "a refused snapshot wrote {events} events");

    // A good one still works, and a second run starts a new snapshot.
    let out = snapshot("items").await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(out.stdout.contains("snapshot finished: 10 rows"), "{out:?}");
    let out = snapshot("items").await?;
    ensure!(
        out.stdout.contains("starting") && out.stdout.contains("10 rows"),
        "{out:?}"
    );
    let payloads: Vec<(String, String, serde_json::Value)> = sqlx::query_as(
        "SELECT aggregate_id, event_type, convert_from(payload, 'UTF8')::jsonb FROM outbox
         WHERE headers = jsonb_build_object('capture_op', 'snapshot', 'capture_table', 'public.items')
         ORDER BY seq",
    )
    .fetch_all(&pool)
    .await?;
    ensure!(payloads.len() == 20, "{payloads:?}");
    ensure!(
        payloads[0]
            == (
                "1".into(),
                "item.changed".into(),
                serde_json::json!({"id": 1, "v": 0})
            ),
        "{:?}",
        payloads[0]
    );
    Ok(())
}
