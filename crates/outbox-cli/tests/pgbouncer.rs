//! The whole tool through PgBouncer in transaction pooling mode, as an operator runs it:
//! `migrate`, two relay replicas, producers, `status` and `doctor`, all through one PgBouncer
//! with fewer server connections than clients; every event reaches the webhook, in order per
//! aggregate. CDC with `transaction_pooling` is refused with the reason.

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
    // A command that writes refuses the pooler and says how to run it directly.
    work.run(&["migrate", "--config", cfg])
        .await?
        .assert_clear_error("OUTBOX_SOURCE__TRANSACTION_POOLING=false")?;
    let out = work
        .command(&["migrate", "--config", cfg, "--database-url", &direct])
        .env("OUTBOX_SOURCE__TRANSACTION_POOLING", "false")
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "migrate against PostgreSQL itself: {out:?}"
    );

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
    let total = AGGREGATES * PER_AGGREGATE;
    let got = hooks
        .wait_until("every event", Duration::from_secs(120), |r| {
            r.iter().filter(|r| r.method == "POST").count() >= total
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
    for r in got.iter().filter(|r| r.method == "POST") {
        let agg = r.path.trim_start_matches("/hooks/").to_owned();
        let v: i64 = std::str::from_utf8(&r.body)?.parse()?;
        let before = last.insert(agg.clone(), v).unwrap_or(-1);
        ensure!(v == before + 1, "{agg}: v{v} after v{before}");
    }

    for args in [
        vec!["status", "--config", cfg],
        vec!["doctor", "--config", cfg],
    ] {
        let out = work.run(&args).await?;
        ensure!(
            out.code == Some(0),
            "`outbox {}` through PgBouncer: {out:?}",
            args[0]
        );
    }
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
