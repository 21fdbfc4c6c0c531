//! `outbox backfill --subscription NAME`: the retained events a subscription takes reach its
//! table while relays run, in commit order per aggregate, across kill -9 of the backfill and
//! of a relay; events older than one the subscription already delivered are counted, never
//! delivered out of order; bad input changes nothing. Each scenario runs on PostgreSQL (polling
//! and CDC), SQLite and MariaDB (polling).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_postgres::PgOutbox;
use outbox_testkit::services::{MariaDb, Postgres};
use outbox_testkit::wait::eventually;
use support::Workdir;

/// Generous: a busy machine is slower, never stuck this long.
const PATIENCE: Duration = Duration::from_secs(180);

/// The databases every scenario runs on.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Postgres,
    /// PostgreSQL with the CDC source (`mode = "cdc"`): the outbox rows stay `pending`, the
    /// slot is the progress, so the backfill reads every retained row that is not a dead letter.
    PostgresCdc,
    Sqlite,
    MariaDb,
}

/// A connection to the scenario's database, for writing events and checking tables.
enum Pool {
    Pg(sqlx::PgPool),
    Lite(sqlx::SqlitePool),
    My(sqlx::MySqlPool),
}

/// A fresh outbox database of one kind: its `[source]` section and a pool (opened after
/// the first `outbox migrate`, which creates the SQLite file).
struct Db {
    kind: Kind,
    source: String,
    url: String,
    pool: Option<Pool>,
}

impl Db {
    async fn fresh(kind: Kind, work: &Workdir) -> anyhow::Result<Self> {
        let (source, url) = match kind {
            Kind::Postgres => {
                let url = Postgres::shared().await?.fresh_database().await?;
                (format!("kind = \"postgres\"\nurl = \"{url}\""), url)
            }
            // Slots are cluster-wide: each run gets its own.
            Kind::PostgresCdc => {
                let url = Postgres::shared().await?.fresh_database().await?;
                let tag = uuid::Uuid::new_v4().simple();
                (
                    format!(
                        "kind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\""
                    ),
                    url,
                )
            }
            // A short lease, so that a relay killed with SIGKILL is replaced quickly and the
            // backfill's own lease runs out soon after a kill.
            Kind::Sqlite => {
                let path = work.path().join("outbox.db").display().to_string();
                (
                    format!("kind = \"sqlite\"\npath = \"{path}\"\nlease_ttl = \"4s\""),
                    path,
                )
            }
            Kind::MariaDb => {
                let url = MariaDb::shared().await?.fresh_database().await?;
                (format!("kind = \"mysql\"\nurl = \"{url}\""), url)
            }
        };
        Ok(Self {
            kind,
            source,
            url,
            pool: None,
        })
    }

    /// Opens the pool (after `outbox migrate`).
    async fn connect(&mut self) -> anyhow::Result<()> {
        self.pool = Some(match self.kind {
            Kind::Postgres | Kind::PostgresCdc => Pool::Pg(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(4)
                    .connect(&self.url)
                    .await?,
            ),
            Kind::Sqlite => {
                // The producers share SQLite's one write lock with two relays and the
                // backfill's chunks on a busy machine; SQLite's busy handler sleeps up to
                // 100 ms between tries, so 5 s (the default) ran out once in CI ("database is
                // locked"). An application writing beside a backfill waits as long.
                let mut config = outbox_sqlite::SqliteConfig::new(&self.url);
                config.busy_timeout = Duration::from_secs(60);
                Pool::Lite(outbox_sqlite::connect(&config).await?)
            }
            Kind::MariaDb => Pool::My(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(4)
                    .connect(&self.url)
                    .await?,
            ),
        });
        Ok(())
    }

    fn pool(&self) -> anyhow::Result<&Pool> {
        self.pool.as_ref().context("Db::connect first")
    }

    /// A config with subscription `all` (file `all.jsonl`) and, when `paid` is given,
    /// subscription `paid` (`order.paid` events only) writing to that path.
    fn config(&self, work: &Workdir, paid: Option<&str>) -> String {
        let mut text = format!(
            r#"
[source]
{}
[relay]
batch_size = 100
publish_timeout = "2s"
[sinks.all]
kind = "file"
path = "{}"
[[subscription]]
name = "all"
sink = "all"
"#,
            self.source,
            work.path().join("all.jsonl").display()
        );
        if let Some(path) = paid {
            text.push_str(&format!(
                "[sinks.paid]\nkind = \"file\"\npath = \"{path}\"\n[[subscription]]\nname = \"paid\"\nsink = \"paid\"\nevent_type = \"*.paid\"\n"
            ));
        }
        text
    }

