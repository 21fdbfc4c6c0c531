//! Reloading the configuration without a restart (docs/operations.md, "Reloading the
//! config"), with the built `outbox` binary: a subscription added by a file edit and SIGHUP
//! gets every event fanned out after the reload while events keep flowing in order (SQLite,
//! PostgreSQL polling and PostgreSQL CDC, whose reload hands the slot over); invalid
//! edits and keys that need a restart are refused and the old configuration keeps running;
//! the change log masks secrets; the console's reload action is CSRF-guarded and refused when
//! actions are off.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_testkit::services::{Nats, Postgres};
use support::browser::{free_port, http};
use support::{Workdir, read_stream, terminate};
use tokio::process::Child;

const LOG: &str = "relay.log";
const APPLIED: &str = "configuration reloaded: the new pipelines run";
const REFUSED: &str = "configuration reload refused";
/// Generous: readiness is polled, this only bounds a broken run.
const WAIT: Duration = Duration::from_secs(60);

fn sighup(child: &Child) -> anyhow::Result<()> {
    let pid = child.id().context("relay already gone")?;
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -HUP failed");
    Ok(())
}

/// The JSON lines of the file sink's `name` in `work`.
fn lines(work: &Workdir, name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(work.path().join(name))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// `(aggregate_id, n)` of each line, in file order.
fn numbered(lines: &[serde_json::Value]) -> anyhow::Result<Vec<(String, u64)>> {
    lines
        .iter()
        .map(|m| {
            Ok((
                m["aggregate_id"]
                    .as_str()
                    .context("aggregate_id")?
                    .to_owned(),
                m["payload"]["n"].as_u64().with_context(|| format!("{m}"))?,
            ))
        })
        .collect()
}

/// Per aggregate the numbers only go up (commit order) and none repeats.
fn in_order_once(what: &str, got: &[(String, u64)]) -> anyhow::Result<()> {
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for (aggregate, n) in got {
        if let Some(prev) = last.insert(aggregate, *n) {
            ensure!(*n > prev, "{what}: {aggregate} got {n} after {prev}");
        }
    }
    Ok(())
}

/// Waits until the relay log holds `needle` `times` times.
async fn logged(work: &Workdir, needle: &str, times: usize) -> anyhow::Result<()> {
    outbox_testkit::wait::eventually(WAIT, || async {
        work.read_log(LOG).matches(needle).count() >= times
    })
    .await
    .with_context(|| format!("`{needle}` x{times} never logged:\n{}", work.read_log(LOG)))
}

/// `GET /metrics` has the line `line`.
async fn metric(port: u16, line: &str) -> anyhow::Result<()> {
    let (_, body) = http(port, "GET", "/metrics", &[]).await?;
    ensure!(
        body.lines().any(|l| l.trim() == line),
        "/metrics lacks `{line}`:\n{}",
        body.lines()
            .filter(|l| l.contains("config"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// Events the [`Writer`] committed: `n` and whether it is an `invoice.paid`.
type Written = Arc<Mutex<Vec<(u64, bool)>>>;

/// Writes one event per transaction to the SQLite outbox at `db` until stopped: aggregates
/// `o0`..`o3`, payload `{"n": N}`, every third one `invoice.paid`.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Written,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Writer {
    async fn start(store: &Store) -> anyhow::Result<Self> {
        let producer = store.producer().await?;
        let stop = Arc::new(AtomicBool::new(false));
        let written: Written = Arc::default();
        let (flag, log) = (stop.clone(), written.clone());
        let task = tokio::spawn(async move {
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                let paid = n.is_multiple_of(3);
                let event_type = if paid { "invoice.paid" } else { "order.placed" };
                let event = NewEvent::new(
                    "Order",
                    format!("o{}", n % 4),
                    event_type,
                    format!("{{\"n\":{n}}}"),
                );
                producer.enqueue(&event).await?;
                log.lock().expect("writer log").push((n, paid));
                n += 1;
                // Pacing only: events keep arriving across the reload.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(())
        });
        Ok(Self {
            stop,
            written,
            task,
        })
    }

    fn count(&self) -> u64 {
        self.written.lock().expect("writer log").len() as u64
    }

    async fn finish(self) -> anyhow::Result<Vec<(u64, bool)>> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await??;
        Ok(self.written.lock().expect("writer log").clone())
    }
}

/// Where the outbox is: the reload test runs on each source the relay has.
enum Store {
    Sqlite(std::path::PathBuf),
    /// PostgreSQL; `Some(tag)`: the CDC source, with a slot and publication named after it.
    Postgres {
        url: String,
        cdc: Option<String>,
    },
}

/// A producer writing one event per transaction into a [`Store`].
enum Producer {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Producer {
    async fn enqueue(&self, event: &NewEvent) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(pool) => {
                outbox_sqlite::enqueue(pool, event).await?;
            }
            Self::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                outbox_postgres::enqueue(&mut *tx, event).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }
}

impl Store {
    async fn new(work: &Workdir, kind: &str) -> anyhow::Result<Self> {
        Ok(match kind {
            "sqlite" => Self::Sqlite(work.path().join("app.db")),
            _ => Self::Postgres {
                url: Postgres::shared().await?.fresh_database().await?,
                cdc: (kind == "postgres-cdc")
                    .then(|| format!("reload{}", uuid::Uuid::new_v4().simple())),
            },
        })
    }

    fn source(&self) -> String {
        match self {
            Self::Sqlite(db) => {
                format!("[source]\nkind = \"sqlite\"\npath = \"{}\"\n", db.display())
            }
            Self::Postgres { url, cdc: None } => {
                format!("[source]\nkind = \"postgres\"\nurl = \"{url}\"\n")
            }
            Self::Postgres {
                url,
                cdc: Some(tag),
            } => format!(
                "[source]\nkind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\n"
            ),
        }
    }

    /// Drops the CDC source's slot (slots are cluster-wide and keep WAL while they exist),
    /// once the server's walsender of the exited relay has let go of it (it notices the
    /// closed connection a moment after the relay exits).
    async fn drop_slot(&self) -> anyhow::Result<()> {
        if let Self::Postgres {
            url,
            cdc: Some(tag),
        } = self
        {
            let pool = sqlx::PgPool::connect(url).await?;
            let slot = format!("s_{tag}");
            outbox_testkit::wait::eventually(WAIT, || async {
                let active: Option<bool> = sqlx::query_scalar(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                )
                .bind(&slot)
                .fetch_optional(&pool)
                .await
                .ok()
                .flatten();
                active == Some(false)
            })
            .await
            .with_context(|| format!("slot {slot} still active after the relay exited"))?;
            sqlx::query("SELECT pg_drop_replication_slot($1)")
                .bind(&slot)
                .execute(&pool)
                .await?;
        }
        Ok(())
    }

    async fn producer(&self) -> anyhow::Result<Producer> {
        Ok(match self {
            Self::Sqlite(db) => Producer::Sqlite(
                outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(db)).await?,
            ),
            Self::Postgres { url, .. } => Producer::Postgres(sqlx::PgPool::connect(url).await?),
        })
    }
}

fn file_subscriptions(store: &Store, work: &Workdir, port: u16, paid: bool) -> String {
    let mut text = format!(
        r#"{source}[relay]
batch_size = 20
[metrics]
listen = "127.0.0.1:{port}"
[sinks.all]
kind = "file"
path = "{all}"
[[subscription]]
name = "all"
sink = "all"
"#,
        source = store.source(),
        all = work.path().join("all.jsonl").display(),
    );
    if paid {
        text.push_str(&format!(
            "[sinks.paid]\nkind = \"file\"\npath = \"{}\"\n[[subscription]]\nname = \"paid\"\nsink = \"paid\"\nevent_type = \"*.paid\"\n",
            work.path().join("paid.jsonl").display()
        ));
    }
    text
}

/// The issue's "done when" for reloading: a running relay gets a new subscription by a file
/// edit and SIGHUP, and delivers to it every event fanned out after the reload, while the
/// first subscription gets every event once, in order, across the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_subscription_while_events_keep_flowing_in_order() -> anyhow::Result<()> {
    sighup_adds_a_subscription("sqlite").await
}

/// The same on PostgreSQL, polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_subscription_on_postgres() -> anyhow::Result<()> {
    sighup_adds_a_subscription("postgres").await
}

