//! Guarantee 1 across outages: the broker or the database goes away while the relay runs,
//! then comes back; nothing is lost, no attempt is burned, and the relay recovers on its own.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::NewEvent;
use outbox_postgres::PgOutbox;
use outbox_testkit::services::{Nats, Postgres};
use support::{Workdir, read_stream, terminate, wait_drained};

fn config(url: &str, nats: &str, tag: &str) -> String {
    format!(
        r#"
[source]
kind = "postgres"
url = "{url}"
connect_timeout = "2s"
[relay]
batch_size = 20
[sink]
kind = "nats"
url = "{nats}"
destination = "{tag}.{{aggregate_type}}"
stream = "{tag}"
connect_timeout = "1s"
ack_timeout = "2s"
"#
    )
}

async fn write(pool: &sqlx::PgPool, n: usize, prefix: &str) -> anyhow::Result<()> {
    let events: Vec<NewEvent> = (0..n)
        .map(|i| {
            NewEvent::new(
                "Order",
                format!("{prefix}-{}", i % 5),
                "order.changed",
                format!("{prefix}:{i}"),
            )
        })
        .collect();
    let mut tx = pool.begin().await?;
    PgOutbox::default().enqueue_batch(&mut *tx, &events).await?;
    tx.commit().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_outage_loses_nothing_and_burns_no_attempt() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let nats = Nats::start().await?;
    let tag = format!("outage{}", uuid::Uuid::new_v4().simple());
    let work = Workdir::new()?;
    let cfg = work.write_config("outbox.toml", &config(&url, nats.url(), &tag))?;
    let cfg = cfg.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = sqlx::PgPool::connect(&url).await?;
    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;

    write(&pool, 30, "before").await?;
    wait_drained(&pool, Duration::from_secs(30)).await?;
    nats.stop().await?;
    write(&pool, 50, "during").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (pending, attempted): (i64, i64) =
        sqlx::query_as("SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE attempts > 0) FROM outbox")
            .fetch_one(&pool)
            .await?;
    ensure!(
        pending == 50,
        "{pending} pending during the outage, expected 50"
    );
    ensure!(
        attempted == 0,
        "{attempted} events had attempts counted while the broker was down"
    );
    nats.restart().await?;
    wait_drained(&pool, Duration::from_secs(60))
        .await
        .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    let received = read_stream(&nats.connect().await?, &tag).await?;
    let ids: std::collections::HashSet<_> = received.iter().map(|m| m.id.clone()).collect();
    ensure!(
        ids.len() == 80,
        "{} distinct events reached JetStream, expected 80",
        ids.len()
    );
    ensure!(
        work.read_log("relay.log").contains("broker unavailable"),
        "the outage was not logged"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_restart_is_waited_out_and_nothing_is_lost() -> anyhow::Result<()> {
    let pg = Postgres::start_private().await?;
    let url = pg.fresh_database().await?;
    let nats = Nats::shared().await?;
    let tag = format!("dbdown{}", uuid::Uuid::new_v4().simple());
    let work = Workdir::new()?;
    let cfg = work.write_config("outbox.toml", &config(&url, nats.url(), &tag))?;
    let cfg = cfg.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;
    {
        let pool = sqlx::PgPool::connect(&url).await?;
        write(&pool, 20, "first").await?;
        wait_drained(&pool, Duration::from_secs(30)).await?;
        pool.close().await;
    }
    pg.stop().await?;
    // Longer than connect_timeout (2s): the relay's connection attempts fail and it says so.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    ensure!(
        relay.try_wait()?.is_none(),
        "relay exited while the database was down:\n{}",
        work.read_log("relay.log")
    );
    pg.restart().await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    write(&pool, 20, "second").await?;
    wait_drained(&pool, Duration::from_secs(60))
        .await
        .with_context(|| work.read_log("relay.log"))?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "relay exit {code:?}");
    let received = read_stream(&nats.connect().await?, &tag).await?;
    let ids: std::collections::HashSet<_> = received.iter().map(|m| m.id.clone()).collect();
    ensure!(
        ids.len() == 40,
        "{} distinct events reached JetStream, expected 40",
        ids.len()
    );
    let log = work.read_log("relay.log");
    ensure!(
        log.contains("database unavailable"),
        "the outage was not logged:\n{log}"
    );
    Ok(())
}
