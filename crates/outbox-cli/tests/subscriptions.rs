//! `[sinks.NAME]` + `[[subscription]]`: one outbox fanned out to several destinations, each
//! with its own progress, retries, dead letters, metrics and status line; a broker that is
//! down holds back only its own subscription.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_postgres::PgOutbox;
use outbox_testkit::services::{Nats, Postgres};
use support::{Received, Workdir, read_stream, terminate};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `GET path` on 127.0.0.1:`port`; the body.
async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// Messages in `stream`, or 0 while it does not exist yet.
async fn stream_len(client: &async_nats::Client, stream: &str) -> u64 {
    let js = async_nats::jetstream::new(client.clone());
    match js.get_stream(stream).await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Waits until `stream` holds at least `n` messages; fails when it stops growing for `stall`.
async fn wait_stream(
    client: &async_nats::Client,
    stream: &str,
    n: u64,
    stall: Duration,
    work: &Workdir,
) -> anyhow::Result<()> {
    let mut best = 0;
    let mut progress_at = tokio::time::Instant::now();
    loop {
        let len = stream_len(client, stream).await;
        if len >= n {
            return Ok(());
        }
        if len > best {
            best = len;
            progress_at = tokio::time::Instant::now();
        }
        ensure!(
            progress_at.elapsed() < stall,
            "stream {stream} stuck at {len} of {n} messages\nrelay log:\n{}",
            work.read_log("relay.log")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every event id of `received` exactly `expected` distinct times, and per aggregate the
/// payload counters never go back (a redelivered duplicate may repeat the latest one).
fn check_complete_and_ordered(
    received: &[Received],
    expected: &HashSet<String>,
    what: &str,
) -> anyhow::Result<()> {
    let ids: HashSet<String> = received.iter().map(|m| m.id.clone()).collect();
    ensure!(
        &ids == expected,
        "{what}: {} distinct events received, {} expected; missing {:?}, unexpected {:?}",
        ids.len(),
        expected.len(),
        expected.difference(&ids).take(5).collect::<Vec<_>>(),
        ids.difference(expected).take(5).collect::<Vec<_>>()
    );
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    // `aggregate_seq` counts the subscription's own events of each aggregate: one header per
    // message, 1, 2, 3, ... in order of first arrival, also where the filter skips events.
    let mut positions: BTreeMap<&str, u64> = BTreeMap::new();
    let mut first = HashSet::new();
    for m in received {
        let seqs: Vec<&str> = m
            .headers
            .iter()
            .filter(|(k, _)| k == "aggregate_seq")
            .map(|(_, v)| v.as_str())
            .collect();
        ensure!(seqs.len() == 1, "{what}: aggregate_seq headers {seqs:?}");
        if first.insert(m.id.clone()) {
            let want = positions.entry(&m.aggregate_id).or_insert(0);
            *want += 1;
            ensure!(
                seqs[0] == want.to_string(),
                "{what}: aggregate {} event with aggregate_seq {}, expected {want}",
                m.aggregate_id,
                seqs[0]
            );
        }
        let text = std::str::from_utf8(&m.payload)?;
        let n: u64 = text
            .rsplit(':')
            .next()
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("payload {text}"))?;
        if let Some(prev) = last.insert(&m.aggregate_id, n) {
            ensure!(
                n >= prev,
                "{what}: aggregate {} got event {n} after event {prev}",
                m.aggregate_id
            );
        }
    }
    Ok(())
}

/// Writes `per_aggregate` events to each of `aggregates` aggregates, each aggregate from its
/// own task, one transaction per event: commit order within an aggregate is the counter.
async fn write_concurrently(
    pool: &sqlx::PgPool,
    prefix: &str,
    aggregates: usize,
    from: u64,
    per_aggregate: u64,
    event_type: &str,
) -> anyhow::Result<HashSet<String>> {
    let mut tasks = tokio::task::JoinSet::new();
    for a in 0..aggregates {
        let pool = pool.clone();
        let aggregate = format!("{prefix}-{a}");
        let event_type = event_type.to_owned();
        tasks.spawn(async move {
            let mut ids = Vec::new();
            for n in from..from + per_aggregate {
                let event =
                    NewEvent::new("Order", &aggregate, &event_type, format!("{aggregate}:{n}"));
                let mut tx = pool.begin().await?;
                let id = PgOutbox::default().enqueue(&mut *tx, &event).await?;
                tx.commit().await?;
                ids.push(id.to_string());
            }
            anyhow::Ok(ids)
        });
    }
    let mut all = HashSet::new();
    while let Some(r) = tasks.join_next().await {
        all.extend(r??);
    }
    Ok(all)
}

fn config(url: &str, healthy: &str, partner: &str, tag: &str, metrics_port: u16) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
connect_timeout = "2s"
[relay]
batch_size = 50
[metrics]
listen = "127.0.0.1:{metrics_port}"
refresh_interval = "200ms"

[sinks.analytics]
kind = "nats"
url = "{healthy}"
stream = "{tag}a"
destination = "unused.{{aggregate_type}}"
connect_timeout = "1s"
ack_timeout = "2s"

[sinks.partner]
kind = "nats"
url = "{partner}"
stream = "{tag}p"
destination = "{tag}p.{{aggregate_type}}"
connect_timeout = "1s"
ack_timeout = "2s"

[[subscription]]
name = "analytics"
sink = "analytics"
destination = "{tag}a.{{event_type}}"

[[subscription]]
name = "partner"
sink = "partner"
event_type = ["order.*"]
"#
    )
}

/// The "done when" of subscriptions: one sink down, the other subscription delivers
/// everything meanwhile, the outbox itself does not back up, and the down one catches up
/// with nothing lost and per-aggregate order kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_sink_holds_back_only_its_own_subscription() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let healthy = Nats::shared().await?;
    let partner = Nats::start().await?;
    let tag = format!("sub{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let work = Workdir::new()?;
    let metrics_port = free_port()?;
    let cfg = work.write_config(
        "outbox.toml",
        &config(&url, healthy.url(), partner.url(), &tag, metrics_port),
    )?;
    let cfg = cfg.to_str().context("path")?;
    let migrated = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(migrated.code == Some(0), "migrate: {}", migrated.stderr);
    ensure!(
        migrated.stdout.contains("subscription `partner`")
            && migrated.stdout.contains("outbox_sub_partner"),
        "migrate did not create the subscription tables:\n{}",
        migrated.stdout
    );
    let pool = sqlx::PgPool::connect(&url).await?;
    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;
    let healthy_client = healthy.connect().await?;
    let partner_client = partner.connect().await?;

    // Before the outage: both get their events.
    let mut orders = write_concurrently(&pool, "o", 4, 0, 5, "order.placed").await?;
    let invoices = write_concurrently(&pool, "i", 2, 0, 5, "invoice.sent").await?;
    wait_stream(
        &healthy_client,
        &format!("{tag}a"),
        30,
        Duration::from_secs(60),
        &work,
    )
    .await?;
    wait_stream(
        &partner_client,
        &format!("{tag}p"),
        20,
        Duration::from_secs(60),
        &work,
    )
    .await?;

    // The partner's broker goes away; events keep coming.
    partner.stop().await?;
    orders.extend(write_concurrently(&pool, "o", 4, 5, 30, "order.placed").await?);
    let all: HashSet<String> = orders.union(&invoices).cloned().collect();
    // The healthy subscription delivers every event while the partner is still down.
    wait_stream(
        &healthy_client,
        &format!("{tag}a"),
        all.len() as u64,
        Duration::from_secs(60),
        &work,
    )
    .await?;
    ensure!(
        !partner.is_running(),
        "the partner broker came back too early"
    );
    let main_pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'pending'")
            .fetch_one(&pool)
            .await?;
    ensure!(
        main_pending == 0,
        "{main_pending} events pending in the outbox itself: the fan-out was held back by the down sink"
    );
    let partner_pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_sub_partner WHERE state = 'pending'")
            .fetch_one(&pool)
            .await?;
    ensure!(
        partner_pending > 0,
        "the partner subscription has no backlog during its outage"
    );
    // `status` names each subscription's backlog.
    let status = work.run(&["status", "--config", cfg, "--json"]).await?;
    ensure!(status.code == Some(0), "status: {}", status.stderr);
    let status: serde_json::Value = serde_json::from_str(&status.stdout)?;
    let pending = |name: &str| status["subscriptions"][name]["pending"].as_u64();
    ensure!(
        pending("analytics") == Some(0) && pending("partner").is_some_and(|p| p > 0),
        "status --json: {status:#}"
    );
    // Metrics carry the subscription.
    let metrics = http_get(metrics_port, "/metrics").await?;
    let published_analytics = metrics.lines().find(|l| {
        l.starts_with("outbox_events_published_total{") && l.contains("subscription=\"analytics\"")
    });
    ensure!(
        published_analytics
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .is_some_and(|v| v >= all.len() as f64),
        "no per-subscription published counter for analytics in /metrics:\n{metrics}"
    );

    // The partner comes back and catches up.
    partner.restart().await?;
    let partner_client = partner.connect().await?;
    wait_stream(
        &partner_client,
        &format!("{tag}p"),
        orders.len() as u64,
        Duration::from_secs(90),
        &work,
    )
    .await?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}\n{}",
        work.read_log("relay.log")
    );

    let got_healthy = read_stream(&healthy_client, &format!("{tag}a")).await?;
    check_complete_and_ordered(&got_healthy, &all, "analytics")?;
    ensure!(
        got_healthy
            .iter()
            .all(|m| m.subject == format!("{tag}a.order.placed")
                || m.subject == format!("{tag}a.invoice.sent")),
        "the subscription's destination was not used: {}",
        got_healthy[0].subject
    );
    // The copies do not carry the outbox pipeline's `aggregate_seq` (each subscription
    // numbers its own events; a second header would reach brokers that keep both, e.g. Kafka).
    let numbered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_sub_partner WHERE headers ? 'aggregate_seq'",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(
        numbered == 0,
        "{numbered} copies carry the fan-out's aggregate_seq"
    );
    let got_partner = read_stream(&partner_client, &format!("{tag}p")).await?;
    // The filter: only order.* reached the partner.
    check_complete_and_ordered(&got_partner, &orders, "partner")?;
    Ok(())
}