/// The same on PostgreSQL with the CDC source: the reload drains the pipeline that holds the
/// replication slot, and the new one takes the slot over (its saved position, its
/// `aggregate_seq` heads) without a gap or a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_subscription_on_postgres_cdc() -> anyhow::Result<()> {
    sighup_adds_a_subscription("postgres-cdc").await
}

async fn sighup_adds_a_subscription(kind: &str) -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let store = Store::new(&work, kind).await?;
    let port = free_port()?;
    let cfg = work.write_config(
        "outbox.toml",
        &file_subscriptions(&store, &work, port, false),
    )?;
    let cfg_arg = cfg.to_str().context("path")?;
    work.run_ok(&["migrate", "--config", cfg_arg]).await?;
    let mut relay = work.spawn_relay(&cfg, LOG)?;
    let writer = Writer::start(&store).await?;
    outbox_testkit::wait::eventually(WAIT, || async { lines(&work, "all.jsonl").len() >= 30 })
        .await
        .with_context(|| work.read_log(LOG))?;

    // The edit: a second sink and a filtered subscription. Before `migrate` recorded it,
    // the reload is refused and the first subscription goes on.
    work.write_config(
        "outbox.toml",
        &file_subscriptions(&store, &work, port, true),
    )?;
    sighup(&relay)?;
    logged(&work, REFUSED, 1).await?;
    ensure!(
        work.read_log(LOG)
            .contains("subscription[paid]: not in the subscription catalog"),
        "{}",
        work.read_log(LOG)
    );
    let seen = lines(&work, "all.jsonl").len();
    outbox_testkit::wait::eventually(WAIT, || async {
        lines(&work, "all.jsonl").len() >= seen + 10
    })
    .await
    .with_context(|| {
        format!(
            "the refused reload stopped delivery:
{}",
            work.read_log(LOG)
        )
    })?;
    work.run_ok(&["migrate", "--config", cfg_arg]).await?;
    sighup(&relay)?;
    logged(&work, APPLIED, 1).await?;
    let mark = writer.count();
    outbox_testkit::wait::eventually(WAIT, || async {
        lines(&work, "paid.jsonl")
            .iter()
            .filter(|m| m["payload"]["n"].as_u64() >= Some(mark))
            .count()
            >= 10
    })
    .await
    .with_context(|| work.read_log(LOG))?;
    let written = writer.finish().await?;
    let total = written.len();
    let paid_after: BTreeSet<u64> = written
        .iter()
        .filter(|(n, paid)| *paid && *n >= mark)
        .map(|(n, _)| *n)
        .collect();
    outbox_testkit::wait::eventually(WAIT, || async {
        let all: BTreeSet<u64> = lines(&work, "all.jsonl")
            .iter()
            .filter_map(|m| m["payload"]["n"].as_u64())
            .collect();
        let paid: BTreeSet<u64> = lines(&work, "paid.jsonl")
            .iter()
            .filter_map(|m| m["payload"]["n"].as_u64())
            .collect();
        all.len() == total && paid.is_superset(&paid_after)
    })
    .await
    .with_context(|| format!("not every event arrived:\n{}", work.read_log(LOG)))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}:\n{}",
        work.read_log(LOG)
    );

    store.drop_slot().await?;

    let all = numbered(&lines(&work, "all.jsonl"))?;
    ensure!(
        all.len() == total,
        "all.jsonl: {} lines for {total} events (a duplicate across the reload)",
        all.len()
    );
    in_order_once("all.jsonl", &all)?;
    let paid_lines = lines(&work, "paid.jsonl");
    ensure!(
        paid_lines.iter().all(|m| m["event_type"] == "invoice.paid"),
        "paid.jsonl took an event its filter refuses"
    );
    in_order_once("paid.jsonl", &numbered(&paid_lines)?)?;
    let log = work.read_log(LOG);
    ensure!(
        log.contains("config change: subscription[paid].sink: (unset) → \"paid\""),
        "the change is not logged:\n{log}"
    );
    Ok(())
}

