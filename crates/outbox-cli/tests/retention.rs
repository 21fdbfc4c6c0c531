//! `outbox retention run`, the relay's `[retention]` schedule, partitioned `migrate`, and bad
//! input, through the binary against a real PostgreSQL (and a SQLite file).

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use outbox_testkit::wait::eventually;
use sqlx::PgPool;
use support::{Workdir, terminate};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

async fn migrated(
    work: &Workdir,
    extra_source: &str,
    rest: &str,
) -> anyhow::Result<(String, PgPool)> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n{extra_source}\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n{rest}"
        ),
    )?;
    let cfg = cfg.to_str().context("utf-8 path")?.to_owned();
    let out = work.run(&["migrate", "--config", &cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    Ok((cfg, PgPool::connect(&url).await?))
}

/// `n` rows in `state`, created (and delivered or dead-lettered) `age` ago; returns the ids.
async fn rows(pool: &PgPool, n: i32, state: &str, age: &str) -> anyhow::Result<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, state,
                             delivered_at, dead_lettered_at, next_attempt_at, attempts)
         SELECT 'Order', $2 || '-' || i, 'order.placed', '\\x7b7d', now() - $3::interval, $2,
                CASE WHEN $2 = 'delivered' THEN now() - $3::interval END,
                CASE WHEN $2 = 'dead' THEN now() - $3::interval END,
                CASE WHEN $2 = 'pending' THEN 'infinity'::timestamptz ELSE '-infinity' END,
                CASE WHEN $2 = 'pending' THEN 1 ELSE 0 END
         FROM generate_series(1, $1) AS i
         RETURNING id",
    )
    .bind(n)
    .bind(state)
    .bind(age)
    .fetch_all(pool)
    .await?)
}

async fn states(pool: &PgPool) -> anyhow::Result<Vec<(String, i64)>> {
    Ok(
        sqlx::query_as("SELECT state, count(*) FROM outbox GROUP BY state ORDER BY state")
            .fetch_all(pool)
            .await?,
    )
}