    /// Writes events `from..to` of each aggregate `o{a}` (payload `{"n":N}`), one
    /// transaction per round of one event per aggregate: per aggregate, commit order is `n`.
    async fn write(&self, aggregates: &[usize], from: u64, to: u64) -> anyhow::Result<()> {
        for n in from..to {
            let events: Vec<NewEvent> = aggregates
                .iter()
                .map(|a| {
                    NewEvent::new(
                        "Order",
                        format!("o{a}"),
                        event_type(n),
                        format!("{{\"n\":{n}}}"),
                    )
                })
                .collect();
            match self.pool()? {
                Pool::Pg(pool) => {
                    let mut tx = pool.begin().await?;
                    PgOutbox::default().enqueue_batch(&mut *tx, &events).await?;
                    tx.commit().await?;
                }
                Pool::Lite(pool) => {
                    outbox_sqlite::enqueue_batch(pool, &events).await?;
                }
                Pool::My(pool) => {
                    let mut tx = pool.begin().await?;
                    outbox_mysql::enqueue_batch(&mut tx, &events).await?;
                    tx.commit().await?;
                }
            }
        }
        Ok(())
    }

    /// One number from `sql` (no parameters; the same text on every kind), -1 on error.
    async fn count(&self, sql: &str) -> i64 {
        self.scalar(sql, None).await.unwrap_or(-1)
    }

