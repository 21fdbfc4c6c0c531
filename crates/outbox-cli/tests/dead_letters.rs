//! `outbox dead`: a poison event is listed and shown with its reason; retrying it delivers it
//! and then the events that waited behind it, in aggregate order; purge asks first.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use support::{Workdir, terminate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_is_listed_retried_in_aggregate_order_and_purged() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    hooks.reject_when_header("outbox-poison", "1", 422);
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = sqlx::PgPool::connect(&url).await?;
    for (n, headers) in [(1, r#"{"poison":"1"}"#), (2, "{}"), (3, "{}")] {
        sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Order', 'o1', 'order.changed', convert_to($1, 'UTF8'), $2::jsonb)")
            .bind(n.to_string())
            .bind(headers)
            .execute(&pool)
            .await?;
    }
    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'dead'")
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 1)
    })
    .await
    .context("the poison event was not dead-lettered")?;

    let list = work
        .run(&["dead", "list", "--config", cfg, "--json"])
        .await?;
    ensure!(list.code == Some(0), "{list:?}");
    let list: serde_json::Value = serde_json::from_str(&list.stdout)?;
    ensure!(list.as_array().is_some_and(|a| a.len() == 1), "{list}");
    let id = list[0]["id"].as_str().context("id")?.to_owned();
    ensure!(
        list[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("422")),
        "{list}"
    );
    let show = work.run(&["dead", "show", &id, "--config", cfg]).await?;
    ensure!(
        show.code == Some(0)
            && show.stdout.contains("payload      1")
            && show.stdout.contains("422"),
        "{show:?}"
    );
    ensure!(
        hooks
            .received()
            .iter()
            .filter(|r| r.accepted() && r.method == "POST")
            .count()
            == 0,
        "events behind the dead letter were delivered"
    );

    // The receiver is fixed; put the dead letter back in line.
    hooks.reset_script();
    let retry = work.run(&["dead", "retry", &id, "--config", cfg]).await?;
    ensure!(
        retry.code == Some(0) && retry.stdout.contains("1 dead letter(s) put back"),
        "{retry:?}"
    );
    let accepted = hooks
        .wait_until("three deliveries", Duration::from_secs(30), |reqs| {
            reqs.iter()
                .filter(|r| r.accepted() && r.method == "POST")
                .count()
                == 3
        })
        .await?;
    let bodies: Vec<String> = accepted
        .iter()
        .filter(|r| r.accepted() && r.method == "POST")
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    ensure!(
        bodies == ["1", "2", "3"],
        "aggregate order broken after retry: {bodies:?}"
    );

    // Purge: refuses without a terminal or --yes, then deletes with --yes.
    sqlx::query("UPDATE outbox SET state = 'dead', dead_lettered_at = now() - interval '2 days' WHERE payload = '3'")
        .execute(&pool)
        .await?;
    let refused = work
        .run(&["dead", "purge", "--older-than", "1d", "--config", cfg])
        .await?;
    refused.assert_clear_error("--yes")?;
    let purged = work
        .run(&[
            "dead",
            "purge",
            "--older-than",
            "1d",
            "--yes",
            "--config",
            cfg,
        ])
        .await?;
    ensure!(
        purged.code == Some(0) && purged.stdout.contains("1 dead letter(s) deleted"),
        "{purged:?}"
    );
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&pool)
        .await?;
    ensure!(left == 2, "purge removed the wrong rows: {left} left");
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    Ok(())
}