fn file_sink(db: &Path, out: &Path, port: u16, extra: &str) -> String {
    format!(
        "[source]\nkind = \"sqlite\"\npath = \"{}\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n[sink]\nkind = \"file\"\npath = \"{}\"\n{extra}",
        db.display(),
        out.display()
    )
}

/// Enqueues events `from..to` on aggregate `o1`.
async fn enqueue(db: &Path, from: u64, to: u64) -> anyhow::Result<()> {
    let pool = outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(db)).await?;
    for n in from..to {
        let event = NewEvent::new("Order", "o1", "order.placed", format!("{{\"n\":{n}}}"));
        outbox_sqlite::enqueue(&pool, &event).await?;
    }
    Ok(())
}

/// Invalid files and keys that need a restart are refused with the key named (the same
/// message `outbox check-config` gives), the old configuration keeps delivering; a valid
/// edit afterwards applies, with its log level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_edit_is_refused_naming_the_key_and_the_old_config_keeps_running()
-> anyhow::Result<()> {
    let work = Workdir::new()?;
    let db = work.path().join("app.db");
    let (out, out2) = (
        work.path().join("out.jsonl"),
        work.path().join("out2.jsonl"),
    );
    let port = free_port()?;
    let cfg = work.write_config("outbox.toml", &file_sink(&db, &out, port, ""))?;
    let cfg_arg = cfg.to_str().context("path")?;
    work.run_ok(&["migrate", "--config", cfg_arg]).await?;
    let mut relay = work.spawn_relay(&cfg, LOG)?;
    enqueue(&db, 0, 5).await?;
    outbox_testkit::wait::eventually(WAIT, || async { lines(&work, "out.jsonl").len() >= 5 })
        .await
        .with_context(|| work.read_log(LOG))?;

    let other_db = work.path().join("other.db");
    let edits = [
        (
            file_sink(&db, &out, port, "[relay]\nbatch_size = 0\n"),
            "relay.batch_size",
        ),
        (
            file_sink(&db, &out, port, "[relay]\nbogus = 1\n"),
            "unknown key `bogus`",
        ),
        (
            file_sink(
                &db,
                &out,
                port,
                "[tracing]\nlog_level = \"info,outbox=notalevel\"\n",
            ),
            "tracing.log_level",
        ),
        (
            file_sink(&other_db, &out, port, ""),
            "source.path: needs a restart",
        ),
    ];
    for (i, (text, key)) in edits.iter().enumerate() {
        work.write_config("outbox.toml", text)?;
        if !key.contains("restart") {
            // The relay refuses with the message start-up gives.
            let check = work.run(&["check-config", "--config", cfg_arg]).await?;
            let message = check.stderr.trim().trim_start_matches("error: ").to_owned();
            ensure!(
                check.code != Some(0) && message.contains(key),
                "check-config: {}",
                check.stderr
            );
            sighup(&relay)?;
            logged(&work, REFUSED, i + 1).await?;
            let log = work.read_log(LOG);
            ensure!(log.contains(&message), "`{message}` not in the log:\n{log}");
        } else {
            sighup(&relay)?;
            logged(&work, REFUSED, i + 1).await?;
            ensure!(work.read_log(LOG).contains(key), "{}", work.read_log(LOG));
        }
    }
    enqueue(&db, 5, 10).await?;
    outbox_testkit::wait::eventually(WAIT, || async { lines(&work, "out.jsonl").len() >= 10 })
        .await
        .with_context(|| format!("the old config stopped:\n{}", work.read_log(LOG)))?;
    metric(port, "outbox_config_reloads_total{result=\"refused\"} 4").await?;
    metric(port, "outbox_config_generation 1").await?;

    // A valid edit: a new file, and a log level that silences the relay's info lines.
    work.write_config(
        "outbox.toml",
        &file_sink(
            &db,
            &out2,
            port,
            "[tracing]\nlog_level = \"warn,outbox_runtime::reload=info\"\n",
        ),
    )?;
    sighup(&relay)?;
    logged(&work, APPLIED, 1).await?;
    enqueue(&db, 10, 15).await?;
    outbox_testkit::wait::eventually(WAIT, || async { lines(&work, "out2.jsonl").len() >= 5 })
        .await
        .with_context(|| work.read_log(LOG))?;
    metric(port, "outbox_config_generation 2").await?;
    metric(port, "outbox_config_reloads_total{result=\"ok\"} 1").await?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    let first = numbered(&lines(&work, "out.jsonl"))?;
    let second = numbered(&lines(&work, "out2.jsonl"))?;
    let ns: Vec<u64> = first.iter().chain(&second).map(|(_, n)| *n).collect();
    ensure!(
        ns == (0..15).collect::<Vec<_>>(),
        "events across the reload: {ns:?}"
    );
    let log = work.read_log(LOG);
    let (before, after) = log.rsplit_once(APPLIED).context("applied")?;
    ensure!(
        before.contains("relay stopped after draining") && !after.contains("relay stopped"),
        "the new log level was not applied:\n{log}"
    );
    ensure!(
        log.contains(&format!(
            "config change: sink.path: \"{}\" → \"{}\"",
            out.display(),
            out2.display()
        )),
        "{log}"
    );
    Ok(())
}

