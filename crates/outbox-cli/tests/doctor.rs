//! `outbox doctor`: green on a healthy setup with a relay running; each broken condition it
//! claims to detect is made to happen for real and turns its check red (non-zero exit): a
//! dropped index, an idle-in-transaction session holding a snapshot, a missing migration,
//! table bloat, an old pending event, an unreachable sink, a missing CDC slot, a bad config.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use sqlx::Connection;
use support::{Output, Workdir, terminate};

/// Runs `outbox doctor --json` and returns the exit code and the checks by name.
async fn doctor(
    work: &Workdir,
    cfg: &str,
    extra: &[&str],
) -> anyhow::Result<(Output, serde_json::Value)> {
    let mut args = vec!["doctor", "--json", "--config", cfg, "--sink-timeout", "2s"];
    args.extend_from_slice(extra);
    let out = work.run(&args).await?;
    let report: serde_json::Value =
        serde_json::from_str(&out.stdout).with_context(|| format!("doctor --json: {out:?}"))?;
    Ok((out, report))
}

fn check<'a>(report: &'a serde_json::Value, name: &str) -> anyhow::Result<&'a serde_json::Value> {
    report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .with_context(|| format!("no `{name}` check in {report}"))
}

fn ensure_red(
    out: &Output,
    report: &serde_json::Value,
    name: &str,
    needle: &str,
) -> anyhow::Result<()> {
    let c = check(report, name)?;
    ensure!(c["health"] == "red", "`{name}` is not red: {report}");
    ensure!(
        c["detail"].as_str().is_some_and(|d| d.contains(needle))
            || c["fix"].as_str().is_some_and(|f| f.contains(needle)),
        "`{name}` does not mention `{needle}`: {c}"
    );
    ensure!(
        out.code == Some(1) && out.stderr.contains("check(s) red"),
        "a red check must fail the command: {out:?}"
    );
    Ok(())
}

