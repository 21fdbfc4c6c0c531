//! The embedded default: `outbox relay` with no config and no environment uses SQLite
//! `outbox.db` in the working directory and the stdout sink, and says so.

mod support;

use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, ensure};
use support::{Workdir, terminate};
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_without_config_publishes_from_outbox_db_to_stdout() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let mut relay = work
        .command(&["relay"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stderr = BufReader::new(relay.stderr.take().context("stderr")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), stderr.next_line())
        .await
        .context("no startup line")??
        .context("stderr closed")?;
    ensure!(
        first.contains("embedded default")
            && first.contains("outbox.db")
            && first.contains("stdout"),
        "startup line: {first}"
    );
    // Keep reading stderr: a full pipe would block the relay's logging, and the relay with it.
    let stderr_drain =
        tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    // A producer in another process writes with plain SQL into the same file.
    let db = work.path().join("outbox.db");
    let pool = outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(&db)).await?;
    // Generous: a loaded CI machine can take seconds to start a process.
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        sqlx::query("SELECT 1 FROM outbox LIMIT 1")
            .fetch_optional(&pool)
            .await
            .is_ok()
    })
    .await
    .context("the relay did not create the outbox table")?;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o_91f2', 'order.placed', '{\"total_cents\":1250}')")
        .execute(&pool)
        .await?;
    let mut stdout = BufReader::new(relay.stdout.take().context("stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .context("nothing published")??
        .context("stdout closed")?;
    let json: serde_json::Value = serde_json::from_str(&line)?;
    ensure!(
        json["aggregate_id"] == "o_91f2" && json["event_type"] == "order.placed",
        "{line}"
    );
    ensure!(json["payload"]["total_cents"] == 1250, "{line}");
    ensure!(json["destination"] == "outbox.event.Order", "{line}");
    // Close our end of stderr: a relay whose log pipe is gone must still drain and exit 0.
    stderr_drain.abort();
    let _ = stderr_drain.await;
    ensure!(
        terminate(&mut relay, Duration::from_secs(20)).await? == Some(0),
        "relay did not exit 0 on SIGTERM"
    );
    Ok(())
}
