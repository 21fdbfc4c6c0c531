//! The subscription catalog (issue 39): `outbox migrate` records `[[subscription]]` entries
//! in `<table>_subscriptions`, every relay fans out by it whatever file it runs, and
//! `outbox subscription pause|resume|remove` act on it. Real PostgreSQL and SQLite, the built
//! binary, file sinks.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_testkit::services::Postgres;
use support::{Workdir, terminate};
use uuid::Uuid;

/// Where the test's producers write.
#[derive(Clone)]
enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Db {
    async fn postgres() -> anyhow::Result<(Self, String)> {
        let url = Postgres::shared().await?.fresh_database().await?;
        let pool = sqlx::PgPool::connect(&url).await?;
        Ok((
            Self::Postgres(pool),
            format!("kind = \"postgres\"\nurl = \"{url}\""),
        ))
    }

    /// The SQLite outbox of `work`, migrated with subscriptions `names` first (the producer
    /// needs the outbox table).
    async fn sqlite(work: &Workdir, names: &[&str]) -> anyhow::Result<(Self, String)> {
        let path = work.path().join("app.db");
        let source = format!("kind = \"sqlite\"\npath = \"{}\"", path.display());
        let cfg = config(work, "init.toml", &source, names)?;
        work.run_ok(&["migrate", "--config", arg(&cfg)?]).await?;
        let pool = outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(&path)).await?;
        Ok((Self::Sqlite(pool), source))
    }

    /// One event in its own transaction; its id.
    async fn write(&self, aggregate: u32, n: u32) -> anyhow::Result<Uuid> {
        let event = NewEvent::new(
            "Order",
            format!("o{aggregate}"),
            "order.placed",
            format!("{{\"n\":{n}}}"),
        );
        let ids = match self {
            Self::Sqlite(pool) => outbox_sqlite::enqueue_batch(pool, &[event]).await?,
            Self::Postgres(pool) => outbox_postgres::enqueue_batch(pool, &[event]).await?,
        };
        ids.into_iter().next().context("no id")
    }
}

/// A config with file subscriptions `names` (each `[sinks.NAME]` a file `NAME.jsonl`).
fn config(work: &Workdir, file: &str, source: &str, names: &[&str]) -> anyhow::Result<PathBuf> {
    let mut toml = format!("[source]\n{source}\n");
    for name in names {
        toml.push_str(&format!(
            "[sinks.{name}]\nkind = \"file\"\npath = \"{}\"\n[[subscription]]\nname = \"{name}\"\nsink = \"{name}\"\n",
            work.path().join(format!("{name}.jsonl")).display()
        ));
    }
    work.write_config(file, &toml)
}

/// The events a file sink wrote: (id, aggregate, n) in file order.
fn delivered(work: &Workdir, name: &str) -> Vec<(Uuid, String, u64)> {
    std::fs::read_to_string(work.path().join(format!("{name}.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|m| {
            Some((
                m["id"].as_str()?.parse().ok()?,
                m["aggregate_id"].as_str()?.to_owned(),
                m["payload"]["n"].as_u64()?,
            ))
        })
        .collect()
}

fn ids(work: &Workdir, name: &str) -> BTreeSet<Uuid> {
    delivered(work, name)
        .into_iter()
        .map(|(id, _, _)| id)
        .collect()
}

/// Every aggregate's events in `name`'s file come in increasing `n` (their commit order).
fn in_order(work: &Workdir, name: &str) -> anyhow::Result<()> {
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for (_, aggregate, n) in delivered(work, name) {
        if let Some(prev) = last.insert(aggregate.clone(), n) {
            ensure!(n > prev, "{name}: {aggregate} delivered {n} after {prev}");
        }
    }
    Ok(())
}

/// `outbox status --json` with config `cfg`.
async fn status_json(work: &Workdir, cfg: &Path) -> anyhow::Result<serde_json::Value> {
    let out = work
        .run_ok(&["status", "--json", "--config", arg(cfg)?])
        .await?;
    Ok(serde_json::from_str(&out)?)
}

fn arg(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("utf-8 path")
}

/// Writes events one transaction each until `stop`; each id with whether its transaction
/// began after `after` was set (that is, after `outbox migrate` recorded the subscription).
fn produce(
    db: Db,
    after: Arc<std::sync::atomic::AtomicBool>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<(Uuid, bool)>>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        let mut n = 0u32;
        while !stop.is_cancelled() {
            let began_after = after.load(std::sync::atomic::Ordering::SeqCst);
            out.push((db.write(n % 7, n).await?, began_after));
            n += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(out)
    })
}