/// A changed password in a sink URL is logged as `*** → ***`, the changed destination in
/// full; neither password ever reaches the log; events go to the new subjects after the
/// reload, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_log_masks_a_password_in_a_url() -> anyhow::Result<()> {
    const OLD_PW: &str = "oldPw7731secret";
    const NEW_PW: &str = "newPw8842secret";
    let nats = Nats::shared().await?;
    let client = nats.connect().await?;
    let tag = format!("RL{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let work = Workdir::new()?;
    let db = work.path().join("app.db");
    let config = |pw: &str, leg: &str| {
        format!(
            "[source]\nkind = \"sqlite\"\npath = \"{}\"\n[sink]\nkind = \"nats\"\nurl = \"nats://relay:{pw}@127.0.0.1:{}\"\nstream = \"{tag}\"\nstream_subjects = [\"{tag}.>\"]\ndestination = \"{tag}.{leg}.{{aggregate_type}}\"\n",
            db.display(),
            nats.port()
        )
    };
    let cfg = work.write_config("outbox.toml", &config(OLD_PW, "a"))?;
    work.run_ok(&["migrate", "--config", cfg.to_str().context("path")?])
        .await?;
    let mut relay = work.spawn_relay(&cfg, LOG)?;
    enqueue(&db, 0, 5).await?;
    outbox_testkit::wait::eventually(WAIT, || at_least(&client, &tag, 5))
        .await
        .with_context(|| work.read_log(LOG))?;
    work.write_config("outbox.toml", &config(NEW_PW, "b"))?;
    sighup(&relay)?;
    logged(&work, APPLIED, 1).await?;
    enqueue(&db, 5, 10).await?;
    outbox_testkit::wait::eventually(WAIT, || at_least(&client, &tag, 10))
        .await
        .with_context(|| work.read_log(LOG))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    let got = read_stream(&client, &tag).await?;
    let subjects: Vec<String> = got.iter().map(|m| m.subject.clone()).collect();
    let mut want = vec![format!("{tag}.a.Order"); 5];
    want.extend(vec![format!("{tag}.b.Order"); 5]);
    ensure!(subjects == want, "subjects {subjects:?}");
    let log = work.read_log(LOG);
    ensure!(
        !log.contains(OLD_PW) && !log.contains(NEW_PW),
        "a password reached the log:\n{log}"
    );
    ensure!(
        log.contains("config change: sink.url: *** → ***"),
        "the secret change is not listed:\n{log}"
    );
    ensure!(
        log.contains(&format!(
            "config change: sink.destination: \"{tag}.a.{{aggregate_type}}\" → \"{tag}.b.{{aggregate_type}}\""
        )),
        "{log}"
    );
    Ok(())
}

