//! `[canary]` with a real relay: probes written into PostgreSQL arrive in NATS JetStream and
//! are timed, with nothing lost and nothing out of order, and the console's tile (in
//! Chromium) shows it; a destination that acknowledges probes and then does not hold them
//! (a file sink whose file is swapped for /dev/null) is caught as lost; a relay built to
//! publish its batches in reverse (`fault-injection`) is caught out of order; a relay whose
//! destination cannot be read back still writes probes, for a consumer-side canary.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Nats, Postgres};
use support::browser::{browser_tools, driver_dir, free_port, http};
use support::{Workdir, terminate};

/// The sum of a metric's samples (every label set) in the relay's `/metrics`; 0 when absent.
async fn metric(port: u16, name: &str) -> anyhow::Result<f64> {
    let (status, body) = http(port, "GET", "/metrics", &[]).await?;
    ensure!(status == 200, "GET /metrics answered {status}");
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.trim().parse::<f64>().ok())?
        })
        .sum())
}

/// Waits until `name` reaches `at_least`.
async fn metric_reaches(
    port: u16,
    name: &str,
    at_least: f64,
    work: &Workdir,
) -> anyhow::Result<()> {
    outbox_testkit::wait::eventually(Duration::from_secs(90), || async {
        metric(port, name).await.is_ok_and(|v| v >= at_least)
    })
    .await
    .with_context(|| {
        format!(
            "{name} never reached {at_least}; relay log:\n{}",
            work.read_log("relay.log")
        )
    })
}

