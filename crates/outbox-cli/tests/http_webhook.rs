//! End to end through the binary: plain-SQL producers, PostgreSQL, the relay, a real HTTP
//! webhook receiver. Checks the message contract, retries on 503, dead-lettering on 400 while
//! other aggregates flow, the held aggregate in `outbox status`, and metrics.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use support::{Workdir, terminate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_receives_the_exact_message_and_poison_is_dead_lettered() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
[relay]
max_attempts = 3
backoff = {{ initial = "50ms", max = "200ms" }}
[sink]
kind = "http"
url = "{hook}"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
[metrics]
listen = "127.0.0.1:{metrics_port}"
refresh_interval = "200ms"
"#,
            hook = hooks.url_for("/hooks/{aggregate_type}/{event_type}")
        ),
    )?;
    let cfg = cfg.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");

    let pool = sqlx::PgPool::connect(&url).await?;
    let payload = r#"{"order_id":"o_91f2","total_cents":1250}"#;
    // Exactly the INSERT of docs/contract.md, as a producer in another language would write
    // it.
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Order', 'o_91f2', 'order.placed', convert_to($1, 'UTF8'), '{\"tenant\":\"acme\"}')",
    )
    .bind(payload)
    .execute(&pool)
    .await?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Order', 'o_bad', 'order.placed', 'x', '{\"poison\":\"1\"}')")
        .execute(&pool)
        .await?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o_bad', 'order.paid', 'behind the poison')")
        .execute(&pool)
        .await?;
    let unavailable_answers = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = unavailable_answers.clone();
    hooks.respond_when(move |r| {
        if r.header("outbox-poison") == Some("1") {
            Some(400)
        } else if r.header("outbox-aggregate_id") == Some("o_91f2")
            && counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2
        {
            Some(503)
        } else {
            None
        }
    });

    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;
    // o_91f2: two 503s then 200. The poison's 400 arrives in between.
    let all = hooks
        .wait_until("o_91f2 accepted", Duration::from_secs(30), |reqs| {
            reqs.iter()
                .any(|r| r.accepted() && r.header("outbox-aggregate_id") == Some("o_91f2"))
        })
        .await
        .with_context(|| work.read_log("relay.log"))?;
    ensure!(
        !all.iter()
            .any(|r| r.accepted() && r.header("outbox-poison").is_some()),
        "the poison event was accepted: {all:#?}"
    );
    let accepted: Vec<_> = all
        .iter()
        .filter(|r| r.accepted() && r.header("outbox-aggregate_id") == Some("o_91f2"))
        .collect();
    let req = &accepted[0];
    ensure!(
        req.method == "POST" && req.path == "/hooks/Order/order.placed",
        "{} {}",
        req.method,
        req.path
    );
    ensure!(
        req.body == payload.as_bytes(),
        "body altered: {:?}; all requests: {:#?}",
        String::from_utf8_lossy(&req.body),
        hooks.received()
    );
    let id: String =
        sqlx::query_scalar("SELECT id::text FROM outbox WHERE aggregate_id = 'o_91f2'")
            .fetch_one(&pool)
            .await?;
    for (name, value) in [
        ("outbox-id", id.as_str()),
        ("outbox-event_type", "order.placed"),
        ("outbox-aggregate_type", "Order"),
        ("outbox-aggregate_id", "o_91f2"),
        ("outbox-tenant", "acme"),
        ("webhook-id", id.as_str()),
    ] {
        ensure!(
            req.header(name) == Some(value),
            "header {name}: {:?}",
            req.header(name)
        );
    }
    ensure!(
        req.header("webhook-signature")
            .is_some_and(|s| s.starts_with("v1,")),
        "no signature"
    );
    ensure!(req.header("webhook-timestamp").is_some(), "no timestamp");

    // The poison is dead-lettered with the status in its reason; the event behind it waits.
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, String>(
            "SELECT state FROM outbox WHERE aggregate_id = 'o_bad' AND event_type = 'order.placed'",
        )
        .fetch_one(&pool)
        .await
        .is_ok_and(|state| state == "dead")
    })
    .await
    .context("the poison event was not dead-lettered")?;
    let (reason, attempts): (String, i32) =
        sqlx::query_as("SELECT last_error, attempts FROM outbox WHERE aggregate_id = 'o_bad' AND event_type = 'order.placed'")
            .fetch_one(&pool)
            .await?;
    ensure!(
        reason.contains("400"),
        "dead-letter reason does not name the status: {reason}"
    );
    ensure!(
        attempts == 1,
        "a 400 must dead-letter at once, took {attempts} attempts"
    );
    let delivered = || async {
        sqlx::query_as::<_, (String, i32)>(
            "SELECT state, attempts FROM outbox WHERE aggregate_id = 'o_91f2'",
        )
        .fetch_one(&pool)
        .await
        .ok()
    };
    let _ = outbox_testkit::wait::eventually(Duration::from_secs(10), || async {
        delivered()
            .await
            .is_some_and(|(state, _)| state == "delivered")
    })
    .await;
    let (state, retried) = delivered().await.context("row")?;
    let seen: Vec<_> = hooks
        .received()
        .iter()
        .map(|r| (r.header("outbox-aggregate_id").map(str::to_owned), r.status))
        .collect();
    ensure!(
        state == "delivered" && retried == 2,
        "o_91f2 after two 503s and a 200: {state}, {retried} failed attempts; requests {seen:?}"
    );
    let behind: String =
        sqlx::query_scalar("SELECT state FROM outbox WHERE event_type = 'order.paid'")
            .fetch_one(&pool)
            .await?;
    ensure!(
        behind == "pending",
        "event behind the dead letter is {behind}"
    );
    ensure!(
        hooks
            .received()
            .iter()
            .all(|r| r.path != "/hooks/Order/order.paid"),
        "the event behind the dead letter was sent"
    );

    let status = work.run(&["status", "--config", cfg, "--json"]).await?;
    ensure!(status.code == Some(0), "{status:?}");
    let json: serde_json::Value = serde_json::from_str(&status.stdout)?;
    ensure!(json["dead"] == 1 && json["pending"] == 1, "status: {json}");
    ensure!(
        json["held_aggregates"][0]["aggregate_id"] == "o_bad",
        "status: {json}"
    );
    ensure!(json["held_aggregates"][0]["waiting"] == 1, "status: {json}");

    let metrics = reqwest_get(&format!("http://127.0.0.1:{metrics_port}/metrics")).await?;
    ensure!(
        metrics.contains("outbox_events_published_total{sink=\"http\"} 1"),
        "metrics:\n{metrics}"
    );
    ensure!(
        metrics.contains("outbox_events_dead_lettered_total{sink=\"http\"} 1"),
        "metrics:\n{metrics}"
    );
    ensure!(
        metrics.contains("outbox_events_failed_total"),
        "metrics:\n{metrics}"
    );
    let ready = reqwest_get(&format!("http://127.0.0.1:{metrics_port}/readyz")).await?;
    ensure!(ready.starts_with("ready"), "readyz: {ready}");

    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    Ok(())
}

/// A minimal HTTP GET over a TCP stream (the test needs no HTTP client dependency).
async fn reqwest_get(url: &str) -> anyhow::Result<String> {
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
