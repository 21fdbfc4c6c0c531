//! What the `outbox verify` tests share (tests/verify.rs, tests/verify_cloud.rs): running
//! `verify --json` and reading its report, the events a test writes, a relay run to the end.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use serde_json::Value;
use uuid::Uuid;

use super::{Workdir, terminate, wait_drained};

pub const WAIT: Duration = Duration::from_secs(60);

/// Runs `outbox verify --json` with `config`; its exit code and report.
pub async fn verify(work: &Workdir, config: &Path) -> anyhow::Result<(i32, Value)> {
    let config = config.to_str().context("utf-8 path")?;
    let out = work
        .run(&[
            "verify", "--config", config, "--since", "10m", "--json", "--ids", "100",
        ])
        .await?;
    let report: Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("verify printed no JSON report: {out:?}"))?;
    ensure!(
        !out.stderr.contains("panicked"),
        "verify panicked: {}",
        out.stderr
    );
    Ok((out.code.context("killed by a signal")?, report))
}

/// The ids of one finding of a report.
pub fn ids(report: &Value, finding: &str) -> Vec<String> {
    report[finding]["ids"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub fn count(report: &Value, finding: &str) -> u64 {
    report[finding]["count"].as_u64().unwrap_or(u64::MAX)
}

/// Checks the counts of a report: (lost, phantom, duplicates, order breaks) and the exit
/// code.
pub fn expect(
    code: i32,
    report: &Value,
    counts: (u64, u64, u64, u64),
    exit: i32,
) -> anyhow::Result<()> {
    let got = (
        count(report, "lost"),
        count(report, "phantom"),
        count(report, "duplicates"),
        count(report, "order_breaks"),
    );
    ensure!(
        got == counts && code == exit,
        "expected (lost, phantom, duplicates, order breaks) = {counts:?} and exit {exit}, got {got:?} and exit {code}: {report:#}"
    );
    Ok(())
}

/// The events a test writes: `n` events over three aggregates, in commit order, as
/// (id, aggregate id).
pub fn events(n: usize) -> Vec<(Uuid, String)> {
    (0..n)
        .map(|i| (Uuid::now_v7(), format!("a{}", i % 3)))
        .collect()
}

pub async fn insert_pg(pool: &sqlx::PgPool, events: &[(Uuid, String)]) -> anyhow::Result<()> {
    for (i, (id, aggregate)) in events.iter().enumerate() {
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ($1, 'Order', $2, 'order.changed', convert_to($3, 'UTF8'))",
        )
        .bind(id)
        .bind(aggregate)
        .bind(format!("{{\"n\":{i}}}"))
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Runs a relay with `config` until the PostgreSQL outbox has nothing pending, then stops
/// it cleanly.
pub async fn relay_pg(work: &Workdir, config: &Path, pool: &sqlx::PgPool) -> anyhow::Result<()> {
    let mut relay = work.spawn_relay(config, "relay.log")?;
    wait_drained(pool, WAIT)
        .await
        .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "relay: {}", work.read_log("relay.log"));
    Ok(())
}

/// A short unique name for a test's streams, topics and subjects.
pub fn scope() -> String {
    format!("v{}", &Uuid::now_v7().simple().to_string()[20..])
}

/// The last two events of one aggregate: (earlier, later). Stored again later one first at
/// the end of a stream, they make exactly one order break.
pub fn pair_of(events: &[(Uuid, String)], aggregate: &str) -> (Uuid, Uuid) {
    let of: Vec<Uuid> = events
        .iter()
        .filter(|(_, a)| a == aggregate)
        .map(|(id, _)| *id)
        .collect();
    (of[of.len() - 2], of[of.len() - 1])
}

/// Runs `verify --json` and checks its counts and exit code as [`expect`] does, and that
/// `finding` (`lost`, `phantom`, `duplicates`, `order_breaks`) lists exactly `id`.
pub async fn expect_finding(
    work: &Workdir,
    config: &Path,
    counts: (u64, u64, u64, u64),
    exit: i32,
    finding: &str,
    id: Uuid,
) -> anyhow::Result<Value> {
    let (code, report) = verify(work, config).await?;
    expect(code, &report, counts, exit)?;
    ensure!(ids(&report, finding) == [id.to_string()], "{report:#}");
    Ok(report)
}
