//! `kind = "mysql"` through the binary, against a real MariaDB and a real NATS JetStream:
//!
//! - the guarantees under `kill -9`: two relay processes claiming one outbox, one SIGKILLed
//!   and restarted over and over, while producers write **overlapping** transactions for the
//!   same aggregates (some writing the outbox row before they lock their business row, some
//!   rolled back): every committed event reaches JetStream, no rolled-back one does, and each
//!   aggregate's events arrive in the order their transactions committed (a business counter
//!   per aggregate, bumped in the same transaction, is the oracle);
//! - bad input: an unreachable server and a wrong URL scheme are one clear error line, no
//!   password printed.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_mysql::MySqlOutbox;
use outbox_testkit::services::{MariaDb, Nats};
use rand::Rng;
use sqlx::MySqlPool;
use support::{Workdir, read_stream, terminate};
use uuid::Uuid;

/// Waits until no event is pending in the outbox. Fails only when the backlog stops
/// shrinking for `stall` (a busy machine drains slower, not never).
async fn wait_drained(pool: &MySqlPool, stall: Duration) -> anyhow::Result<()> {
    let mut lowest = i64::MAX;
    let mut progress_at = tokio::time::Instant::now();
    loop {
        let pending: Option<i64> =
            sqlx::query_scalar("SELECT COUNT(*) FROM outbox WHERE state = 'pending'")
                .fetch_one(pool)
                .await
                .ok();
        match pending {
            Some(0) => return Ok(()),
            Some(n) if n < lowest => {
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

/// What the producers did: per aggregate, (commit-order counter value, event id); and the
/// ids of rolled-back events.
#[derive(Default)]
struct Written {
    committed: Vec<(String, i64, Uuid)>,
    rolled_back: Vec<Uuid>,
}

async fn produce(pool: MySqlPool, producer: usize) -> anyhow::Result<Written> {
    let outbox = MySqlOutbox::default();
    let mut out = Written::default();
    for t in 0..120 {
        let (agg, outbox_first, hold, rollback) = {
            let mut rng = rand::rng();
            (
                // Six aggregates shared by every producer: transactions overlap.
                format!("a{}", rng.random_range(0..6)),
                rng.random_bool(0.5),
                Duration::from_micros(rng.random_range(0..1500)),
                (t + producer) % 11 == 3,
            )
        };
        let event = NewEvent::new(
            "Order",
            agg.clone(),
            "order.changed",
            format!("p{producer}"),
        );
        if rollback {
            // As an application would: a transaction InnoDB picked as a deadlock victim is run
            // again (here: written again, then rolled back on purpose).
            let id = loop {
                let mut tx = pool.begin().await?;
                match outbox.enqueue(&mut tx, &event).await {
                    Ok(id) => {
                        tokio::time::sleep(hold).await;
                        tx.rollback().await?;
                        break id;
                    }
                    Err(e)
                        if e.to_string().contains("1213") || format!("{e:?}").contains("1213") =>
                    {
                        tracing::info!("producer deadlock victim; writing again");
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            out.rolled_back.push(id);
        } else {
            let (id, n) = outbox_testkit::oracle::mysql_write_counted(
                &pool,
                "`outbox`",
                &event,
                outbox_first,
                hold,
            )
            .await?;
            out.committed.push((agg, n, id));
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_mysql_relays_lose_nothing_invent_nothing_and_keep_commit_order()
-> anyhow::Result<()> {
    sigkill_scenario("").await
}

/// The same with the lease-token claim (for servers without `SKIP LOCKED`): a killed relay's
/// rows come back when its lease (`claim_timeout`) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_mysql_relays_with_the_lease_claim_keep_every_guarantee() -> anyhow::Result<()> {
    sigkill_scenario("claim = \"lease\"\nclaim_timeout = \"3s\"\n").await
}

/// Binlog CDC: one relay streams, the other stands by on the stream's lock; `kill -9` of the
/// streaming relay frees the lock (the server closes its session) and the standby resumes at
/// the kept position, publishing the unconfirmed tail again (duplicates, never loss).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_mysql_cdc_relays_lose_nothing_invent_nothing_and_keep_commit_order()
-> anyhow::Result<()> {
    sigkill_scenario("mode = \"cdc\"\nclaim_timeout = \"5s\"\n").await
}

/// Waits until JetStream holds every committed event (CDC rows stay `pending`, so the
/// table cannot say). Fails only when nothing new arrives for `stall`.
async fn wait_published(
    client: &async_nats::Client,
    stream: &str,
    committed: &HashSet<String>,
    stall: Duration,
) -> anyhow::Result<()> {
    let mut best = 0;
    let mut progress_at = tokio::time::Instant::now();
    loop {
        let seen: HashSet<String> = read_stream(client, stream)
            .await
            .map(|r| r.into_iter().map(|m| m.id).collect())
            .unwrap_or_default();
        let have = committed.intersection(&seen).count();
        if have == committed.len() {
            return Ok(());
        }
        if have > best {
            best = have;
            progress_at = tokio::time::Instant::now();
        }
        ensure!(
            progress_at.elapsed() < stall,
            "{} of {} committed events published, none more for {stall:?}",
            best,
            committed.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn sigkill_scenario(source_extra: &str) -> anyhow::Result<()> {
    let cdc = source_extra.contains("cdc");
    outbox_testkit::init_tracing();
    let url = MariaDb::shared().await?.fresh_database().await?;
    let nats = Nats::shared().await?;
    let tag = format!("mysqlcrash{}", Uuid::new_v4().simple());
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "mysql"
url = "{url}"
{source_extra}
[relay]
batch_size = 40
workers = 2
poll_interval = "2ms"
publish_timeout = "2s"
[sink]
kind = "nats"
url = "{nats}"
destination = "{tag}.{{aggregate_id}}"
stream = "{tag}"
"#,
            nats = nats.url()
        ),
    )?;
    let migrate = work
        .run(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    ensure!(migrate.code == Some(0), "migrate failed: {migrate:?}");
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(16)
        .connect(&url)
        .await?;

    let mut relays = [
        work.spawn_relay(&config, "relay-0.log")?,
        work.spawn_relay(&config, "relay-1.log")?,
    ];
    let producers: Vec<_> = (0..4)
        .map(|p| tokio::spawn(produce(pool.clone(), p)))
        .collect();
    // Meanwhile: SIGKILL a random relay every 100-300 ms and start a new one in its place.
    for k in 0..12 {
        let pause = rand::rng().random_range(100..300);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        // CDC: alternate, so that the streaming relay is killed again and again.
        let victim = if cdc {
            k % relays.len()
        } else {
            rand::rng().random_range(0..relays.len())
        };
        relays[victim].start_kill()?;
        relays[victim].wait().await?;
        work.append_log(&format!("relay-{victim}.log"), support::RESTART_MARKER)?;
        relays[victim] = work.spawn_relay(&config, &format!("relay-{victim}.log"))?;
        tracing::info!(kill = k, victim, "relay killed and restarted");
    }
    let mut written = Written::default();
    for p in producers {
        let w = p.await??;
        written.committed.extend(w.committed);
        written.rolled_back.extend(w.rolled_back);
    }
    let client = nats.connect().await?;
    let drained = if cdc {
        let committed: HashSet<String> = written
            .committed
            .iter()
            .map(|(_, _, id)| id.to_string())
            .collect();
        wait_published(&client, &tag, &committed, Duration::from_secs(60)).await
    } else {
        wait_drained(&pool, Duration::from_secs(60)).await
    };
    drained.with_context(|| {
        format!(
            "relay logs:\n{}\n{}",
            work.read_log("relay-0.log"),
            work.read_log("relay-1.log")
        )
    })?;
    support::stop_restarted_relays(&work, &mut relays).await?;

    if cdc {
        let logs = format!(
            "{}{}",
            work.read_log("relay-0.log"),
            work.read_log("relay-1.log")
        );
        let takeovers = logs.matches("streaming the outbox from the binlog").count();
        ensure!(
            takeovers >= 2,
            "the stream was never taken over after a kill ({takeovers} starts):\n{logs}"
        );
    }
    let received = read_stream(&client, &tag).await?;
    let mut seen = HashSet::new();
    let mut by_aggregate: HashMap<String, Vec<String>> = HashMap::new();
    for m in &received {
        if seen.insert(m.id.clone()) {
            by_aggregate
                .entry(m.aggregate_id.clone())
                .or_default()
                .push(m.id.clone());
        }
    }
    // Lost: none. Phantom: none.
    let committed: HashSet<String> = written
        .committed
        .iter()
        .map(|(_, _, id)| id.to_string())
        .collect();
    let lost: Vec<_> = committed.difference(&seen).collect();
    ensure!(
        lost.is_empty(),
        "{} committed events never published: {lost:?}",
        lost.len()
    );
    let phantoms: Vec<_> = written
        .rolled_back
        .iter()
        .filter(|id| seen.contains(&id.to_string()))
        .collect();
    ensure!(
        phantoms.is_empty(),
        "rolled-back events were published: {phantoms:?}"
    );
    ensure!(
        seen.len() == committed.len(),
        "{} distinct events in JetStream, {} committed",
        seen.len(),
        committed.len()
    );
    // Order: per aggregate, the counter's commit order.
    let mut expected: HashMap<String, Vec<(i64, String)>> = HashMap::new();
    for (agg, n, id) in &written.committed {
        expected
            .entry(agg.clone())
            .or_default()
            .push((*n, id.to_string()));
    }
    let mut disorder = 0;
    for (agg, mut ids) in expected {
        ids.sort_unstable();
        let want: Vec<String> = ids.into_iter().map(|(_, id)| id).collect();
        if by_aggregate.get(&agg) != Some(&want) {
            disorder += 1;
            tracing::error!(%agg, ?want, got = ?by_aggregate.get(&agg), "out of commit order");
        }
    }
    ensure!(
        disorder == 0,
        "{disorder} aggregate(s) reached JetStream out of commit order"
    );
    Ok(())
}

#[tokio::test]
async fn a_bad_mysql_url_is_one_clear_error_without_the_password() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let down = work.write_config(
        "down.toml",
        &format!(
            "[source]\nkind = \"mysql\"\nurl = \"mysql://app:Sup3r%40Secret@127.0.0.1:{port}/app\"\nconnect_timeout = \"2s\"\n"
        ),
    )?;
    for command in ["migrate", "status", "relay"] {
        let out = work
            .run(&[command, "--config", down.to_str().context("path")?])
            .await?;
        out.assert_clear_error("cannot connect to MySQL")?;
        ensure!(
            !out.stderr.contains("Sup3r") && !out.stdout.contains("Sup3r"),
            "{command} printed the password: {out:?}"
        );
    }
    let scheme = work.write_config(
        "scheme.toml",
        "[source]\nkind = \"mysql\"\nurl = \"postgres://app:Sup3r@127.0.0.1/app\"\n",
    )?;
    let out = work
        .run(&["check-config", "--config", scheme.to_str().context("path")?])
        .await?;
    out.assert_clear_error("source.url")?;
    ensure!(!out.stderr.contains("Sup3r"), "{out:?}");
    // A user without SUPER on a server with binary logging: `migrate` says what to do.
    let admin_url = MariaDb::shared().await?.fresh_database().await?;
    let (base, database) = admin_url.rsplit_once('/').context("database in url")?;
    let admin = sqlx::MySqlPool::connect(&admin_url).await?;
    let user = format!("app_{}", &database[database.len() - 8..]);
    // Built here from hex digits and constants.
    for sql in [
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"),
        format!("GRANT ALL ON {database}.* TO '{user}'@'%'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await?;
    }
    let host = base.trim_start_matches("mysql://root@");
    let unprivileged = work.write_config(
        "unprivileged.toml",
        &format!("[source]\nkind = \"mysql\"\nurl = \"mysql://{user}:pw@{host}/{database}\"\n"),
    )?;
    let out = work
        .run(&[
            "migrate",
            "--config",
            unprivileged.to_str().context("path")?,
        ])
        .await?;
    out.assert_clear_error("SUPER")?;
    ensure!(
        out.stderr.contains("log_bin_trust_function_creators"),
        "{out:?}"
    );
    // A relay user that may only read: doctor names what is missing and exits non-zero.
    outbox_mysql::migrate(&admin, &outbox_core::Identifier::new("outbox")?).await?;
    let reader = format!("ro_{}", &database[database.len() - 8..]);
    for sql in [
        format!("CREATE USER '{reader}'@'%' IDENTIFIED BY 'pw'"),
        format!("GRANT SELECT ON {database}.* TO '{reader}'@'%'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await?;
    }
    let read_only = work.write_config(
        "read_only.toml",
        &format!("[source]\nkind = \"mysql\"\nurl = \"mysql://{reader}:pw@{host}/{database}\"\n[sink]\nkind = \"stdout\"\n"),
    )?;
    let out = work
        .run(&["doctor", "--config", read_only.to_str().context("path")?])
        .await?;
    ensure!(
        out.code != Some(0),
        "doctor passed a read-only relay user: {out:?}"
    );
    ensure!(
        out.stdout.contains("privileges") && out.stdout.contains("lacks UPDATE, DELETE"),
        "{out:?}"
    );
    // With every grant the same check is green.
    let out = work
        .run(&["doctor", "--config", unprivileged.to_str().context("path")?])
        .await?;
    ensure!(
        out.stdout.contains("SELECT, UPDATE, DELETE on outbox"),
        "{out:?}"
    );
    let cdc = work.write_config(
        "cdc.toml",
        "[source]\nkind = \"mysql\"\nurl = \"mysql://app@127.0.0.1/app\"\nmode = \"cdc\"\nserver_id = 0\n",
    )?;
    let out = work
        .run(&["check-config", "--config", cdc.to_str().context("path")?])
        .await?;
    out.assert_clear_error("source.server_id")?;
    Ok(())
}

/// CDC on a server whose binlog is not row-based: `migrate` refuses, names the setting, and
/// creates nothing; `doctor` is red on the same setting.
#[tokio::test]
async fn cdc_without_a_row_binlog_is_refused_naming_the_setting() -> anyhow::Result<()> {
    let server = MariaDb::start().await?;
    let url = server.fresh_database().await?;
    let pool = MySqlPool::connect(&url).await?;
    sqlx::raw_sql("SET GLOBAL binlog_format = 'STATEMENT'")
        .execute(&pool)
        .await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "cdc.toml",
        &format!("[source]\nkind = \"mysql\"\nurl = \"{url}\"\nmode = \"cdc\"\n[sink]\nkind = \"stdout\"\n"),
    )?;
    let cfg = config.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    out.assert_clear_error("binlog_format is STATEMENT")?;
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()",
    )
    .fetch_one(&pool)
    .await?;
    ensure!(tables == 0, "a refused migrate created {tables} table(s)");
    let out = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(
        out.code != Some(0)
            && out
                .stdout
                .lines()
                .any(|l| l.contains("RED") && l.contains("binlog_format is STATEMENT")),
        "doctor: {out:?}"
    );
    Ok(())
}

/// The operator commands in CDC mode, as a user runs them: `migrate` says where the stream
/// starts, `doctor` checks the binlog settings and the kept position, `status` shows the kept
/// position against the server's binlog head once a relay has moved it, and `replay` is
/// refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_mode_commands_say_where_the_stream_stands() -> anyhow::Result<()> {
    let url = MariaDb::shared().await?.fresh_database().await?;
    let hooks = outbox_testkit::services::HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "cdc.toml",
        &format!(
            "[source]\nkind = \"mysql\"\nurl = \"{url}\"\nmode = \"cdc\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            hooks.url_for("/in")
        ),
    )?;
    let cfg = config.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "migrate: {out:?}");
    ensure!(
        out.stdout
            .contains("CDC: the binlog stream starts at binlog."),
        "migrate says where the stream starts: {}",
        out.stdout
    );
    let again = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(
        again.code == Some(0) && again.stdout.contains("resumes at"),
        "a second migrate keeps the position: {again:?}"
    );
    let out = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "doctor: {out:?}");
    for needle in [
        "log_bin ON, binlog_format ROW, binlog_row_image FULL",
        "acknowledged",
    ] {
        ensure!(
            out.stdout.contains(needle),
            "doctor lacks `{needle}`: {}",
            out.stdout
        );
    }
    // A relay streams three events; status then shows the position it kept.
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let pool = MySqlPool::connect(&url).await?;
    let outbox = MySqlOutbox::default();
    for i in 0..3 {
        let mut tx = pool.begin().await?;
        outbox
            .enqueue(
                &mut tx,
                &NewEvent::new("Order", "o1", "order.step", format!("{i}")),
            )
            .await?;
        tx.commit().await?;
    }
    hooks
        .wait_until("three events streamed", Duration::from_secs(30), |reqs| {
            reqs.iter().filter(|r| r.accepted()).count() >= 3
        })
        .await
        .with_context(|| work.read_log("relay.log"))?;
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    let out = work.run(&["status", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "status: {out:?}");
    for needle in ["binlog position", "binlog head"] {
        ensure!(
            out.stdout.contains(needle),
            "status lacks `{needle}`: {}",
            out.stdout
        );
    }
    // A relay user without replication privileges: doctor is red and says which.
    let (base, database) = url.rsplit_once('/').context("database in url")?;
    let user = format!("norepl_{}", &database[database.len() - 8..]);
    // Built from hex digits and constants.
    for sql in [
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"),
        format!("GRANT ALL ON {database}.* TO '{user}'@'%'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await?;
    }
    let host = base.trim_start_matches("mysql://root@");
    let norepl = work.write_config(
        "norepl.toml",
        &format!(
            "[source]\nkind = \"mysql\"\nurl = \"mysql://{user}:pw@{host}/{database}\"\nmode = \"cdc\"\n[sink]\nkind = \"stdout\"\n"
        ),
    )?;
    let out = work
        .run(&["doctor", "--config", norepl.to_str().context("path")?])
        .await?;
    ensure!(
        out.code != Some(0),
        "doctor without replication privileges: {out:?}"
    );
    ensure!(
        out.stdout
            .lines()
            .any(|l| l.contains("RED") && l.contains("replication")),
        "doctor names the missing privilege: {}",
        out.stdout
    );
    let out = work
        .run(&["replay", "--config", cfg, "--since", "1h", "--yes"])
        .await?;
    out.assert_clear_error("replay")?;
    ensure!(
        out.stderr.contains("CDC"),
        "replay's refusal names the reason: {}",
        out.stderr
    );
    Ok(())
}