/// Three relays on the old file (subscription `all`); a new subscription `late` is added to
/// the file and recorded by `outbox migrate` while producers write; two relays are restarted
/// with the new file, one stays on the old one. `late` gets every event whose transaction began
/// after migrate recorded it (and nothing that is not in the outbox), in per-aggregate order;
/// the old-file relay's `status` and `doctor` name `late` and its missing `[sinks.late]`.
async fn replicas_on_an_old_file_copy_into_a_new_subscription(
    work: &Workdir,
    db: Db,
    source: &str,
) -> anyhow::Result<()> {
    let old = config(work, "old.toml", source, &["all"])?;
    let new = config(work, "new.toml", source, &["all", "late"])?;
    work.run_ok(&["migrate", "--config", arg(&old)?]).await?;
    let mut relays = Vec::new();
    for i in 0..3 {
        relays.push(work.spawn_relay(&old, &format!("relay-{i}.log"))?);
    }
    // A relay on the new file is refused until migrate recorded `late`.
    let early = work.run(&["relay", "--config", arg(&new)?]).await?;
    early.assert_clear_error(
        "subscription `late` is in this file but not in the subscription catalog",
    )?;

    let after = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = produce(db.clone(), after.clone(), stop.clone());
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        ids(work, "all").len() >= 20
    })
    .await
    .with_context(|| work.read_log("relay-0.log"))?;
    let migrated = work.run_ok(&["migrate", "--config", arg(&new)?]).await?;
    after.store(true, std::sync::atomic::Ordering::SeqCst);
    ensure!(
        migrated.contains("subscription `late`: recorded in the subscription catalog"),
        "migrate: {migrated}"
    );
    // Only old-file relays run for a while: they copy into `late` (nobody delivers it yet).
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        status_json(work, &old)
            .await
            .ok()
            .is_some_and(|s| s["subscriptions"]["late"]["pending"].as_u64().unwrap_or(0) >= 20)
    })
    .await
    .context("old-file relays did not copy into `late`")?;
    let s = status_json(work, &old).await?;
    ensure!(
        s["subscriptions"]["late"]["delivered_by_this_file"] == false
            && s["subscriptions"]["late"]["state"] == "active",
        "status --json: {s}"
    );
    let text = work.run_ok(&["status", "--config", arg(&old)?]).await?;
    ensure!(
        text.contains("subscription late") && text.contains("[sinks.late]"),
        "status: {text}"
    );
    let doctor = work.run(&["doctor", "--config", arg(&old)?]).await?;
    ensure!(
        doctor.stdout.contains("subscription `late` is catalogued")
            && doctor.stdout.contains("[sinks.late]"),
        "doctor: {}{}",
        doctor.stdout,
        doctor.stderr
    );
    // Roll two replicas onto the new file; the third stays on the old one.
    for (i, relay) in relays.iter_mut().enumerate().skip(1) {
        terminate(relay, Duration::from_secs(30)).await?;
        *relay = work.spawn_relay(&new, &format!("relay-{i}-new.log"))?;
    }
    // Traffic goes on until the new-file relays deliver `late`.
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        !ids(work, "late").is_empty()
    })
    .await
    .with_context(|| work.read_log("relay-1-new.log"))?;
    stop.cancel();
    let written = producer.await??;
    let all: BTreeSet<Uuid> = written.iter().map(|(id, _)| *id).collect();
    let must: BTreeSet<Uuid> = written
        .iter()
        .filter(|(_, a)| *a)
        .map(|(id, _)| *id)
        .collect();
    ensure!(!must.is_empty(), "no event written after migrate");
    outbox_testkit::wait::eventually(Duration::from_secs(90), || async {
        ids(work, "all") == all && ids(work, "late").is_superset(&must)
    })
    .await
    .with_context(|| {
        format!(
            "all: {}/{}, late: {} of {} required\n{}",
            ids(work, "all").len(),
            all.len(),
            ids(work, "late").intersection(&must).count(),
            must.len(),
            work.read_log("relay-1-new.log")
        )
    })?;
    for relay in &mut relays {
        ensure!(
            terminate(relay, Duration::from_secs(30)).await? == Some(0),
            "relay exit"
        );
    }
    let late = ids(work, "late");
    ensure!(
        late.is_subset(&all),
        "late holds events the outbox never had"
    );
    ensure!(
        late.is_superset(&must),
        "late lacks an event committed after migrate"
    );
    in_order(work, "all")?;
    in_order(work, "late")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_on_an_old_file_copy_into_a_new_subscription() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (db, source) = Db::postgres().await?;
    replicas_on_an_old_file_copy_into_a_new_subscription(&work, db, &source).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_replicas_on_an_old_file_copy_into_a_new_subscription() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (db, source) = Db::sqlite(&work, &["all"]).await?;
    replicas_on_an_old_file_copy_into_a_new_subscription(&work, db, &source).await
}

