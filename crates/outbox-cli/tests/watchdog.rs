//! The relay's watchdog, with a real relay, PostgreSQL and HTTP receiver: an event pending
//! longer than `metrics.stuck_after` (in backoff) shows in `outbox_stuck_events`; an
//! idle-in-transaction session shows as the horizon holder (metric, warning with its pid,
//! and `outbox status`); a new dead letter is reported as growth.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use sqlx::Connection;
use support::{Workdir, terminate};

async fn http_get(url: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").context("http url")?;
    let (host, path) = rest.split_once('/').context("path")?;
    let mut stream = tokio::net::TcpStream::connect(host).await?;
    stream
        .write_all(
            format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await?;
    let (_, body) = buf.split_once("\r\n\r\n").context("no body")?;
    Ok(body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_reports_stuck_events_the_horizon_holder_and_dead_letter_growth()
-> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    hooks.reject_when_header("outbox-poison", "1", 503);
    hooks.reject_when_header("outbox-fatal", "1", 422);
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let work = Workdir::new()?;
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
[relay]
backoff = {{ initial = "1h", max = "2h", jitter = 0.0 }}
[sink]
kind = "http"
url = "{hook}"
[metrics]
listen = "127.0.0.1:{metrics_port}"
refresh_interval = "100ms"
stuck_after = "1s"
"#,
            hook = hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = sqlx::PgPool::connect(&url).await?;
    // Written an hour ago and refused with 503: pending, in backoff, stuck.
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at) VALUES ('Order', 'o1', 'order.placed', 'x', '{\"poison\":\"1\"}', now() - interval '1 hour')")
        .execute(&pool)
        .await?;
    // A session that left a transaction open with a snapshot: the horizon's holder.
    let mut idle = sqlx::PgConnection::connect(&url).await?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut idle)
        .await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut idle)
        .await?;

    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    let metrics_url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let last = std::sync::Mutex::new(String::new());
    let seen = outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        let body = http_get(&metrics_url).await.unwrap_or_default();
        let ok = body.contains("outbox_stuck_events 1\n")
            && body.contains(&format!("outbox_oldest_transaction_pid {pid}\n"))
            // Once its failure is recorded, the event is in backoff: not counted in the
            // oldest *ready* pending age.
            && body.contains("outbox_retrying_events 1\n")
            && body.contains("outbox_oldest_pending_age_seconds 0\n");
        *last.lock().expect("lock") = body;
        ok
    })
    .await;
    let last = last.into_inner().expect("lock");
    seen.with_context(|| {
        format!(
            "metrics never showed the stuck event, pid {pid} and an oldest ready age of 0:\n{last}"
        )
    })?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        let log = work.read_log("relay.log");
        log.contains("events pending longer than metrics.stuck_after")
            && log.contains("holds the xmin horizon")
            && log.contains(&format!("pid={pid}"))
    })
    .await
    .with_context(|| format!("no watchdog warnings: {}", work.read_log("relay.log")))?;

    // `outbox status` tells the same.
    let status = work.run(&["status", "--config", cfg]).await?;
    ensure!(
        status.code == Some(0)
            && status.stdout.contains("stuck              1 event(s)")
            && status.stdout.contains(&format!(
                "horizon held by    pid {pid} (idle in transaction"
            )),
        "{status:?}"
    );
    let json = work.run(&["status", "--json", "--config", cfg]).await?;
    let v: serde_json::Value = serde_json::from_str(&json.stdout).context("status --json")?;
    ensure!(
        v["watchdog"]["stuck_events"] == 1 && v["watchdog"]["oldest_transaction"]["pid"] == pid,
        "{v}"
    );

    // Dead-letter growth.
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Order', 'o2', 'order.placed', 'x', '{\"fatal\":\"1\"}')")
        .execute(&pool)
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        work.read_log("relay.log")
            .contains("dead letters are growing")
    })
    .await
    .with_context(|| format!("no growth warning: {}", work.read_log("relay.log")))?;

    sqlx::query("ROLLBACK").execute(&mut idle).await?;
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    Ok(())
}