#[tokio::test]
async fn retention_run_deletes_only_delivered_events_past_the_window() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (cfg, pool) = migrated(&work, "", "").await?;
    rows(&pool, 23, "delivered", "3 days").await?;
    rows(&pool, 4, "delivered", "1 hour").await?;
    // Waiting for a retry (pending, not claimable) and dead letters, all old.
    rows(&pool, 5, "pending", "30 days").await?;
    rows(&pool, 2, "dead", "30 days").await?;

    let out = work
        .run(&[
            "retention",
            "run",
            "--config",
            &cfg,
            "--older-than",
            "1d",
            "--dry-run",
        ])
        .await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout
            .contains("would delete 23 delivered event(s) older than 1day"),
        "{out:?}"
    );
    ensure!(states(&pool).await?.iter().map(|(_, n)| n).sum::<i64>() == 34);

    let out = work
        .run(&[
            "retention",
            "run",
            "--config",
            &cfg,
            "--older-than",
            "1d",
            "--batch",
            "5",
        ])
        .await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout
            .contains("deleted 23 delivered event(s) older than 1day")
            && out.stdout.contains("in 5 batch(es)"),
        "{out:?}"
    );
    ensure!(
        states(&pool).await?
            == [
                ("dead".to_owned(), 2),
                ("delivered".to_owned(), 4),
                ("pending".to_owned(), 5)
            ],
        "{:?}",
        states(&pool).await?
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_runs_retention_on_its_schedule_while_it_publishes() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let (cfg, pool) = migrated(
        &work,
        "",
        &format!(
            "[retention]\nkeep = \"1h\"\ninterval = \"1s\"\nbatch = 50\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"
        ),
    )
    .await?;
    let old = rows(&pool, 420, "delivered", "2 hours").await?;
    let dead = rows(&pool, 3, "dead", "2 hours").await?;
    let mut relay = work.spawn_relay(std::path::Path::new(&cfg), "relay.log")?;
    // Producers keep writing while the schedule deletes.
    let mut fresh = Vec::new();
    for i in 0..20 {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'Order', 'o-' || ($1 * 10 + g), 'order.placed', '\\x7b7d'
             FROM generate_series(1, 10) AS g RETURNING id",
        )
        .bind(i)
        .fetch_all(&pool)
        .await?;
        fresh.extend(ids);
    }
    let check = || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = ANY($1)")
            .bind(&old)
            .fetch_one(&pool)
            .await
            .unwrap_or(-1);
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'pending'")
                .fetch_one(&pool)
                .await
                .unwrap_or(-1);
        left == 0 && pending == 0
    };
    let host = format!("127.0.0.1:{metrics_port}");
    let waited = eventually(WAIT, check).await;
    // The run's counter is exported once the run has finished.
    let counted = eventually(WAIT, || async {
        support_get(&host, "/metrics")
            .await
            .is_ok_and(|m| m.contains("outbox_retention_deleted_total 420"))
    })
    .await;
    let metrics = support_get(&host, "/metrics").await;
    let code = terminate(&mut relay, WAIT).await?;
    waited.with_context(|| work.read_log("relay.log"))?;
    counted.with_context(|| format!("metrics: {metrics:?}"))?;
    ensure!(code == Some(0), "relay exit {code:?}");
    // Every fresh event was published and kept (delivered within the window); the dead
    // letters are still there.
    let published = std::fs::read_to_string(work.path().join("events.jsonl"))?;
    for id in &fresh {
        ensure!(
            published.contains(&id.to_string()),
            "event {id} not published"
        );
    }
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = ANY($1)")
        .bind(fresh.iter().chain(&dead).copied().collect::<Vec<_>>())
        .fetch_one(&pool)
        .await?;
    ensure!(kept == 203, "{kept} of 203 recent or dead rows left");
    let log = work.read_log("relay.log");
    ensure!(log.contains("retention schedule started"), "{log}");
    let metrics = metrics?;
    ensure!(
        metrics.contains("outbox_retention_last_run_duration_seconds"),
        "metrics:\n{metrics}"
    );
    Ok(())
}

#[tokio::test]
async fn partitioned_migrate_creates_partitions_and_retention_rotates_them() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\npartitioning = \"hourly\"\n[sink]\nkind = \"stdout\"\n"
        ),
    )?;
    let cfg = cfg.to_str().context("utf-8 path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout.matches("created partition").count() == 5
            && out.stdout.contains("created partition outbox_default"),
        "{out:?}"
    );
    let pool = PgPool::connect(&url).await?;
    // An old partition holding a pending event and delivered ones, and an old delivered-only
    // partition.
    for (name, from, to) in [
        (
            "outbox_h2020010100",
            "2020-01-01 00:00+00",
            "2020-01-01 01:00+00",
        ),
        (
            "outbox_h2020010101",
            "2020-01-01 01:00+00",
            "2020-01-01 02:00+00",
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {name} PARTITION OF outbox FOR VALUES FROM ('{from}') TO ('{to}')"
        )))
        .execute(&pool)
        .await?;
    }
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, state, delivered_at)
         VALUES ('Order', 'a', 'e', '\\x00', '2020-01-01 00:10+00', 'pending', NULL),
                ('Order', 'b', 'e', '\\x00', '2020-01-01 00:20+00', 'delivered', '2020-01-01 00:21+00'),
                ('Order', 'c', 'e', '\\x00', '2020-01-01 01:10+00', 'delivered', '2020-01-01 01:11+00')",
    )
    .execute(&pool)
    .await?;
    let out = work
        .run(&["retention", "run", "--config", cfg, "--older-than", "1d"])
        .await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout
            .contains("dropped partition outbox_h2020010101 (1 delivered event(s))")
            && out
                .stdout
                .contains("kept partition outbox_h2020010100: holds 1 undelivered")
            && out.stdout.contains("deleted 1 delivered event(s)"),
        "{out:?}"
    );
    let left: Vec<String> = sqlx::query_scalar("SELECT aggregate_id FROM outbox ORDER BY 1")
        .fetch_all(&pool)
        .await?;
    ensure!(left == ["a"], "{left:?}");
    Ok(())
}