/// Each subscription keeps its own dead letters: an event its sink rejects is dead-lettered
/// in that subscription only, listed and retried with `--subscription`, while the other
/// subscription delivered it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_belong_to_their_subscription() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let nats = Nats::shared().await?;
    let tag = format!("subdl{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let work = Workdir::new()?;
    // `strict` puts the aggregate id in the subject: an id with a space is not a valid NATS
    // subject, so its sink rejects that event. `lenient` uses a fixed subject.
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
[sinks.by_id]
kind = "nats"
url = "{url_nats}"
stream = "{tag}"
destination = "{tag}.by_id.{{aggregate_id}}"
[sinks.fixed]
kind = "nats"
url = "{url_nats}"
stream = "{tag}f"
destination = "{tag}f.fixed"
[[subscription]]
name = "strict"
sink = "by_id"
[[subscription]]
name = "lenient"
sink = "fixed"
"#,
            url_nats = nats.url()
        ),
    )?;
    let cfg = cfg.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = sqlx::PgPool::connect(&url).await?;
    let mut tx = pool.begin().await?;
    let poison = PgOutbox::default()
        .enqueue(
            &mut *tx,
            &NewEvent::new("Order", "bad id", "order.placed", "poison"),
        )
        .await?;
    PgOutbox::default()
        .enqueue(
            &mut *tx,
            &NewEvent::new("Order", "good", "order.placed", "fine"),
        )
        .await?;
    tx.commit().await?;
    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;
    let client = nats.connect().await?;
    // lenient: 2 events; strict: 1 (the poison one is dead-lettered).
    wait_stream(
        &client,
        &format!("{tag}f"),
        2,
        Duration::from_secs(60),
        &work,
    )
    .await?;
    wait_stream(&client, &tag, 1, Duration::from_secs(60), &work).await?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_sub_strict WHERE state = 'dead'")
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 1)
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");

    let strict = work
        .run(&[
            "dead",
            "list",
            "--config",
            cfg,
            "--subscription",
            "strict",
            "--json",
        ])
        .await?;
    ensure!(strict.code == Some(0), "dead list: {}", strict.stderr);
    ensure!(
        strict.stdout.contains(&poison.to_string()),
        "strict's dead letters do not list the poison event:\n{}",
        strict.stdout
    );
    for other in [
        vec![
            "dead",
            "list",
            "--config",
            cfg,
            "--subscription",
            "lenient",
            "--json",
        ],
        vec!["dead", "list", "--config", cfg, "--json"],
    ] {
        let out = work.run(&other).await?;
        ensure!(out.code == Some(0), "{other:?}: {}", out.stderr);
        ensure!(
            !out.stdout.contains(&poison.to_string()),
            "{other:?} lists a dead letter of another subscription:\n{}",
            out.stdout
        );
    }
    // `doctor` checks every subscription's table and sink.
    let doctor = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(
        doctor.code == Some(0)
            && doctor
                .stdout
                .contains("`strict`: table public.outbox_sub_strict readable")
            && doctor
                .stdout
                .contains("`lenient`: table public.outbox_sub_lenient readable"),
        "doctor: {}{}",
        doctor.stdout,
        doctor.stderr
    );
    sqlx::query("DROP TABLE outbox_sub_lenient")
        .execute(&pool)
        .await?;
    let doctor = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(
        doctor.code == Some(1)
            && doctor
                .stdout
                .contains("`lenient`: table public.outbox_sub_lenient")
            && doctor.stdout.contains("run `outbox migrate`"),
        "doctor with a missing subscription table: {}{}",
        doctor.stdout,
        doctor.stderr
    );
    let unknown = work
        .run(&["dead", "list", "--config", cfg, "--subscription", "nope"])
        .await?;
    unknown.assert_clear_error("no subscription named `nope`")?;
    ensure!(
        unknown.stderr.contains("strict") && unknown.stderr.contains("lenient"),
        "the error does not list the subscriptions: {}",
        unknown.stderr
    );
    Ok(())
}

