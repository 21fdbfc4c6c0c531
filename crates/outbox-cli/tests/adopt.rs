//! Adopting an existing outbox table in the source articles' shapes (seed 001's
//! `events_outbox`, seed 002's `outbox_events`: `jsonb` payloads, a `dispatched_at` flag,
//! other column names) without changing the application that writes it: `outbox capture`
//! turns each row the application inserts into an outbox event in the same transaction
//! (docs/capture.md, "Adopting an existing outbox table"). The application keeps writing its
//! table exactly as before; the relay publishes every committed row once, none that rolled
//! back, in insertion order per aggregate, with the `jsonb` payload's text as the body.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use support::{Workdir, terminate, wait_drained};

/// The two legacy tables, as the seeds create them.
const LEGACY: &str = r#"
CREATE TABLE events_outbox (
    id            BIGSERIAL PRIMARY KEY,
    aggregate_id  UUID        NOT NULL,
    type          TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    dispatched_at TIMESTAMPTZ
);
CREATE INDEX events_outbox_pending_idx ON events_outbox (created_at) WHERE dispatched_at IS NULL;
CREATE TABLE outbox_events (
    id            UUID PRIMARY KEY,
    aggregate_id  TEXT        NOT NULL,
    event_type    TEXT        NOT NULL,
    payload       JSONB       NOT NULL,
    occurred_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    dispatched_at TIMESTAMPTZ
);
"#;

/// The adoption: one `[[capture]]` per legacy table, mapping its columns.
const ADOPT: &str = r#"
[[capture]]
table = "events_outbox"
aggregate_type = "Order"
aggregate_id = "aggregate_id"
event_type_column = "type"
payload = "payload"

[[capture]]
table = "outbox_events"
aggregate_type = "Invoice"
aggregate_id = "aggregate_id"
event_type_column = "event_type"
payload = "payload"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_outbox_tables_of_the_seeds_are_relayed_through_capture() -> anyhow::Result<()> {
    adopt("").await
}

/// The same with the CDC source: the captured outbox rows are read from the WAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_outbox_tables_are_relayed_through_capture_with_cdc() -> anyhow::Result<()> {
    // Slots and publications are cluster-wide: this run's own.
    let tag = uuid::Uuid::new_v4().simple().to_string();
    adopt(&format!(
        "mode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\n"
    ))
    .await
}

/// Every committed legacy row once in the file sink (`expected` lines, duplicates aside).
async fn wait_published(work: &Workdir, expected: usize) -> anyhow::Result<()> {
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        std::fs::read_to_string(work.path().join("events.jsonl"))
            .map(|t| {
                t.lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .map(|m| m["id"].as_str().unwrap_or_default().to_owned())
                    .collect::<std::collections::HashSet<_>>()
                    .len()
                    >= expected
            })
            .unwrap_or(false)
    })
    .await
    .with_context(|| work.read_log("relay.log"))
}

async fn adopt(source_mode: &str) -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    sqlx::raw_sql(LEGACY).execute(&pool).await?;
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n{source_mode}[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n{ADOPT}"
        ),
    )?;
    let cfg_arg = cfg.to_str().context("path")?;
    work.run_ok(&["migrate", "--config", cfg_arg]).await?;
    work.run_ok(&["capture", "install", "--config", cfg_arg])
        .await?;
    let mut relay = work.spawn_relay(&cfg, "relay.log")?;

    // The legacy application, unchanged: plain INSERTs into its own tables, one aggregate per
    // task, so insertion order is commit order per aggregate.
    let orders: Vec<String> = (0..3).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (a, order) in orders.iter().enumerate() {
        let pool = pool.clone();
        let order = order.clone();
        tasks.spawn(async move {
            for n in 0..20 {
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO events_outbox (aggregate_id, type, payload) VALUES ($1::uuid, 'order.updated', $2::jsonb)")
                    .bind(&order)
                    .bind(format!(r#"{{"n": {n}, "note": "ünïcode \"quoted\""}}"#))
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("INSERT INTO outbox_events (id, aggregate_id, event_type, payload) VALUES ($1, $2, 'invoice.issued', $3::jsonb)")
                    .bind(uuid::Uuid::new_v4())
                    .bind(format!("inv-{a}"))
                    .bind(format!(r#"{{"n":{n}}}"#))
                    .execute(&mut *tx)
                    .await?;
                // Every fifth transaction of the application fails after its inserts.
                if n % 5 == 4 {
                    tx.rollback().await?;
                } else {
                    tx.commit().await?;
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    // 3 aggregates x 2 tables x 16 committed rows.
    wait_published(&work, 3 * 2 * 16).await?;
    if source_mode.is_empty() {
        wait_drained(&pool, Duration::from_secs(60))
            .await
            .with_context(|| work.read_log("relay.log"))?;
    }
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");

    let text = std::fs::read_to_string(work.path().join("events.jsonl"))?;
    let mut by_aggregate: HashMap<(String, String), Vec<i64>> = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for line in text.lines() {
        let m: serde_json::Value = serde_json::from_str(line)?;
        // At least once: a redelivered event (same id) is the consumer's to drop.
        if !seen.insert(m["id"].as_str().context("id")?.to_owned()) {
            continue;
        }
        let payload = &m["payload"];
        let n = payload["n"]
            .as_i64()
            .with_context(|| format!("no n in {line}"))?;
        let event_type = m["event_type"].as_str().context("event_type")?;
        match m["aggregate_type"].as_str() {
            Some("Order") => {
                ensure!(event_type == "order.updated", "{line}");
                ensure!(
                    payload["note"] == "ünïcode \"quoted\"",
                    "the jsonb payload did not travel as its text: {line}"
                );
            }
            Some("Invoice") => ensure!(event_type == "invoice.issued", "{line}"),
            other => anyhow::bail!("unexpected aggregate type {other:?}: {line}"),
        }
        by_aggregate
            .entry((
                m["aggregate_type"].as_str().unwrap_or_default().to_owned(),
                m["aggregate_id"]
                    .as_str()
                    .context("aggregate_id")?
                    .to_owned(),
            ))
            .or_default()
            .push(n);
    }
    let committed: Vec<i64> = (0..20).filter(|n| n % 5 != 4).collect();
    let mut expected = Vec::new();
    for (a, order) in orders.iter().enumerate() {
        expected.push((("Order".to_owned(), order.clone()), committed.clone()));
        expected.push((
            ("Invoice".to_owned(), format!("inv-{a}")),
            committed.clone(),
        ));
    }
    ensure!(
        by_aggregate.len() == expected.len(),
        "aggregates published: {:?}",
        by_aggregate.keys().collect::<Vec<_>>()
    );
    for (key, ns) in expected {
        ensure!(
            by_aggregate.get(&key) == Some(&ns),
            "{key:?}: published {:?}, committed in order {ns:?} (rolled-back rows must not appear)",
            by_aggregate.get(&key)
        );
    }
    Ok(())
}