fn reds(report: &serde_json::Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|c| c["health"] == "red")
                .map(|c| c["name"].as_str().unwrap_or("?").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_is_green_when_healthy_and_red_for_each_real_fault() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let base = format!(
        "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n[metrics]\nstuck_after = \"10m\"\n",
        hooks.url_for("/in")
    );
    let cfg_path = work.write_config("outbox.toml", &base)?;
    let cfg = cfg_path.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = sqlx::PgPool::connect(&url).await?;

    // Healthy, with a relay running and publishing.
    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o1', 'order.placed', 'x')")
        .execute(&pool)
        .await?;
    hooks.wait_for_accepted(1, Duration::from_secs(30)).await?;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    ensure!(out.code == Some(0), "healthy setup is not green: {out:?}");
    ensure!(reds(&report).is_empty(), "{report}");
    for name in [
        "config",
        "schema",
        "indexes",
        "idle_transactions",
        "bloat",
        "oldest_pending",
        "dead_letters",
        "sink",
    ] {
        ensure!(
            check(&report, name)?["health"] == "ok",
            "`{name}` not ok: {report}"
        );
    }
    let text = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(
        text.code == Some(0) && text.stdout.contains("ok    schema"),
        "{text:?}"
    );
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));

    // An idle-in-transaction session holding a snapshot.
    let mut idle = sqlx::PgConnection::connect(&url).await?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut idle)
        .await?;
    let idle_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut idle)
        .await?;
    let (out, report) = doctor(&work, cfg, &["--stale-transaction", "0s"]).await?;
    ensure_red(
        &out,
        &report,
        "idle_transactions",
        &format!("pg_terminate_backend({idle_pid})"),
    )?;
    ensure!(reds(&report) == ["idle_transactions"], "{report}");
    sqlx::query("ROLLBACK").execute(&mut idle).await?;

    // A dropped index.
    sqlx::query("DROP INDEX outbox_held_idx")
        .execute(&pool)
        .await?;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    ensure_red(
        &out,
        &report,
        "indexes",
        "CREATE INDEX CONCURRENTLY \"outbox_held_idx\"",
    )?;
    sqlx::query("CREATE INDEX outbox_held_idx ON outbox (aggregate_type, aggregate_id, seq) WHERE state = 'dead' OR (state = 'pending' AND attempts > 0)")
        .execute(&pool)
        .await?;

    // A missing migration: schema version 1 only; `outbox migrate` fixes it.
    sqlx::query("ALTER TABLE outbox DROP COLUMN attempt_errors")
        .execute(&pool)
        .await?;
    sqlx::query("DELETE FROM outbox_migrations WHERE version >= 2")
        .execute(&pool)
        .await?;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    ensure_red(&out, &report, "schema", "0002_attempt_history")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let (out, _) = doctor(&work, cfg, &[]).await?;
    ensure!(out.code == Some(0), "still red after migrate: {out:?}");

    // Bloat: 20,000 dead tuples that autovacuum is not allowed to remove.
    let mut conn = sqlx::PgConnection::connect(&url).await?;
    sqlx::query("ALTER TABLE outbox SET (autovacuum_enabled = false)")
        .execute(&mut conn)
        .await?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, state, delivered_at) SELECT 'Bulk', 'b' || n, 'bulk', 'x', 'delivered', now() FROM generate_series(1, 20000) AS n")
        .execute(&mut conn)
        .await?;
    sqlx::query("DELETE FROM outbox WHERE aggregate_type = 'Bulk'")
        .execute(&mut conn)
        .await?;
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut conn)
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'",
        )
        .fetch_one(&pool)
        .await
        .is_ok_and(|n| n >= 20_000)
    })
    .await
    .context("the statistics never showed the dead tuples")?;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    ensure_red(&out, &report, "bloat", "VACUUM")?;
    sqlx::query("VACUUM outbox").execute(&mut conn).await?;

    // A pending event older than metrics.stuck_after, with no relay running.
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) VALUES ('Order', 'o2', 'order.placed', 'x', now() - interval '1 hour')")
        .execute(&pool)
        .await?;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    ensure_red(&out, &report, "oldest_pending", "stuck_after")?;
    sqlx::query("DELETE FROM outbox WHERE aggregate_id = 'o2'")
        .execute(&pool)
        .await?;

    // An unreachable sink.
    hooks.stop().await;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    ensure_red(&out, &report, "sink", "unreachable")?;
    ensure!(reds(&report) == ["sink"], "{report}");

    // CDC configured, but its replication slot does not exist (slots are cluster-wide: a
    // name of its own).
    let slot_name = format!("doc_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    let cdc = work.write_config(
        "cdc.toml",
        &base.replace(
            "kind = \"postgres\"\n",
            &format!("kind = \"postgres\"\nmode = \"cdc\"\nslot = \"{slot_name}\"\n"),
        ),
    )?;
    let (out, report) = doctor(&work, cdc.to_str().context("path")?, &[]).await?;
    ensure_red(&out, &report, "replication_slot", &slot_name)?;
    ensure!(check(&report, "wal_level")?["health"] == "ok", "{report}");
    // The test server keeps the default max_slot_wal_keep_size = -1 (unlimited): a warning.
    ensure!(
        check(&report, "max_slot_wal_keep_size")?["health"] == "warn",
        "{report}"
    );
    // Once `outbox migrate` created the slot, with no relay streaming: a warning, not red.
    let cdc_cfg = cdc.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cdc_cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let (_, report) = doctor(&work, cdc_cfg, &[]).await?;
    let slot = check(&report, "replication_slot")?;
    ensure!(
        slot["health"] == "warn"
            && slot["detail"]
                .as_str()
                .is_some_and(|d| d.contains("no relay streams")),
        "{report}"
    );
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot_name)
        .execute(&pool)
        .await?;

    // A config with an unknown key: one red check naming it, not a crash.
    let bad = work.write_config("bad.toml", &format!("{base}[relay]\nbatch_sise = 10\n"))?;
    let (out, report) = doctor(&work, bad.to_str().context("path")?, &[]).await?;
    ensure_red(&out, &report, "config", "batch_sise")?;
    Ok(())
}