    /// One number from `sql`, with `bind` as its one parameter if given.
    async fn scalar(&self, sql: &str, bind: Option<i64>) -> anyhow::Result<i64> {
        macro_rules! one {
            ($pool:expr) => {{
                let q = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()));
                match bind {
                    Some(v) => q.bind(v).fetch_one($pool).await?,
                    None => q.fetch_one($pool).await?,
                }
            }};
        }
        Ok(match self.pool()? {
            Pool::Pg(pool) => one!(pool),
            Pool::Lite(pool) => one!(pool),
            Pool::My(pool) => one!(pool),
        })
    }

    async fn execute(&self, sql: &str) -> anyhow::Result<()> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self.pool()? {
            Pool::Pg(pool) => {
                sqlx::query(sql).execute(pool).await?;
            }
            Pool::Lite(pool) => {
                sqlx::query(sql).execute(pool).await?;
            }
            Pool::My(pool) => {
                sqlx::query(sql).execute(pool).await?;
            }
        }
        Ok(())
    }

    /// The outbox's commit-order column: `seq` (PostgreSQL, SQLite), `position` (MySQL's
    /// global insert order; its `seq` counts per aggregate).
    fn order_column(&self) -> &'static str {
        match self.kind {
            Kind::Postgres | Kind::PostgresCdc | Kind::Sqlite => "seq",
            Kind::MariaDb => "position",
        }
    }

    /// The newest outbox row's position in `order_column`.
    async fn newest(&self) -> anyhow::Result<i64> {
        self.scalar(
            &format!("SELECT max({}) FROM outbox", self.order_column()),
            None,
        )
        .await
    }

    /// How many of the events up to `old_max` (`order_column`) subscription `paid` holds.
    async fn old_in_paid(&self, old_max: i64) -> i64 {
        let placeholder = match self.kind {
            Kind::Postgres | Kind::PostgresCdc => "$1",
            Kind::Sqlite | Kind::MariaDb => "?",
        };
        let sql = format!(
            "SELECT count(*) FROM outbox_sub_paid s JOIN outbox o USING (id) WHERE o.{} <= {placeholder}",
            self.order_column()
        );
        self.scalar(&sql, Some(old_max)).await.unwrap_or(-1)
    }

    /// The ids of the `order.paid` events in the outbox.
    async fn paid_ids(&self) -> anyhow::Result<HashSet<String>> {
        const SQL: &str = "SELECT id FROM outbox WHERE event_type = 'order.paid'";
        Ok(match self.pool()? {
            Pool::Pg(pool) => {
                sqlx::query_scalar::<_, String>(
                    "SELECT id::text FROM outbox WHERE event_type = 'order.paid'",
                )
                .fetch_all(pool)
                .await?
            }
            Pool::Lite(pool) => sqlx::query_scalar::<_, String>(SQL).fetch_all(pool).await?,
            Pool::My(pool) => sqlx::query_scalar::<_, String>(SQL).fetch_all(pool).await?,
        }
        .into_iter()
        .collect())
    }

    /// Waits until no event is pending in the outbox. Fails only when the backlog stops
    /// shrinking for `stall` (a busy machine drains slower, not never).
    async fn wait_drained(&self, stall: Duration) -> anyhow::Result<()> {
        let mut lowest = i64::MAX;
        let mut progress_at = tokio::time::Instant::now();
        // CDC leaves the outbox rows `pending` (the slot is the progress): drained is every
        // row copied into subscription `all` and delivered there.
        let undelivered = match self.kind {
            Kind::PostgresCdc => {
                "SELECT (SELECT count(*) FROM outbox o WHERE NOT EXISTS \
                 (SELECT 1 FROM outbox_sub_all s WHERE s.id = o.id)) \
                 + (SELECT count(*) FROM outbox_sub_all WHERE state = 'pending')"
            }
            _ => "SELECT count(*) FROM outbox WHERE state = 'pending'",
        };
        loop {
            match self.count(undelivered).await {
                0 => return Ok(()),
                n if n >= 0 && n < lowest => {
                    lowest = n;
                    progress_at = tokio::time::Instant::now();
                }
                _ => {}
            }
            ensure!(
                progress_at.elapsed() < stall,
                "events still pending: {lowest} left, none delivered for {stall:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn event_type(n: u64) -> &'static str {
    if n % 2 == 1 {
        "order.paid"
    } else {
        "order.placed"
    }
}

/// Waits until the outbox and both subscription tables hold no pending row.
/// (CDC leaves the outbox rows `pending`: there, every row must be in subscription `all`.)
async fn wait_all_delivered(db: &Db, work: &Workdir) -> anyhow::Result<()> {
    let outbox = match db.kind {
        Kind::PostgresCdc => {
            "(SELECT count(*) FROM outbox o WHERE NOT EXISTS \
             (SELECT 1 FROM outbox_sub_all s WHERE s.id = o.id))"
        }
        _ => "(SELECT count(*) FROM outbox WHERE state <> 'delivered')",
    };
    let undelivered = format!(
        "SELECT {outbox}
              + (SELECT count(*) FROM outbox_sub_all WHERE state <> 'delivered')
              + (SELECT count(*) FROM outbox_sub_paid WHERE state <> 'delivered')"
    );
    eventually(PATIENCE, || async { db.count(&undelivered).await == 0 })
        .await
        .with_context(|| {
            format!(
                "not everything delivered\nrelay log:\n{}",
                work.read_log("relay.log")
            )
        })
}

/// One line of a file sink.
struct Line {
    id: String,
    aggregate: String,
    n: u64,
    seq: u64,
}

fn lines(path: &Path) -> anyhow::Result<Vec<Line>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    text.lines()
        .map(|l| {
            let m: serde_json::Value = serde_json::from_str(l)?;
            Ok(Line {
                id: m["id"].as_str().context("id")?.to_owned(),
                aggregate: m["aggregate_id"]
                    .as_str()
                    .context("aggregate_id")?
                    .to_owned(),
                n: m["payload"]["n"].as_u64().with_context(|| format!("{m}"))?,
                seq: m["headers"]["aggregate_seq"]
                    .as_str()
                    .with_context(|| format!("no aggregate_seq: {m}"))?
                    .parse()?,
            })
        })
        .collect()
}

/// The consumer's view: per aggregate, events arrive in commit order (a redelivery may repeat
/// one, never go back), and `aggregate_seq` is 1, 2, 3, ... over them, one number per event.
/// Returns the distinct ids received.
fn check_order(received: &[Line], what: &str) -> anyhow::Result<HashSet<String>> {
    let mut by_seq: BTreeMap<&str, BTreeMap<u64, u64>> = BTreeMap::new();
    let mut seen: HashMap<&str, u64> = HashMap::new();
    let mut first = HashSet::new();
    for m in received {
        let prev = by_seq.entry(&m.aggregate).or_default().insert(m.seq, m.n);
        ensure!(
            prev.is_none_or(|p| p == m.n),
            "{what}: {} aggregate_seq {} on events {prev:?} and {}",
            m.aggregate,
            m.seq,
            m.n
        );
        if first.insert(m.id.clone())
            && let Some(last) = seen.insert(&m.aggregate, m.n)
        {
            ensure!(
                m.n > last,
                "{what}: {} received event {} after event {last} (inversion)",
                m.aggregate,
                m.n
            );
        }
    }
    for (aggregate, seqs) in &by_seq {
        let numbers: Vec<u64> = seqs.keys().copied().collect();
        ensure!(
            numbers == (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{what}: {aggregate}'s aggregate_seq values are not 1..{}: {numbers:?}",
            seqs.len()
        );
        let ns: Vec<u64> = seqs.values().copied().collect();
        ensure!(
            ns.windows(2).all(|w| w[0] < w[1]),
            "{what}: {aggregate}'s aggregate_seq does not follow commit order: {ns:?}"
        );
    }
    Ok(first)
}

/// The counts of a backfill's final line.
fn counts(stdout: &str) -> anyhow::Result<BTreeMap<&'static str, u64>> {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("backfill of subscription"))
        .with_context(|| format!("no final line: {stdout}"))?;
    let mut out = BTreeMap::new();
    for (key, label) in [
        ("copied", "copied "),
        ("already", "already there "),
        ("filter", "skipped by the filter "),
        ("newer", "already delivered) "),
    ] {
        let at = line
            .find(label)
            .with_context(|| format!("`{label}` in {line}"))?
            + label.len();
        let n: String = line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        out.insert(key, n.parse()?);
    }
    Ok(out)
}

fn sigkill(child: &tokio::process::Child) -> anyhow::Result<()> {
    let pid = child.id().context("already gone")?;
    ensure!(
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?
            .success(),
        "kill -KILL"
    );
    Ok(())
}

/// Old events (fanned out before subscription `paid` existed) and live traffic on the same
/// aggregates; `paid` is paused meanwhile (the documented workflow), so its live copies wait
/// pending and the backfill must put the old events ahead of them. The backfill and a relay are
/// killed with SIGKILL mid-way; a rerun completes. Afterwards every `order.paid` event
/// reaches `paid` once (redeliveries aside), in commit order per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_during_live_traffic_survives_kill_9_in_commit_order() -> anyhow::Result<()> {
    live_traffic_and_kill_9(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_during_live_traffic_survives_kill_9_in_commit_order_on_postgres_cdc()
-> anyhow::Result<()> {
    live_traffic_and_kill_9(Kind::PostgresCdc).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_during_live_traffic_survives_kill_9_in_commit_order_on_sqlite()
-> anyhow::Result<()> {
    live_traffic_and_kill_9(Kind::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_during_live_traffic_survives_kill_9_in_commit_order_on_mariadb()
-> anyhow::Result<()> {
    live_traffic_and_kill_9(Kind::MariaDb).await
}

async fn live_traffic_and_kill_9(kind: Kind) -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let mut db = Db::fresh(kind, &work).await?;
    let old = work.write_config("old.toml", &db.config(&work, None))?;
    let paid_file = work.path().join("paid.jsonl");
    let good = work.write_config(
        "good.toml",
        &db.config(&work, Some(&paid_file.display().to_string())),
    )?;
    let arg = |p: &Path| p.to_str().map(str::to_owned).context("utf-8 path");
    work.run_ok(&["migrate", "--config", &arg(&old)?]).await?;
    db.connect().await?;
    let db = Arc::new(db);
    // 1. 40 aggregates x 500 events, fanned out by a relay that knows only `all`.
    let aggregates: Vec<usize> = (0..40).collect();
    db.write(&aggregates, 0, 500).await?;
    let mut relay = work.spawn_relay(&old, "relay.log")?;
    db.wait_drained(Duration::from_secs(60)).await?;
    support::terminate(&mut relay, Duration::from_secs(30)).await?;
    let old_max = db.newest().await?;

    // 2. `paid` added and paused (the fan-out copies into it, nothing is delivered), relays
    //    that know it, and producers on half of the aggregates.
    work.run_ok(&["migrate", "--config", &arg(&good)?]).await?;
    ensure!(
        db.count("SELECT count(*) FROM outbox_sub_paid").await == 0,
        "paid not empty"
    );
    work.run_ok(&["subscription", "pause", "paid", "--config", &arg(&good)?])
        .await?;
    let mut relays = vec![
        work.spawn_relay(&good, "relay.log")?,
        work.spawn_relay(&good, "relay.log")?,
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let live = {
        let (db, stop) = (db.clone(), stop.clone());
        tokio::spawn(async move {
            let live: Vec<usize> = (0..20).collect();
            let mut n = 500;
            while !stop.load(Ordering::Relaxed) {
                db.write(&live, n, n + 1).await?;
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(n)
        })
    };
    eventually(PATIENCE, || async {
        db.count("SELECT count(*) FROM outbox_sub_paid").await > 0
    })
    .await
    .context("live traffic never reached subscription paid")?;

    // 3. The backfill, killed once its first chunk committed and before it finished (pages
    //    hold whole aggregates, about 20 pages here: killing at the first leaves the margin).
    let backfill_args = ["backfill", "--subscription", "paid", "--all", "--config"];
    let first_log = std::fs::File::create(work.path().join("backfill.log"))?;
    let mut first = work
        .command(&[&backfill_args[..], &[&arg(&good)?]].concat())
        .stdout(Stdio::null())
        .stderr(first_log)
        .spawn()?;
    eventually(PATIENCE, || async { db.old_in_paid(old_max).await > 0 })
        .await
        .with_context(|| {
            format!(
                "the backfill copied nothing\nbackfill log:\n{}",
                work.read_log("backfill.log")
            )
        })?;
    ensure!(
        first.try_wait()?.is_none(),
        "the backfill finished before it could be killed mid-way"
    );
    sigkill(&first)?;
    first.wait().await?;
    let after_kill = db.old_in_paid(old_max).await;
    ensure!(
        after_kill < 10_000,
        "the first backfill copied everything ({after_kill})"
    );

    // 4. A relay killed and replaced while the backfill runs again, to the end.
    let second = work.command(&[&backfill_args[..], &[&arg(&good)?]].concat());
    let second = tokio::spawn(support::output(second));
    sigkill(&relays[0])?;
    relays[0].wait().await?;
    relays[0] = work.spawn_relay(&good, "relay.log")?;
    let out = second.await??;
    ensure!(
        out.code == Some(0),
        "backfill: {}{}",
        out.stdout,
        out.stderr
    );
    let c = counts(&out.stdout)?;
    ensure!(
        c["newer"] == 0,
        "nothing was delivered to paid, yet: {}",
        out.stdout
    );
    ensure!(
        c["filter"] >= 10_000,
        "order.placed events pass the filter: {}",
        out.stdout
    );
    ensure!(
        c["copied"] > 0 && c["already"] >= after_kill as u64,
        "the rerun copies the rest and finds the first run's copies: {}",
        out.stdout
    );
    stop.store(true, Ordering::Relaxed);
    live.await??;

    // 5. `paid` resumed: everything drains.
    work.run_ok(&["subscription", "resume", "paid", "--config", &arg(&good)?])
        .await?;
    wait_all_delivered(&db, &work).await?;
    for r in &mut relays {
        support::terminate(r, Duration::from_secs(30)).await?;
    }

    let expected = db.paid_ids().await?;
    let received = check_order(&lines(&paid_file)?, "paid.jsonl")?;
    ensure!(
        received == expected,
        "paid.jsonl: {} distinct events, {} order.paid events in the outbox; missing {:?}",
        received.len(),
        expected.len(),
        expected.difference(&received).take(5).collect::<Vec<_>>()
    );
    Ok(())
}

/// Aggregate o1 got a live event that `paid` delivered; its older events can no longer be
/// delivered in order, so the backfill counts them as skipped. Aggregate o2 had no live event:
/// its old events are copied and delivered in order. A rerun finds them there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_older_than_a_delivered_one_are_counted_not_delivered() -> anyhow::Result<()> {
    older_than_delivered(Kind::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_older_than_a_delivered_one_are_counted_not_delivered_on_postgres_cdc()
-> anyhow::Result<()> {
    older_than_delivered(Kind::PostgresCdc).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_older_than_a_delivered_one_are_counted_not_delivered_on_sqlite()
-> anyhow::Result<()> {
    older_than_delivered(Kind::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_older_than_a_delivered_one_are_counted_not_delivered_on_mariadb()
-> anyhow::Result<()> {
    older_than_delivered(Kind::MariaDb).await
}

async fn older_than_delivered(kind: Kind) -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let mut db = Db::fresh(kind, &work).await?;
    let paid_file = work.path().join("paid.jsonl");
    let old = work.write_config("old.toml", &db.config(&work, None))?;
    let new = work.write_config(
        "new.toml",
        &db.config(&work, Some(&paid_file.display().to_string())),
    )?;
    let new_arg = new.to_str().context("utf-8 path")?;
    let old_arg = old.to_str().context("utf-8 path")?;
    work.run_ok(&["migrate", "--config", old_arg]).await?;
    db.connect().await?;
    // n = 0..10 on o1 and o2: five order.paid (odd n), five order.placed.
    db.write(&[1, 2], 0, 10).await?;
    let mut relay = work.spawn_relay(&old, "relay.log")?;
    db.wait_drained(Duration::from_secs(60)).await?;
    support::terminate(&mut relay, Duration::from_secs(30)).await?;

    work.run_ok(&["migrate", "--config", new_arg]).await?;
    let mut relay = work.spawn_relay(&new, "relay.log")?;
    db.write(&[1], 11, 12).await?;
    eventually(PATIENCE, || async {
        lines(&paid_file).is_ok_and(|l| l.len() == 1)
    })
    .await
    .context("the live event never reached paid.jsonl")?;

    let args = [
        "backfill",
        "--subscription",
        "paid",
        "--all",
        "--config",
        new_arg,
    ];
    let out = work.run_ok(&args).await?;
    let c = counts(&out)?;
    ensure!(
        c["copied"] == 5 && c["newer"] == 5 && c["filter"] == 10 && c["already"] == 1,
        "{out}"
    );
    eventually(PATIENCE, || async {
        lines(&paid_file).is_ok_and(|l| l.len() >= 6)
    })
    .await
    .context("o2's events never reached paid.jsonl")?;
    let received = lines(&paid_file)?;
    check_order(&received, "paid.jsonl")?;
    let of = |a: &str| -> Vec<u64> {
        received
            .iter()
            .filter(|m| m.aggregate == a)
            .map(|m| m.n)
            .collect()
    };
    ensure!(of("o1") == vec![11], "o1: {:?}", of("o1"));
    ensure!(of("o2") == vec![1, 3, 5, 7, 9], "o2: {:?}", of("o2"));

    let again = counts(&work.run_ok(&args).await?)?;
    ensure!(
        again["copied"] == 0 && again["already"] == 6 && again["newer"] == 5,
        "rerun: {again:?}"
    );
    support::terminate(&mut relay, Duration::from_secs(30)).await?;
    Ok(())
}

/// Unknown subscription, a `--since` that is no duration, both or neither of `--since` and
/// `--all`, no `--subscription`: a clear error, a non-zero exit, nothing copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_copies_nothing() -> anyhow::Result<()> {
    for kind in [Kind::Postgres, Kind::Sqlite, Kind::MariaDb] {
        bad_input(kind).await.with_context(|| format!("{kind:?}"))?;
    }
    Ok(())
}

async fn bad_input(kind: Kind) -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let mut db = Db::fresh(kind, &work).await?;
    let paid = work.path().join("paid.jsonl");
    let cfg = work.write_config(
        "outbox.toml",
        &db.config(&work, Some(&paid.display().to_string())),
    )?;
    let cfg = cfg.to_str().context("utf-8 path")?;
    work.run_ok(&["migrate", "--config", cfg]).await?;
    db.connect().await?;
    db.write(&[1], 0, 4).await?;
    db.execute("UPDATE outbox SET state = 'delivered'").await?;
    // (arguments, what the error line says, what stderr names)
    for (args, needle, names) in [
        (
            vec!["--subscription", "nope", "--all"],
            "no subscription named `nope`",
            "paid",
        ),
        (
            vec!["--subscription", "paid", "--since", "yesterday"],
            "'yesterday'",
            "--since",
        ),
        (
            vec!["--subscription", "paid", "--since", "2h", "--all"],
            "cannot be used with",
            "--all",
        ),
        (
            vec!["--subscription", "paid"],
            "required arguments were not provided",
            "--since",
        ),
        (vec!["--all"], "--subscription", "--subscription"),
    ] {
        let mut full = vec!["backfill", "--config", cfg];
        full.extend(&args);
        let out = work.run(&full).await?;
        out.assert_clear_error(needle)?;
        ensure!(out.stderr.contains(names), "{args:?}: {}", out.stderr);
        ensure!(
            db.count("SELECT count(*) FROM outbox_sub_paid").await == 0,
            "{args:?} copied something"
        );
    }
    Ok(())
}
