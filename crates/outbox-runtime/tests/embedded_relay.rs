//! The relay inside an application's own tokio runtime, as the crate docs show it: a config
//! from TOML, `run_relay`, a cancellation token. SQLite in a temporary directory, the file
//! sink as the broker.

use std::time::Duration;

use outbox_core::NewEvent;
use outbox_runtime::{CancellationToken, Config};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_runs_the_relay_in_its_own_runtime_and_stops_it_cleanly()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("app.db");
    let out = dir.path().join("events.jsonl");
    let config = Config::from_toml(&format!(
        "[source]\nkind = \"sqlite\"\npath = \"{}\"\n\n[sink]\nkind = \"file\"\npath = \"{}\"\n",
        db.display(),
        out.display()
    ))?;

    // The application writes its events in its own transactions.
    let sqlite = outbox_sqlite::SqliteConfig::new(db.clone());
    let pool = outbox_sqlite::connect(&sqlite).await?;
    outbox_sqlite::migrate(&pool, &sqlite.table).await?;
    let mut ids = Vec::new();
    for i in 0..20 {
        let mut tx = pool.begin().await?;
        let event = NewEvent::new(
            "Order",
            format!("o_{}", i % 3),
            "order.placed",
            format!("{{\"n\":{i}}}"),
        );
        ids.push(outbox_sqlite::enqueue(&mut *tx, &event).await?);
        tx.commit().await?;
    }

    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(outbox_runtime::run_relay(config, shutdown.clone()));

    // Wait for every event to reach the file (readiness, with a generous deadline).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let lines = loop {
        let text = tokio::fs::read_to_string(&out).await.unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        if lines.len() >= ids.len() {
            break lines;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "only {} of {} events reached the file",
            lines.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(60), relay).await???;

    assert_eq!(report.delivered, 20, "{report:?}");
    let seen: Vec<String> = lines
        .iter()
        .filter_map(|l| l["id"].as_str().map(str::to_owned))
        .collect();
    let expected: Vec<String> = ids.iter().map(ToString::to_string).collect();
    assert_eq!(seen, expected, "every event once, in commit order");
    Ok(())
}

#[tokio::test]
async fn a_bad_config_given_in_code_names_the_key() {
    let error = Config::from_toml("[relay]\nbatch_size = 0\n").expect_err("refused");
    assert!(error.to_string().contains("relay.batch_size"), "{error}");
    let error = Config::from_toml("[source]\nkind = \"nosuchdb\"\n").expect_err("refused");
    assert!(error.to_string().contains("nosuchdb"), "{error}");
}