/// Pause holds delivery while the fan-out keeps copying; resume delivers all of it in order;
/// remove is refused while events wait, `--force` removes; unknown names are clear errors.
async fn pause_resume_remove(work: &Workdir, db: Db, source: &str) -> anyhow::Result<()> {
    let cfg = config(work, "outbox.toml", source, &["a", "b"])?;
    let c = arg(&cfg)?;
    work.run_ok(&["migrate", "--config", c]).await?;
    let paused = work
        .run_ok(&["subscription", "pause", "a", "--config", c])
        .await?;
    ensure!(paused.contains("subscription `a` paused"), "{paused}");
    let listed = work
        .run_ok(&["subscription", "list", "--json", "--config", c])
        .await?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    ensure!(
        listed[0]["name"] == "a"
            && listed[0]["state"] == "paused"
            && listed[1]["state"] == "active",
        "{listed}"
    );
    let mut relay = work.spawn_relay(&cfg, "relay.log")?;
    let mut written = BTreeSet::new();
    for n in 0..30 {
        written.insert(db.write(n % 3, n).await?);
    }
    // `b` delivers everything; `a` holds every copy in its table.
    let pending_a = || async {
        let out = work
            .run_ok(&["status", "--json", "--config", c])
            .await
            .ok()?;
        let s: serde_json::Value = serde_json::from_str(&out).ok()?;
        s["subscriptions"]["a"]["pending"].as_u64()
    };
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        ids(work, "b") == written && pending_a().await == Some(30)
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    ensure!(ids(work, "a").is_empty(), "a paused subscription delivered");
    let text = work.run_ok(&["status", "--config", c]).await?;
    ensure!(
        text.contains("subscription a") && text.contains("paused"),
        "{text}"
    );
    // Remove is refused while its 30 events wait, with the count.
    let refused = work
        .run(&["subscription", "remove", "a", "--config", c])
        .await?;
    refused.assert_clear_error("subscription `a` has 30 undelivered event(s)")?;
    work.run_ok(&["subscription", "resume", "a", "--config", c])
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        ids(work, "a") == written
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    in_order(work, "a")?;
    ensure!(
        delivered(work, "a").len() == 30,
        "a delivered an event twice"
    );
    // Paused again with new events waiting: --force removes it; its table keeps them.
    work.run_ok(&["subscription", "pause", "a", "--config", c])
        .await?;
    for n in 30..35 {
        db.write(n % 3, n).await?;
    }
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        pending_a().await == Some(5)
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    work.run(&["subscription", "remove", "a", "--config", c])
        .await?
        .assert_clear_error("5 undelivered")?;
    let removed = work
        .run_ok(&["subscription", "remove", "a", "--force", "--config", c])
        .await?;
    ensure!(
        removed.contains("removed from the catalog") && removed.contains("kept"),
        "{removed}"
    );
    let listed = work
        .run_ok(&["subscription", "list", "--json", "--config", c])
        .await?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    ensure!(
        listed.as_array().map(Vec::len) == Some(1) && listed[0]["name"] == "b",
        "{listed}"
    );
    for verb in ["pause", "resume", "remove"] {
        work.run(&["subscription", verb, "nope", "--config", c])
            .await?
            .assert_clear_error("no subscription named `nope`")?;
    }
    ensure!(
        terminate(&mut relay, Duration::from_secs(30)).await? == Some(0),
        "relay exit"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_subscriptions_pause_resume_and_remove() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (db, source) = Db::postgres().await?;
    pause_resume_remove(&work, db, &source).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_subscriptions_pause_resume_and_remove() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (db, source) = Db::sqlite(&work, &["a", "b"]).await?;
    pause_resume_remove(&work, db, &source).await
}

/// The workflow docs/subscriptions.md gives for a new subscription with history: `outbox
/// migrate --paused` records `late` paused while a relay runs and producers write (the
/// fan-out copies into it, nothing is delivered), `outbox backfill --all` puts the older
/// events in line ahead of the copies (nothing was handed out, so none is skipped), and
/// `outbox subscription resume late` delivers all of them in commit order. Recorded active
/// instead, the relay would deliver the new copies first and the backfill would have to skip
/// every aggregate's older events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_recorded_paused_is_backfilled_before_it_delivers() -> anyhow::Result<()> {
    const WAIT: Duration = Duration::from_secs(60);
    let work = Workdir::new()?;
    let (db, source) = Db::postgres().await?;
    let old = config(&work, "old.toml", &source, &["all"])?;
    work.run_ok(&["migrate", "--config", arg(&old)?]).await?;
    let mut history = Vec::new();
    for n in 0..60 {
        history.push(db.write(n % 6, n).await?);
    }
    // The history is fanned out (to `all` only) and delivered before `late` exists.
    let mut first = work.spawn_relay(&old, "first.log")?;
    let before: BTreeSet<Uuid> = history.iter().copied().collect();
    outbox_testkit::wait::eventually(WAIT, || async { ids(&work, "all") == before })
        .await
        .with_context(|| work.read_log("first.log"))?;
    let code = terminate(&mut first, WAIT).await?;
    ensure!(code == Some(0), "first relay: {code:?}");
    let new = config(&work, "outbox.toml", &source, &["all", "late"])?;
    let recorded = work
        .run_ok(&["migrate", "--paused", "--config", arg(&new)?])
        .await?;
    ensure!(
        recorded.contains("subscription `late`: recorded in the subscription catalog, paused"),
        "{recorded}"
    );
    let listed = work
        .run_ok(&["subscription", "list", "--json", "--config", arg(&new)?])
        .await?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    ensure!(
        listed[0]["name"] == "all" && listed[0]["state"] == "active",
        "an existing subscription keeps its state: {listed}"
    );
    let mut relay = work.spawn_relay(&new, "relay.log")?;
    let mut fresh = Vec::new();
    for n in 60..120 {
        fresh.push(db.write(n % 6, n).await?);
    }
    let everything: BTreeSet<Uuid> = history.iter().chain(&fresh).copied().collect();
    outbox_testkit::wait::eventually(WAIT, || async { ids(&work, "all") == everything })
        .await
        .with_context(|| work.read_log("relay.log"))?;
    // `all` delivered the fresh events, so their copies in `late` are fanned out too: and
    // still waiting.
    ensure!(
        delivered(&work, "late").is_empty(),
        "a paused subscription delivered: {:?}",
        delivered(&work, "late")
    );

    let out = work
        .run_ok(&[
            "backfill",
            "--subscription",
            "late",
            "--all",
            "--config",
            arg(&new)?,
        ])
        .await?;
    ensure!(out.contains("copied 60,"), "backfill: {out}");
    ensure!(
        out.contains("already delivered) 0"),
        "nothing was handed out, so nothing may be skipped: {out}"
    );
    work.run_ok(&["subscription", "resume", "late", "--config", arg(&new)?])
        .await?;
    outbox_testkit::wait::eventually(WAIT, || async { ids(&work, "late") == everything })
        .await
        .with_context(|| work.read_log("relay.log"))?;
    in_order(&work, "late")?;
    ensure!(
        delivered(&work, "late").len() == everything.len(),
        "late: {} deliveries for {} events",
        delivered(&work, "late").len(),
        everything.len()
    );
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "relay: {code:?}");
    Ok(())
}

