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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_show_lists_every_attempts_error_keeping_the_last_ten() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    hooks.reject_when_header("outbox-poison", "1", 503);
    let work = Workdir::new()?;
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[relay]\nmax_attempts = 12\nbackoff = {{ initial = \"1ms\", max = \"2ms\", jitter = 0.0 }}\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let pool = sqlx::PgPool::connect(&url).await?;
    let id: uuid::Uuid = sqlx::query_scalar("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Order', 'o1', 'order.poison', 'p', '{\"poison\":\"1\"}') RETURNING id")
        .fetch_one(&pool)
        .await?;
    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .is_ok_and(|s| s == "dead")
    })
    .await
    .context("the event was not dead-lettered")?;

    let json = work
        .run(&["dead", "show", &id.to_string(), "--json", "--config", cfg])
        .await?;
    ensure!(json.code == Some(0), "{json:?}");
    let v: serde_json::Value = serde_json::from_str(&json.stdout)?;
    let history = v["attempt_errors"].as_array().context("attempt_errors")?;
    let attempts: Vec<i64> = history
        .iter()
        .filter_map(|a| a["attempt"].as_i64())
        .collect();
    ensure!(
        attempts == (3..=12).collect::<Vec<_>>(),
        "not the last ten: {v}"
    );
    ensure!(
        history[..9].iter().all(|a| a["kind"] == "retry") && history[9]["kind"] == "dead",
        "{v}"
    );
    ensure!(
        history
            .iter()
            .all(|a| a["error"].as_str().is_some_and(|e| e.contains("503"))),
        "{v}"
    );
    let text = work
        .run(&["dead", "show", &id.to_string(), "--config", cfg])
        .await?;
    ensure!(
        text.stdout.contains("#12")
            && text.stdout.contains("#3 ")
            && !text.stdout.contains("#2 ")
            && text.stdout.contains("earlier attempts not kept")
            && text.stdout.contains("payload      p"),
        "{}",
        text.stdout
    );

    // Retry by type once the receiver is fixed: delivered.
    hooks.reset_script();
    let retry = work
        .run(&["dead", "retry", "--type", "order.poison", "--config", cfg])
        .await?;
    ensure!(
        retry.code == Some(0) && retry.stdout.contains("1 dead letter(s) put back"),
        "{retry:?}"
    );
    hooks
        .wait_until(
            "the retried event delivered",
            Duration::from_secs(30),
            |reqs| reqs.iter().any(|r| r.accepted() && r.method == "POST"),
        )
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .is_ok_and(|s| s == "delivered")
    })
    .await
    .context("the retried event was not recorded as delivered")?;
    // The history tells the requeue.
    let json = work
        .run(&["dead", "show", &id.to_string(), "--json", "--config", cfg])
        .await?;
    let v: serde_json::Value = serde_json::from_str(&json.stdout)?;
    let last = v["attempt_errors"]
        .as_array()
        .and_then(|a| a.last())
        .context("history")?;
    ensure!(
        last["kind"] == "requeued" && last["attempt"] == 12 && v["state"] == "delivered",
        "{v}"
    );
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_dead_letters_are_listed_shown_retried_in_order_and_purged() -> anyhow::Result<()> {
    let hooks = HttpReceiver::start().await?;
    hooks.reject_when_header("outbox-poison", "1", 422);
    let work = Workdir::new()?;
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"outbox.db\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    ensure!(work.run(&["migrate", "--config", cfg]).await?.code == Some(0));
    let db = format!("sqlite://{}", work.path().join("outbox.db").display());
    let pool = sqlx::SqlitePool::connect(&db).await?;
    for (n, headers) in [(1, r#"{"poison":"1"}"#), (2, "{}")] {
        sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Order', 'o1', 'order.changed', ?1, ?2)")
            .bind(n.to_string())
            .bind(headers)
            .execute(&pool)
            .await?;
    }
    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'dead'")
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 1)
    })
    .await
    .context("the poison event was not dead-lettered")?;

    let list = work
        .run(&["dead", "list", "--json", "--config", cfg])
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
            && show.stdout.contains("state        dead")
            && show.stdout.contains("last error")
            && show.stdout.contains("422")
            && show.stdout.contains("payload      1"),
        "{show:?}"
    );
    let why = work.run(&["why", &id, "--config", cfg]).await?;
    ensure!(
        why.code == Some(0) && why.stdout.contains("dead-lettered at"),
        "{why:?}"
    );
    // The event behind it waits for it, and `why` names it.
    let behind: String = sqlx::query_scalar("SELECT id FROM outbox WHERE payload = '2'")
        .fetch_one(&pool)
        .await?;
    let why = work.run(&["why", &behind, "--config", cfg]).await?;
    ensure!(
        why.code == Some(0)
            && why
                .stdout
                .contains("waiting for an earlier event of Order/o1")
            && why.stdout.contains(&id),
        "{why:?}"
    );

    hooks.reset_script();
    let retry = work
        .run(&["dead", "retry", "--all", "--config", cfg])
        .await?;
    ensure!(
        retry.code == Some(0) && retry.stdout.contains("1 dead letter(s) put back"),
        "{retry:?}"
    );
    let accepted = hooks
        .wait_until("two deliveries", Duration::from_secs(30), |reqs| {
            reqs.iter()
                .filter(|r| r.accepted() && r.method == "POST")
                .count()
                == 2
        })
        .await?;
    let bodies: Vec<String> = accepted
        .iter()
        .filter(|r| r.accepted() && r.method == "POST")
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    ensure!(
        bodies == ["1", "2"],
        "aggregate order broken after retry: {bodies:?}"
    );

    sqlx::query("UPDATE outbox SET state = 'dead', dead_lettered_at = 0 WHERE payload = '2'")
        .execute(&pool)
        .await?;
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
    let unknown = work
        .run(&[
            "dead",
            "show",
            &uuid::Uuid::now_v7().to_string(),
            "--config",
            cfg,
        ])
        .await?;
    unknown.assert_clear_error("no event with id")?;
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_dead_letter_shows_its_reason_and_why_explains_cdc_rows() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    hooks.reject_when_header("outbox-poison", "1", 422);
    let work = Workdir::new()?;
    // Slots are cluster-wide: each run gets its own.
    let tag = format!("dead{}", uuid::Uuid::new_v4().simple());
    let cfg_path = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"postgres\"\nurl = \"{url}\"\nmode = \"cdc\"\nslot = \"s_{tag}\"\npublication = \"p_{tag}\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = sqlx::PgPool::connect(&url).await?;
    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    let poison: uuid::Uuid = sqlx::query_scalar("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('Order', 'o1', 'order.changed', 'bad', '{\"poison\":\"1\"}') RETURNING id")
        .fetch_one(&pool)
        .await?;
    let fine: uuid::Uuid = sqlx::query_scalar("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o2', 'order.changed', 'good') RETURNING id")
        .fetch_one(&pool)
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, String>("SELECT state FROM outbox WHERE id = $1")
            .bind(poison)
            .fetch_one(&pool)
            .await
            .is_ok_and(|s| s == "dead")
    })
    .await
    .with_context(|| format!("not dead-lettered: {}", work.read_log("relay.log")))?;
    hooks
        .wait_until("the good event", Duration::from_secs(30), |reqs| {
            reqs.iter()
                .any(|r| r.accepted() && r.body.as_ref() == b"good")
        })
        .await?;

    let show = work
        .run(&["dead", "show", &poison.to_string(), "--config", cfg])
        .await?;
    ensure!(
        show.code == Some(0) && show.stdout.contains("last error") && show.stdout.contains("422"),
        "{show:?}"
    );
    let why = work
        .run(&["why", &poison.to_string(), "--config", cfg])
        .await?;
    ensure!(
        why.code == Some(0)
            && why.stdout.contains("dead-lettered at")
            && why.stdout.contains("422"),
        "{why:?}"
    );
    // A streamed row stays `pending` in CDC mode: `why` says so instead of guessing.
    let why = work
        .run(&["why", &fine.to_string(), "--config", cfg])
        .await?;
    ensure!(
        why.code == Some(0)
            && why
                .stdout
                .contains("CDC mode: delivery is not recorded per row"),
        "{why:?}"
    );
    ensure!(terminate(&mut relay, Duration::from_secs(30)).await? == Some(0));
    // The walsender may still be ending after the relay exited: drop once it let go.
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query("SELECT pg_drop_replication_slot($1)")
            .bind(format!("s_{tag}"))
            .execute(&pool)
            .await
            .is_ok()
    })
    .await
    .context("dropping the test's replication slot")?;
    Ok(())
}