/// Mistakes in `[sinks.*]` / `[[subscription]]` are refused before anything is created, with
/// the key named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_subscriptions_are_refused_naming_the_key() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let work = Workdir::new()?;
    let base = format!(
        "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sinks.files]\nkind = \"file\"\npath = \"out.jsonl\"\n[sinks.hook]\nkind = \"http\"\nurl = \"http://127.0.0.1:9/in\"\n"
    );
    let cases: &[(&str, &str)] = &[
        (
            "[[subscription]]\nname = \"a\"\nsink = \"missing\"\n",
            "subscription[0].sink: no [sinks.missing] (named sinks: files, hook)",
        ),
        (
            "[[subscription]]\nname = \"a\"\nsink = \"files\"\n[[subscription]]\nname = \"a\"\nsink = \"hook\"\n",
            "subscription[1].name: `a` is used by two subscriptions",
        ),
        (
            "[[subscription]]\nname = \"a\"\nsink = \"files\"\nevent_type = []\n",
            "subscription[0].event_type: an empty list matches no event",
        ),
        (
            "[[subscription]]\nname = \"a\"\nsink = \"files\"\naggregate_type = \"\"\n",
            "subscription[0].aggregate_type: `` matches no event",
        ),
        (
            "[[subscription]]\nname = \"Has-Dash\"\nsink = \"files\"\n",
            "subscription[0].name: `Has-Dash` must start with a lowercase letter",
        ),
        (
            "[[subscription]]\nname = \"a\"\nsink = \"hook\"\ndestination = \"x.{aggregate_id}\"\n",
            "subscription[0].destination: sink kind = \"http\" has no destination template",
        ),
        (
            "[[subscription]]\nname = \"a\"\nsink = \"files\"\nfilter = \"x\"\n",
            "unknown key `filter`",
        ),
        (
            "[sink]\nkind = \"stdout\"\n[[subscription]]\nname = \"a\"\nsink = \"files\"\n",
            "[sink] and [[subscription]] cannot be combined",
        ),
        (
            "",
            "sinks.files: named sinks are used by [[subscription]] entries",
        ),
        (
            "[relay]\nordering = \"total\"\n[[subscription]]\nname = \"a\"\nsink = \"files\"\n",
            "relay.ordering: `total` cannot hold with [[subscription]]",
        ),
        (
            "[[subscription]]\nname = \"a_name_longer_than_twenty\"\nsink = \"files\"\n",
            "subscription[0].name:",
        ),
        (
            "[sinks.other]\nkind = \"file\"\nbogus = 1\n[[subscription]]\nname = \"a\"\nsink = \"files\"\n",
            "sinks.other.bogus: unknown key `bogus`",
        ),
    ];
    for (i, (extra, needle)) in cases.iter().enumerate() {
        let cfg = work.write_config(&format!("bad{i}.toml"), &format!("{base}{extra}"))?;
        let cfg = cfg.to_str().context("path")?;
        for command in ["check-config", "migrate", "relay"] {
            let out = work.run(&[command, "--config", cfg]).await?;
            out.assert_clear_error(needle)
                .with_context(|| format!("case {i} ({command})"))?;
        }
    }
    // Nothing was created by the refused commands.
    let pool = sqlx::PgPool::connect(&url).await?;
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'outbox%'")
            .fetch_one(&pool)
            .await?;
    ensure!(
        tables == 0,
        "{tables} outbox tables exist after refused commands"
    );
    // A source kind without subscription tables says so.
    let dynamo = work.write_config(
        "dynamodb.toml",
        "[source]\nkind = \"dynamodb\"\ntable = \"app\"\nregion = \"us-east-1\"\n[sinks.files]\nkind = \"file\"\npath = \"out.jsonl\"\n[[subscription]]\nname = \"a\"\nsink = \"files\"\n",
    )?;
    let out = work
        .run(&["check-config", "--config", dynamo.to_str().context("path")?])
        .await?;
    out.assert_clear_error("[[subscription]] is not supported by source kind = \"dynamodb\"")?;
    Ok(())
}