/// Writes `toml` as the work directory's `outbox.toml` and runs `outbox migrate` on it.
async fn migrated_config(work: &Workdir, toml: &str) -> anyhow::Result<std::path::PathBuf> {
    let config = work.write_config("outbox.toml", toml)?;
    let cfg = config.to_str().context("path")?;
    let migrate = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(migrate.code == Some(0), "migrate failed: {migrate:?}");
    Ok(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_arrive_in_jetstream_timed_in_order_and_the_console_tile_shows_them()
-> anyhow::Result<()> {
    let chromium = browser_tools()?;
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let nats = Nats::shared().await?;
    let tag = format!("canary{}", uuid::Uuid::new_v4().simple());
    let port = free_port()?;
    let work = Workdir::new()?;
    let config = migrated_config(
        &work,
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
[relay]
poll_interval = "10ms"
[sink]
kind = "nats"
url = "{nats}"
destination = "{tag}.{{aggregate_id}}"
stream = "{tag}"
[metrics]
listen = "127.0.0.1:{port}"
refresh_interval = "200ms"
[canary]
every = "200ms"
name = "canary-test"
"#,
            nats = nats.url()
        ),
    )
    .await?;
    let mut relay = work.spawn_relay(&config, "relay.log")?;

    metric_reaches(port, "outbox_canary_latency_seconds_count", 5.0, &work).await?;
    ensure!(metric(port, "outbox_canary_probes_total").await? >= 5.0);
    ensure!(
        metric(port, "outbox_canary_lost_total").await? == 0.0,
        "a probe was counted lost on a healthy relay:\n{}",
        work.read_log("relay.log")
    );
    ensure!(metric(port, "outbox_canary_out_of_order_total").await? == 0.0);
    // Every probe arrived within the histogram's range (a sum of latencies, not a timing
    // assertion: it fails only when latencies are absurd, e.g. a negative or unit mistake).
    let sum = metric(port, "outbox_canary_latency_seconds_sum").await?;
    ensure!(sum > 0.0, "latencies were recorded as 0: {sum}");

    // The probes are ordinary events of aggregate `outbox.canary`/`canary-test` in the table.
    let pool = sqlx::PgPool::connect(&url).await?;
    let probes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE aggregate_type = 'outbox.canary' AND aggregate_id = 'canary-test' AND event_type = 'outbox.canary.probe'",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(probes >= 5, "only {probes} probe rows in the outbox table");

    let (status, body) = http(port, "GET", "/ui/api/overview", &[]).await?;
    ensure!(status == 200, "overview answered {status}");
    let overview: serde_json::Value = serde_json::from_str(&body)?;
    let canary = &overview["canary"];
    ensure!(canary["relay"] == "canary-test", "overview: {canary}");
    let destination = &canary["destinations"][0];
    ensure!(
        destination["readable"] == true && destination["arrived"].as_u64() >= Some(5),
        "overview: {canary}"
    );

    let driven = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("node")
            .arg(driver_dir().join("canary.mjs"))
            .env("OUTBOX_UI_URL", format!("http://127.0.0.1:{port}"))
            .env("OUTBOX_CHROMIUM", &chromium)
            .current_dir(driver_dir())
            .output(),
    )
    .await
    .context("the browser script did not finish within 180 s")??;
    let stdout = String::from_utf8_lossy(&driven.stdout);
    ensure!(
        driven.status.success(),
        "canary.mjs failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&driven.stderr)
    );
    ensure!(
        stdout.contains("OK the canary tile shows a latency"),
        "{stdout}"
    );

    terminate(&mut relay, Duration::from_secs(30)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_acknowledged_and_then_not_held_by_the_destination_are_counted_lost()
-> anyhow::Result<()> {
    let port = free_port()?;
    let work = Workdir::new()?;
    let out = work.path().join("events.jsonl");
    let config = migrated_config(
        &work,
        &format!(
            r#"
[source]
kind = "sqlite"
path = "{db}"
[relay]
poll_interval = "10ms"
[sink]
kind = "file"
path = "{out}"
[metrics]
listen = "127.0.0.1:{port}"
[canary]
every = "200ms"
lost_after = "1s"
"#,
            db = work.path().join("outbox.db").display(),
            out = out.display()
        ),
    )
    .await?;
    std::fs::write(&out, "")?;
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    metric_reaches(port, "outbox_canary_latency_seconds_count", 2.0, &work).await?;
    ensure!(metric(port, "outbox_canary_lost_total").await? == 0.0);

    // The destination now acknowledges and keeps nothing: whether the sink appends to the
    // path or to the file it has open, the path reads back empty from here on.
    std::fs::rename(&out, work.path().join("events.old.jsonl"))?;
    std::os::unix::fs::symlink("/dev/null", &out)?;
    metric_reaches(port, "outbox_canary_lost_total", 1.0, &work).await?;
    let log = work.read_log("relay.log");
    ensure!(
        log.contains("canary probe lost"),
        "no error line for the lost probe:\n{log}"
    );
    terminate(&mut relay, Duration::from_secs(30)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_cannot_be_read_back_still_gets_probes() -> anyhow::Result<()> {
    let hooks = HttpReceiver::start().await?;
    let port = free_port()?;
    let work = Workdir::new()?;
    let config = migrated_config(
        &work,
        &format!(
            r#"
[source]
kind = "sqlite"
path = "{db}"
[relay]
poll_interval = "10ms"
[sink]
kind = "http"
url = "{hook}"
[metrics]
listen = "127.0.0.1:{port}"
[canary]
every = "200ms"
name = "webhook-canary"
"#,
            db = work.path().join("outbox.db").display(),
            hook = hooks.url_for("/in")
        ),
    )
    .await?;
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    outbox_testkit::wait::eventually(Duration::from_secs(90), || async {
        hooks
            .received()
            .iter()
            .filter(|r| r.header("outbox-aggregate_type") == Some("outbox.canary"))
            .count()
            >= 3
    })
    .await
    .with_context(|| {
        format!(
            "no probes reached the webhook:\n{}",
            work.read_log("relay.log")
        )
    })?;
    let probe = hooks
        .received()
        .into_iter()
        .find(|r| r.header("outbox-aggregate_type") == Some("outbox.canary"))
        .context("a probe")?;
    let payload: serde_json::Value = serde_json::from_slice(&probe.body)?;
    ensure!(
        payload["relay"] == "webhook-canary" && payload["n"].as_u64() >= Some(1),
        "probe payload: {payload}"
    );
    ensure!(
        metric(port, "outbox_canary_in_flight_probes").await? == 0.0,
        "probes that can never be read back must not be waited for"
    );
    let log = work.read_log("relay.log");
    ensure!(
        log.contains("cannot be read back by the relay"),
        "no line saying the destination cannot be read back:\n{log}"
    );
    terminate(&mut relay, Duration::from_secs(30)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_breaks_order_on_purpose_is_caught_by_its_canary() -> anyhow::Result<()> {
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
    let port = free_port()?;
    let work = Workdir::new()?;
    let out = work.path().join("events.jsonl");
    // A relay that fetches once a second while probes are written ten times a second: each
    // batch holds several probes, and this binary publishes every batch in reverse order.
    let config = migrated_config(
        &work,
        &format!(
            r#"
[source]
kind = "sqlite"
path = "{db}"
[relay]
poll_interval = "1s"
idle_interval = "1s"
[sink]
kind = "file"
path = "{out}"
[metrics]
listen = "127.0.0.1:{port}"
[canary]
every = "100ms"
"#,
            db = work.path().join("outbox.db").display(),
            out = out.display()
        ),
    )
    .await?;
    let cfg = config.to_str().context("path")?;
    std::fs::write(&out, "")?;
    let log = std::fs::File::create(work.path().join("relay.log"))?;
    let mut relay = tokio::process::Command::new(&fault_bin)
        .args(["relay", "--config", cfg])
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("spawning the fault-injection relay")?;
    metric_reaches(port, "outbox_canary_out_of_order_total", 1.0, &work).await?;
    ensure!(
        metric(port, "outbox_canary_lost_total").await? == 0.0,
        "a reversed batch loses nothing:\n{}",
        work.read_log("relay.log")
    );
    let log = work.read_log("relay.log");
    ensure!(
        log.contains("per-aggregate order was broken"),
        "no error line for the order break:\n{log}"
    );
    terminate(&mut relay, Duration::from_secs(30)).await?;
    Ok(())
}
