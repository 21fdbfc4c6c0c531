//! The whole tool through PgBouncer in transaction pooling mode, as an operator runs it:
//! `migrate`, two relay replicas, producers, `status`, `doctor`, `why`, `dead list`, `dead
//! retry`, `dead purge`, `replay` and `retention run`, all through one PgBouncer with fewer
//! server connections than clients; every event reaches the webhook, in order per aggregate,
//! and every command's change is there once it exits. CDC with `transaction_pooling` is
//! refused with the reason. (Fan-out and capture under chaos: `pgbouncer_fanout.rs`.)

mod support;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_testkit::services::{HttpReceiver, PgBouncer, Postgres};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use support::{Workdir, terminate};

const AGGREGATES: usize = 10;
const PER_AGGREGATE: usize = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relays_producers_and_commands_work_through_pgbouncer_in_transaction_mode()
-> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let direct = pg.fresh_database().await?;
    let bouncer = PgBouncer::start(&direct, 3).await?;
    let hooks = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{}\"\ntransaction_pooling = true\n[relay]\nbatch_size = 20\nworkers = 2\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            bouncer.url(),
            hooks.url_for("/hooks/{aggregate_id}")
        ),
    )?;
    let cfg = config.to_str().context("path")?;
    // Every command runs through the pooler: each statement in an explicit transaction,
    // committed before the command reports success (crates/outbox-postgres/src/db.rs).
    work.run_ok(&["migrate", "--config", cfg]).await?;
    let again = work.run_ok(&["migrate", "--config", cfg]).await?;
    ensure!(again.contains("up to date"), "second migrate: {again}");
    // Two poison events, refused by the receiver: dead letters to retry and to purge.
    hooks.respond_when(|r| r.path.starts_with("/hooks/poison").then_some(400));

    let mut relays = [
        work.spawn_relay(&config, "relay-0.log")?,
        work.spawn_relay(&config, "relay-1.log")?,
    ];

    // Producers through PgBouncer: explicit transactions, unnamed statements.
    let options: PgConnectOptions = bouncer.url().parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(6)
        .connect_with(options.extra_float_digits(None))
        .await?;
    let outbox = outbox_postgres::PgOutbox::default().transaction_pooling(true);
    let mut producers = Vec::new();
    for a in 0..AGGREGATES {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        producers.push(tokio::spawn(async move {
            for v in 0..PER_AGGREGATE {
                let mut tx = pool.begin().await?;
                outbox
                    .enqueue(
                        &mut *tx,
                        &NewEvent::new("Order", format!("o{a}"), "order.step", v.to_string()),
                    )
                    .await?;
                tx.commit().await?;
            }
            anyhow::Ok(())
        }));
    }
    for p in producers {
        p.await??;
    }
    let mut poison = Vec::new();
    for name in ["poison-retry", "poison-purge"] {
        let mut tx = pool.begin().await?;
        poison.push(
            outbox
                .enqueue(&mut *tx, &NewEvent::new("Order", name, "order.step", "0"))
                .await?,
        );
        tx.commit().await?;
    }
    let total = AGGREGATES * PER_AGGREGATE;
    let got = hooks
        .wait_until("every event", Duration::from_secs(120), |r| {
            r.iter()
                .filter(|r| r.accepted() && !r.path.contains("poison"))
                .count()
                >= total
        })
        .await
        .with_context(|| {
            format!(
                "{}\n{}",
                work.read_log("relay-0.log"),
                work.read_log("relay-1.log")
            )
        })?;
    let mut last: HashMap<String, i64> = HashMap::new();
    for r in got
        .iter()
        .filter(|r| r.method == "POST" && !r.path.contains("poison"))
    {
        let agg = r.path.trim_start_matches("/hooks/").to_owned();
        let v: i64 = std::str::from_utf8(&r.body)?.parse()?;
        let before = last.insert(agg.clone(), v).unwrap_or(-1);
        ensure!(v == before + 1, "{agg}: v{v} after v{before}");
    }

    work.run_ok(&["status", "--config", cfg]).await?;
    let direct_pool = sqlx::PgPool::connect(&direct).await?;
    let states = || async {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT state, count(*) FROM outbox GROUP BY state ORDER BY state")
                .fetch_all(&direct_pool)
                .await?;
        anyhow::Ok(rows)
    };
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        states()
            .await
            .is_ok_and(|s| s.contains(&("dead".to_owned(), 2)))
    })
    .await
    .context("both poison events dead-lettered")?;
    let story = work
        .run_ok(&["why", "--config", cfg, &poison[0].to_string()])
        .await?;
    ensure!(story.contains("dead"), "why of a dead letter: {story}");
    let listed = work.run_ok(&["dead", "list", "--config", cfg]).await?;
    ensure!(
        poison.iter().all(|id| listed.contains(&id.to_string())),
        "dead list: {listed}"
    );

    // `dead retry`: the receiver now takes it; the relays deliver it.
    hooks.reset_script();
    hooks.respond_when(|r| (r.path == "/hooks/poison-purge").then_some(400));
    work.run_ok(&["dead", "retry", "--config", cfg, &poison[0].to_string()])
        .await?;
    hooks
        .wait_until("the retried dead letter", Duration::from_secs(60), |r| {
            r.iter()
                .any(|r| r.path == "/hooks/poison-retry" && r.accepted())
        })
        .await?;
    // `dead purge`: the other one is gone once the command exits.
    work.run_ok(&[
        "dead",
        "purge",
        "--config",
        cfg,
        "--older-than",
        "0s",
        "--yes",
    ])
    .await?;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'dead'")
        .fetch_one(&direct_pool)
        .await?;
    ensure!(dead == 0, "{dead} dead letter(s) left after `dead purge`");

    // `replay`: o0's events are published again, in order.
    let before = hooks
        .received()
        .iter()
        .filter(|r| r.path == "/hooks/o0" && r.accepted())
        .count();
    work.run_ok(&[
        "replay",
        "--config",
        cfg,
        "--since",
        "1h",
        "--aggregate",
        "o0",
        "--yes",
    ])
    .await?;
    let replayed = hooks
        .wait_until("o0 replayed", Duration::from_secs(60), |r| {
            r.iter()
                .filter(|r| r.path == "/hooks/o0" && r.accepted())
                .count()
                >= before + PER_AGGREGATE
        })
        .await?;
    let again: Vec<i64> = replayed
        .iter()
        .filter(|r| r.path == "/hooks/o0" && r.accepted())
        .skip(before)
        .map(|r| std::str::from_utf8(&r.body).map(|b| b.parse::<i64>()))
        .collect::<Result<Result<_, _>, _>>()??;
    ensure!(
        again == (0..PER_AGGREGATE as i64).collect::<Vec<_>>(),
        "replayed out of order: {again:?}"
    );

    // `retention run`: every delivered row is gone once it exits.
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        states()
            .await
            .is_ok_and(|s| s.iter().all(|(state, _)| state == "delivered"))
    })
    .await
    .context("everything delivered before retention")?;
    work.run_ok(&["retention", "run", "--config", cfg, "--older-than", "0s"])
        .await?;
    let left = states().await?;
    ensure!(left.is_empty(), "rows left after `retention run`: {left:?}");
    work.run_ok(&["status", "--config", cfg]).await?;
    work.run_ok(&["doctor", "--config", cfg]).await?;

    for (i, r) in relays.iter_mut().enumerate() {
        let code = terminate(r, Duration::from_secs(30)).await?;
        ensure!(
            code == Some(0),
            "relay {i}: {code:?}\n{}",
            work.read_log(&format!("relay-{i}.log"))
        );
    }
    for i in 0..2 {
        let log = work.read_log(&format!("relay-{i}.log"));
        ensure!(
            !log.contains("prepared statement"),
            "relay {i} met a prepared-statement error:\n{log}"
        );
    }

    let cdc = work.write_config(
        "cdc.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{}\"\nmode = \"cdc\"\ntransaction_pooling = true\n",
            bouncer.url()
        ),
    )?;
    work.run(&["check-config", "--config", cdc.to_str().context("path")?])
        .await?
        .assert_clear_error("replication connection")?;
    Ok(())
}