/// A relay with a single `[sink]` on an outbox whose catalog has subscriptions would mark
/// events delivered without copying them into those subscriptions: refused at start (naming
/// them, exit non-zero, nothing delivered). A reload to such a file is refused by the same
/// check (`outbox_runtime::catalog::refuse_plain_relay_beside_a_fan_out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_relay_beside_a_fan_out_is_refused() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (db, source) = Db::sqlite(&work, &["a"]).await?;
    let id = db.write(0, 0).await?;
    let plain = work.write_config(
        "plain.toml",
        &format!(
            "[source]\n{source}\n[sink]\nkind = \"file\"\npath = \"{}\"\n",
            work.path().join("plain.jsonl").display()
        ),
    )?;
    let out = work.run(&["relay", "--config", arg(&plain)?]).await?;
    out.assert_clear_error("fans out to catalogued subscriptions (a)")?;
    ensure!(
        out.stderr.contains("outbox subscription remove"),
        "{}",
        out.stderr
    );
    ensure!(
        delivered(&work, "plain").is_empty(),
        "the refused relay delivered"
    );
    // Once the subscription is removed, the plain relay runs and delivers the event.
    work.run_ok(&[
        "subscription",
        "remove",
        "a",
        "--force",
        "--config",
        arg(&plain)?,
    ])
    .await?;
    let mut relay = work.spawn_relay(&plain, "plain.log")?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        ids(&work, "plain").contains(&id)
    })
    .await
    .with_context(|| work.read_log("plain.log"))?;
    let code = terminate(&mut relay, Duration::from_secs(60)).await?;
    ensure!(code == Some(0), "relay: {code:?}");
    Ok(())
}