#[tokio::test]
async fn retention_on_sqlite_deletes_old_delivered_events() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"stdout\"\n",
    )?;
    let cfg = cfg.to_str().context("utf-8 path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        work.path().join("app.db").display()
    ))
    .await?;
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, state, delivered_at)
         VALUES ('Order', 'a', 'e', X'00', 'delivered', 1000),
                ('Order', 'b', 'e', X'00', 'pending', NULL),
                ('Order', 'c', 'e', X'00', 'delivered', 2000)",
    )
    .execute(&pool)
    .await?;
    let out = work.run(&["retention", "run", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout.contains("deleted 2 delivered event(s)"),
        "{out:?}"
    );
    let left: Vec<String> = sqlx::query_scalar("SELECT aggregate_id FROM outbox")
        .fetch_all(&pool)
        .await?;
    ensure!(left == ["b"], "{left:?}");
    Ok(())
}

#[tokio::test]
async fn bad_retention_input_gets_a_clear_error() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let out = work
        .run(&["retention", "run", "--older-than", "banana"])
        .await?;
    ensure!(out.code.is_some_and(|c| c != 0), "{out:?}");
    ensure!(
        out.stderr.contains("--older-than") && out.stderr.contains("banana"),
        "{out:?}"
    );
    ensure!(!out.stderr.contains("panicked"), "{out:?}");

    let out = work.run(&["retention", "run", "--batch", "0"]).await?;
    ensure!(
        out.code.is_some_and(|c| c != 0) && out.stderr.contains("--batch"),
        "{out:?}"
    );

    let cfg = work.write_config("unknown.toml", "[retention]\nkept = \"1d\"\n")?;
    let out = work
        .run(&[
            "retention",
            "run",
            "--config",
            cfg.to_str().context("path")?,
        ])
        .await?;
    out.assert_clear_error("retention")?;
    ensure!(out.stderr.contains("unknown key `kept`"), "{out:?}");

    let cfg = work.write_config("zero.toml", "[retention]\nbatch = 0\n")?;
    let out = work
        .run(&["relay", "--config", cfg.to_str().context("path")?])
        .await?;
    out.assert_clear_error("retention.batch: must be greater than 0")?;

    let cfg = work.write_config("keep.toml", "[retention]\nkeep = \"a week\"\n")?;
    let out = work
        .run(&["check-config", "--config", cfg.to_str().context("path")?])
        .await?;
    out.assert_clear_error("retention.keep")?;

    let cfg = work.write_config(
        "monthly.toml",
        "[source]\nkind = \"postgres\"\nurl = \"postgres://x@127.0.0.1/x\"\npartitioning = \"monthly\"\n",
    )?;
    let out = work
        .run(&["migrate", "--config", cfg.to_str().context("path")?])
        .await?;
    // The key inside the tagged `[source]` table is named too.
    out.assert_clear_error(
        "source.partitioning: unknown value `monthly` (expected one of: none, hourly",
    )?;
    Ok(())
}

#[tokio::test]
async fn partitioning_an_existing_plain_table_is_refused_with_the_way_to_do_it()
-> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (cfg, _pool) = migrated(&work, "", "").await?;
    let text = std::fs::read_to_string(&cfg)?.replace(
        "kind = \"postgres\"\n",
        "kind = \"postgres\"\npartitioning = \"daily\"\n",
    );
    std::fs::write(&cfg, text)?;
    let out = work.run(&["migrate", "--config", &cfg]).await?;
    out.assert_clear_error("never converted silently")?;
    let out = work.run(&["retention", "run", "--config", &cfg]).await?;
    out.assert_clear_error("never converted silently")?;
    Ok(())
}

async fn support_get(host: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await?;
    let (_, body) = buf.split_once("\r\n\r\n").context("no body")?;
    Ok(body.to_owned())
}