/// The embedded default fans out too: SQLite, two file sinks, one filtered. Each subscription
/// file gets its events in per-aggregate order, and each subscription has its own table and
/// status line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_sqlite_outbox_fans_out_to_files() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let db = work.path().join("app.db");
    fan_out_to_files(
        &work,
        &format!("kind = \"sqlite\"\npath = \"{}\"", db.display()),
        Db::Sqlite(&db),
    )
    .await
}

/// The same with the PostgreSQL CDC source: the fan-out reads the outbox from the WAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_outbox_fans_out_to_files() -> anyhow::Result<()> {
    let url = Postgres::shared().await?.fresh_database().await?;
    // Slots and publications are cluster-wide: this run's own.
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let work = Workdir::new()?;
    fan_out_to_files(
        &work,
        &format!(
            "kind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\""
        ),
        Db::Postgres(&url),
    )
    .await
}

/// Where [`fan_out_to_files`] writes its events.
enum Db<'a> {
    Sqlite(&'a std::path::Path),
    Postgres(&'a str),
}

/// Two file subscriptions, one filtered, over the `[source]` given: 40 events on 3 aggregates
/// arrive in each file once, in per-aggregate order, and `status` has a line per subscription.
async fn fan_out_to_files(work: &Workdir, source: &str, db: Db<'_>) -> anyhow::Result<()> {
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
{source}
[sinks.all]
kind = "file"
path = "{}"
[sinks.paid]
kind = "file"
path = "{}"
[[subscription]]
name = "all"
sink = "all"
[[subscription]]
name = "paid"
sink = "paid"
event_type = "*.paid"
"#,
            work.path().join("all.jsonl").display(),
            work.path().join("paid.jsonl").display()
        ),
    )?;
    let cfg_arg = cfg.to_str().context("path")?;
    let migrated = work.run(&["migrate", "--config", cfg_arg]).await?;
    ensure!(migrated.code == Some(0), "migrate: {}", migrated.stderr);
    let mut events = Vec::new();
    for n in 0..40u32 {
        let event_type = if n % 4 == 0 {
            "invoice.paid"
        } else {
            "order.placed"
        };
        events.push(NewEvent::new(
            "Order",
            format!("o{}", n % 3),
            event_type,
            format!("{{\"n\":{n}}}"),
        ));
    }
    match db {
        Db::Sqlite(path) => {
            let pool = outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(path)).await?;
            outbox_sqlite::enqueue_batch(&pool, &events).await?;
        }
        Db::Postgres(url) => {
            let pool = sqlx::PgPool::connect(url).await?;
            PgOutbox::default().enqueue_batch(&pool, &events).await?;
        }
    }
    let mut relay = work.spawn_relay(&cfg, "relay.log")?;
    let lines = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(work.path().join(name))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        lines("all.jsonl").len() >= 40 && lines("paid.jsonl").len() >= 10
    })
    .await
    .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    for (file, want) in [("all.jsonl", 40), ("paid.jsonl", 10)] {
        let got = lines(file);
        ensure!(
            got.len() == want,
            "{file}: {} lines, {want} expected",
            got.len()
        );
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for m in &got {
            if file == "paid.jsonl" {
                ensure!(m["event_type"] == "invoice.paid", "{file}: {m}");
            }
            let n = m["payload"]["n"].as_u64().with_context(|| format!("{m}"))?;
            let aggregate = m["aggregate_id"]
                .as_str()
                .context("aggregate_id")?
                .to_owned();
            if let Some(prev) = last.insert(aggregate.clone(), n) {
                ensure!(n > prev, "{file}: {aggregate} got {n} after {prev}");
            }
        }
    }
    let status = work.run(&["status", "--config", cfg_arg]).await?;
    ensure!(
        status.code == Some(0)
            && status.stdout.contains("subscription all")
            && status.stdout.contains("subscription paid"),
        "status: {}{}",
        status.stdout,
        status.stderr
    );
    Ok(())
}