/// Whether `stream` holds at least `n` messages.
async fn at_least(client: &async_nats::Client, stream: &str, n: usize) -> bool {
    read_stream(client, stream)
        .await
        .map(|m| m.len())
        .unwrap_or(0)
        >= n
}

/// The CSRF token the console page carries.
async fn csrf(port: u16) -> anyhow::Result<String> {
    let (status, page) = http(port, "GET", "/ui", &[]).await?;
    ensure!(status == 200, "GET /ui: {status}");
    let (_, rest) = page
        .split_once("name=\"csrf-token\" content=\"")
        .context("no csrf-token")?;
    Ok(rest.split('"').next().context("csrf")?.to_owned())
}

/// `POST /ui/api/reload` as the console page sends it (`with_token`: the CSRF header and
/// cookie).
async fn post_reload(port: u16, token: Option<&str>) -> anyhow::Result<(u16, String)> {
    let origin = format!("http://127.0.0.1:{port}");
    let cookie = token.map(|t| format!("outbox_csrf={t}"));
    let mut headers = vec![
        ("Origin", origin.as_str()),
        ("Content-Type", "application/json"),
    ];
    if let (Some(t), Some(c)) = (token, &cookie) {
        headers.push(("X-Outbox-Csrf", t));
        headers.push(("Cookie", c));
    }
    http(port, "POST", "/ui/api/reload", &headers).await
}