/// Faults the on-call engineer meets in CDC mode: a dead-lettered row is a warning there too,
/// and a dropped publication (on which `outbox relay` refuses to start) is red.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_in_cdc_mode_sees_dead_letters_and_a_dropped_publication() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    // Slots are cluster-wide: names of their own.
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..16];
    let cfg_path = work.write_config(
        "cdc.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = sqlx::PgPool::connect(&url).await?;
    let cleanup = async {
        let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(format!("s_{tag}"))
            .execute(&pool)
            .await;
    };

    let (_, report) = doctor(&work, cfg, &[]).await?;
    let publication = check(&report, "publication")?;
    ensure!(publication["health"] == "ok", "{report}");
    ensure!(
        check(&report, "dead_letters")?["health"] == "ok",
        "{report}"
    );

    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, state) VALUES ('Order', 'o1', 'order.placed', 'x', 'dead')")
        .execute(&pool)
        .await?;
    let (_, report) = doctor(&work, cfg, &[]).await?;
    let dead = check(&report, "dead_letters")?;
    ensure!(
        dead["health"] == "warn" && dead["detail"].as_str().is_some_and(|d| d.contains('1')),
        "{report}"
    );

    sqlx::query(sqlx::AssertSqlSafe(format!("DROP PUBLICATION p_{tag}")))
        .execute(&pool)
        .await?;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    let verdict = ensure_red(&out, &report, "publication", &format!("p_{tag}"));
    cleanup.await;
    verdict
}

/// A database that accepts the connection and never answers (a hung server, a half-open
/// network path): the verdict names the URL (password hidden) and says it did not answer in
/// time, and the broker is checked all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_a_hung_database_did_not_answer() -> anyhow::Result<()> {
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = hung.local_addr()?.port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            open.push(socket);
        }
    });
    let hooks = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"postgres://app:Hung-Secret-51@127.0.0.1:{port}/app\"\nconnect_timeout = \"1s\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    let (out, report) = doctor(&work, cfg, &[]).await?;
    held.abort();
    ensure_red(&out, &report, "database", "did not answer within 1s")?;
    let detail = check(&report, "database")?["detail"].to_string();
    ensure!(
        detail.contains(&format!("127.0.0.1:{port}")) && !detail.contains("pool timed out"),
        "{report}"
    );
    ensure!(check(&report, "sink")?["health"] == "ok", "{report}");
    ensure!(
        !format!("{}{}", out.stdout, out.stderr).contains("Hung-Secret-51"),
        "the password was printed: {out:?}"
    );
    Ok(())
}

/// The NATS sink check looks the stream up and creates nothing; stderr carries no client
/// chatter (INFO lines, retry warnings), only the verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_nats_without_creating_the_stream() -> anyhow::Result<()> {
    use outbox_testkit::services::Nats;
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    let stream = format!("DOC_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]).to_uppercase();
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"nats\"\nurl = \"{}\"\nstream = \"{stream}\"\ndestination = \"{}.{{aggregate_type}}\"\n",
            nats.url(),
            stream.to_lowercase()
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    // As a user runs it: without the suite's OUTBOX_LOG=info.
    let text = work.run_as_user(&["doctor", "--config", cfg]).await?;
    ensure!(text.code == Some(0), "{text:?}");
    ensure!(
        text.stdout.contains("no stream captures"),
        "the verdict should say the stream does not exist yet: {text:?}"
    );
    ensure!(
        !text.stderr.contains("INFO") && !text.stderr.contains("WARN"),
        "stderr carries log chatter: {}",
        text.stderr
    );
    let js = async_nats::jetstream::new(nats.connect().await?);
    ensure!(
        js.get_stream(&stream).await.is_err(),
        "doctor created the stream `{stream}`"
    );
    Ok(())
}
