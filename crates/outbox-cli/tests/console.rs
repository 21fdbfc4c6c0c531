//! The web console at `/ui`, with a real `outbox relay` (SQLite outbox, HTTP sink to the
//! testkit's receiver): in Debian's Chromium driven by Playwright (`tests/console/console.mjs`)
//! the numbers move while events flow, a poison event is found among the dead letters, shown,
//! explained and retried by a click, and the receiver then gets it. Beyond loopback the relay
//! refuses to serve the console without a token; with a token the console needs it.
//!
//! Needs `node`, Chromium and `playwright-core` in `tests/console/node_modules`; `scripts/test.sh`
//! installs them (`services_install_browser` in `scripts/services.sh`). Missing, the test fails
//! and says so. `OUTBOX_UPDATE_SCREENSHOT=1` rewrites `docs/img/console.png`.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::HttpReceiver;
use support::browser::{browser_tools, driver_dir, free_port, http};
use support::{Workdir, terminate};

/// Waits until the relay serves the console with its database attached.
async fn console_up(port: u16, headers: &[(&str, &str)], work: &Workdir) -> anyhow::Result<()> {
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        match http(port, "GET", "/ui/api/overview", headers).await {
            Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)
                .is_ok_and(|v| !v["source"].is_null() && !v["latest"].is_null()),
            _ => false,
        }
    })
    .await
    .with_context(|| format!("the console never came up:\n{}", work.read_log("relay.log")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_shows_the_relay_live_and_retries_a_dead_letter_by_a_click() -> anyhow::Result<()> {
    let chromium = browser_tools()?;
    // The first delivery of the poison event is refused for good (422: dead-lettered at
    // once); after the retry the receiver takes it.
    let hooks = HttpReceiver::start().await?;
    let refused_once = Arc::new(AtomicBool::new(false));
    let flag = refused_once.clone();
    hooks.respond_when(move |r| {
        (r.header("outbox-poison") == Some("1") && !flag.swap(true, Ordering::SeqCst))
            .then_some(422)
    });
    let port = free_port()?;
    let work = Workdir::new()?;
    let db = work.path().join("outbox.db");
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "sqlite"
path = "{db}"
[sink]
kind = "http"
url = "{hook}"
[metrics]
listen = "127.0.0.1:{port}"
refresh_interval = "250ms"
[ui]
allow_actions = true
"#,
            db = db.display(),
            hook = hooks.url_for("/in")
        ),
    )?;
    let mut relay = work.spawn_relay(&cfg, "relay.log")?;
    console_up(port, &[], &work).await?;

    let pool = outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(&db)).await?;
    let poison_payload = r#"{"invoice":"i_17","total_cents":990}"#;
    let poison_id: String = sqlx::query_scalar("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Invoice', 'i_17', 'invoice.poison', ?1, '{\"poison\":\"1\"}') RETURNING id")
        .bind(poison_payload)
        .fetch_one(&pool)
        .await?;
    // Events flow while the page is open: 1 to 5 every 50 ms, until the browser is done (at
    // most 2,400 rounds, two minutes).
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u32;
            while !stop.load(Ordering::SeqCst) && n < 2_400 {
                n += 1;
                // The rate steps every second, so the throughput chart has a shape.
                for _ in 0..1 + (n / 20) % 5 {
                    let _ = sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', ?1, 'order.placed', '{}')")
                        .bind(format!("o_{}", n % 7))
                        .execute(&pool)
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            n
        })
    };

    let screenshot = (std::env::var("OUTBOX_UPDATE_SCREENSHOT").as_deref() == Ok("1"))
        .then(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/img/console.png"));
    let mut node = tokio::process::Command::new("node");
    node.arg(driver_dir().join("console.mjs"))
        .current_dir(driver_dir())
        .env("OUTBOX_UI_URL", format!("http://127.0.0.1:{port}"))
        .env("OUTBOX_CHROMIUM", &chromium)
        .env("OUTBOX_POISON_TYPE", "invoice.poison")
        .env("OUTBOX_POISON_TEXT", "total_cents")
        .kill_on_drop(true);
    if let Some(path) = &screenshot {
        std::fs::create_dir_all(path.parent().context("docs/img")?)?;
        node.env("OUTBOX_SCREENSHOT", path);
    }
    let driven = tokio::time::timeout(Duration::from_secs(180), node.output())
        .await
        .context("the browser script did not finish within 3 minutes")??;
    stop.store(true, Ordering::SeqCst);
    let produced = producer.await?;
    let stdout = String::from_utf8_lossy(&driven.stdout);
    let stderr = String::from_utf8_lossy(&driven.stderr);
    eprintln!("{stdout}");
    ensure!(
        driven.status.success(),
        "the browser script failed ({}):\n{stdout}\n{stderr}\nrelay log:\n{}",
        driven.status,
        work.read_log("relay.log")
    );
    let figures = stdout
        .lines()
        .find_map(|l| l.strip_prefix("FIGURES "))
        .context("no FIGURES line")?;
    let figures: serde_json::Value = serde_json::from_str(figures)?;
    println!(
        "console page weight: {} bytes (HTML {} + assets {}); load event at {} ms, first numbers at {} ms, first overview JSON {} bytes",
        figures["page_bytes"],
        figures["html_bytes"],
        figures["assets"],
        figures["load_ms"],
        figures["first_numbers_ms"],
        figures["first_overview_bytes"]
    );

    // What the browser saw is what happened: the receiver got the poison event after the
    // retry, and the row is delivered.
    ensure!(
        refused_once.load(Ordering::SeqCst),
        "the poison was never refused"
    );
    let received = hooks.received();
    ensure!(
        received
            .iter()
            .any(|r| r.header("outbox-poison") == Some("1") && r.status == 422),
        "the poison's first delivery was not refused"
    );
    ensure!(
        received
            .iter()
            .any(|r| r.header("outbox-poison") == Some("1")
                && r.accepted()
                && r.header("outbox-id") == Some(poison_id.as_str())
                && r.body.as_ref() == poison_payload.as_bytes()),
        "the retried poison event never reached the receiver"
    );
    let state: String = sqlx::query_scalar("SELECT state FROM outbox WHERE id = ?1")
        .bind(&poison_id)
        .fetch_one(&pool)
        .await?;
    ensure!(state == "delivered", "poison row is {state}");
    ensure!(produced > 5, "the producer ran only {produced} rounds");
    let log = work.read_log("relay.log");
    ensure!(
        log.contains("put back in line from the console"),
        "the retry is not logged:\n{log}"
    );
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_refuses_to_serve_the_console_beyond_loopback_without_a_token() -> anyhow::Result<()>
{
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        "[metrics]\nlisten = \"0.0.0.0:9187\"\n[ui]\nenabled = true\nallow_actions = true\n",
    )?;
    let cfg = cfg.to_str().context("path")?;
    let out = work.run(&["relay", "--config", cfg]).await?;
    out.assert_clear_error("ui.token")?;
    ensure!(
        out.stderr.contains("metrics.listen = 0.0.0.0:9187") && out.stderr.contains("ui.enabled"),
        "{out:?}"
    );
    ensure!(
        !work.path().join("outbox.db").exists(),
        "the relay opened the database before refusing"
    );
    let check = work.run(&["check-config", "--config", cfg]).await?;
    check.assert_clear_error("ui.token")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_console_needs_it_and_metrics_do_not() -> anyhow::Result<()> {
    let token = "console-token-0123456789";
    let port = free_port()?;
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"outbox.db\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\nrefresh_interval = \"100ms\"\n[ui]\ntoken = \"{token}\"\n"
        ),
    )?;
    let printed = work
        .run(&["check-config", "--config", cfg.to_str().context("path")?])
        .await?;
    ensure!(
        printed.code == Some(0)
            && printed.stdout.contains("token = \"***\"")
            && !printed.stdout.contains(token),
        "{printed:?}"
    );
    let mut relay = work.spawn_relay(&cfg, "relay.log")?;
    let bearer = format!("Bearer {token}");
    console_up(port, &[("Authorization", &bearer)], &work).await?;
    let (status, _) = http(port, "GET", "/ui/api/overview", &[]).await?;
    ensure!(status == 401, "no token: {status}");
    let (status, _) = http(port, "GET", "/ui", &[]).await?;
    ensure!(status == 303, "no token, the page: {status}");
    let (status, body) = http(port, "GET", "/ui", &[("Authorization", &bearer)]).await?;
    ensure!(
        status == 200 && body.contains("csrf-token"),
        "{status} {body}"
    );
    let (status, body) = http(port, "GET", "/metrics", &[]).await?;
    ensure!(
        status == 200 && body.contains("outbox_pending_events"),
        "/metrics: {status}"
    );
    ensure!(
        !work.read_log("relay.log").contains(token),
        "the token reached the log"
    );
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    Ok(())
}