/// The console's reload: refused without the CSRF token and when actions are off; with
/// them, an invalid file is a 422 naming the key, a valid one answers the new generation
/// and its changes, and the overview shows the generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_reload_is_csrf_guarded_and_needs_actions() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let db = work.path().join("app.db");
    let out = work.path().join("out.jsonl");
    let port = free_port()?;
    let ui = "[ui]\nallow_actions = true\n";
    let cfg = work.write_config("outbox.toml", &file_sink(&db, &out, port, ui))?;
    work.run_ok(&["migrate", "--config", cfg.to_str().context("path")?])
        .await?;
    let mut relay = work.spawn_relay(&cfg, LOG)?;
    outbox_testkit::wait::eventually(WAIT, || async { csrf(port).await.is_ok() }).await?;
    let token = csrf(port).await?;

    let (status, body) = post_reload(port, None).await?;
    ensure!(status == 403 && body.contains("CSRF"), "{status} {body}");
    work.write_config(
        "outbox.toml",
        &file_sink(&db, &out, port, &format!("{ui}[relay]\nbatch_size = 0\n")),
    )?;
    let (status, body) = post_reload(port, Some(&token)).await?;
    ensure!(
        status == 422 && body.contains("relay.batch_size"),
        "{status} {body}"
    );
    let extra = format!("{ui}[relay]\nbatch_size = 7\n");
    work.write_config("outbox.toml", &file_sink(&db, &out, port, &extra))?;
    let (status, body) = post_reload(port, Some(&token)).await?;
    ensure!(status == 200, "{status} {body}");
    let answer: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(answer["generation"] == 2, "{answer}");
    ensure!(
        answer["changes"][0]["key"] == "relay.batch_size" && answer["changes"][0]["new"] == "7",
        "{answer}"
    );
    let (_, overview) = http(port, "GET", "/ui/api/overview", &[]).await?;
    let overview: serde_json::Value = serde_json::from_str(&overview)?;
    ensure!(overview["config"]["generation"] == 2, "{overview}");
    enqueue(&db, 0, 3).await?;
    outbox_testkit::wait::eventually(WAIT, || async { lines(&work, "out.jsonl").len() >= 3 })
        .await
        .with_context(|| work.read_log(LOG))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "relay exit {code:?}");

    // Actions off (the default): the same request is refused, nothing reloads.
    let port = free_port()?;
    let cfg = work.write_config("off.toml", &file_sink(&db, &out, port, ""))?;
    let mut relay = work.spawn_relay(&cfg, "off.log")?;
    outbox_testkit::wait::eventually(WAIT, || async { csrf(port).await.is_ok() }).await?;
    let token = csrf(port).await?;
    let (status, body) = post_reload(port, Some(&token)).await?;
    ensure!(
        status == 403 && body.contains("allow_actions"),
        "{status} {body}"
    );
    metric(port, "outbox_config_generation 1").await?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    Ok(())
}
