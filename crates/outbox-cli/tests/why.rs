//! `outbox why`: with a real relay publishing to a real HTTP receiver, each event's story is
//! the true one: delivered (when, where), dead-lettered (why), waiting on backoff (every
//! attempt's error), blocked by an earlier event of its aggregate (which one), claimed by a
//! relay right now, or not visible yet because its producer's transaction is still open
//! (which pid). Unknown and malformed ids are clear errors.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use sqlx::PgPool;
use support::Workdir;
use uuid::Uuid;

async fn insert(
    pool: &PgPool,
    aggregate: &str,
    payload: &str,
    headers: &str,
) -> anyhow::Result<Uuid> {
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES ($1, 'Order', $2, 'order.changed', convert_to($3, 'UTF8'), $4::jsonb)")
        .bind(id)
        .bind(aggregate)
        .bind(payload)
        .bind(headers)
        .execute(pool)
        .await?;
    Ok(id)
}

async fn state_of(pool: &PgPool, id: Uuid) -> (String, i32) {
    sqlx::query_as::<_, (String, i32)>("SELECT state, attempts FROM outbox WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|_| ("missing".to_owned(), -1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_tells_backoff_blocked_delivered_dead_claimed_and_uncommitted() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let hooks = HttpReceiver::start().await?;
    hooks.respond_when(
        |r| match (r.header("outbox-poison"), r.header("outbox-fatal")) {
            (Some("1"), _) => Some(503),
            (_, Some("1")) => Some(422),
            _ => None,
        },
    );
    let work = Workdir::new()?;
    let cfg = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
claim_timeout = "120s"
[relay]
max_attempts = 5
backoff = {{ initial = "1h", max = "2h", jitter = 0.0 }}
publish_timeout = "60s"
[sink]
kind = "http"
url = "{hook}"
"#,
            hook = hooks.url_for("/in")
        ),
    )?;
    let cfg = cfg.to_str().context("path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = PgPool::connect(&url).await?;

    let retrying = insert(&pool, "o1", "first", r#"{"poison":"1"}"#).await?;
    let behind = insert(&pool, "o1", "second", "{}").await?;
    let delivered = insert(&pool, "o2", "fine", "{}").await?;
    let dead = insert(&pool, "o3", "refused", r#"{"fatal":"1"}"#).await?;

    let mut relay = work.spawn_relay(std::path::Path::new(cfg), "relay.log")?;
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        state_of(&pool, retrying).await == ("pending".to_owned(), 1)
            && state_of(&pool, delivered).await.0 == "delivered"
            && state_of(&pool, dead).await.0 == "dead"
    })
    .await
    .with_context(|| format!("events did not settle: {}", work.read_log("relay.log")))?;

    // Backoff: the attempt's error (the receiver's 503) and the next attempt time.
    let out = work
        .run(&["why", &retrying.to_string(), "--config", cfg])
        .await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout.contains("waiting on backoff")
            && out.stdout.contains("#1")
            && out.stdout.contains("503"),
        "{}",
        out.stdout
    );
    // Blocked by the earlier event of its aggregate, named by id.
    let out = work
        .run(&["why", &behind.to_string(), "--config", cfg])
        .await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout
            .contains("waiting for an earlier event of Order/o1")
            && out.stdout.contains(&retrying.to_string()),
        "{}",
        out.stdout
    );
    // Delivered: when and where (the sink's destination).
    let out = work
        .run(&["why", &delivered.to_string(), "--config", cfg])
        .await?;
    ensure!(
        out.code == Some(0)
            && out.stdout.contains("delivered at")
            && out.stdout.contains(&hooks.url_for("/in")),
        "{out:?}"
    );
    let json = work
        .run(&["why", &delivered.to_string(), "--json", "--config", cfg])
        .await?;
    let v: serde_json::Value = serde_json::from_str(&json.stdout).context("why --json")?;
    ensure!(v["verdict"]["verdict"] == "delivered", "{v}");
    ensure!(v["event"]["payload"] == "fine", "{v}");
    // Dead: the reason (the receiver's 422).
    let out = work
        .run(&["why", &dead.to_string(), "--config", cfg])
        .await?;
    ensure!(
        out.code == Some(0)
            && out.stdout.contains("dead-lettered at")
            && out.stdout.contains("422"),
        "{out:?}"
    );

    // Claimed: the receiver holds the request, so the relay's claim stays open.
    hooks.set_delay(Duration::from_secs(3600));
    let slow = insert(&pool, "o4", "slow", "{}").await?;
    hooks
        .wait_until(
            "the slow event's request",
            Duration::from_secs(30),
            |reqs| reqs.iter().any(|r| r.body.as_ref() == b"slow"),
        )
        .await?;
    let out = work
        .run(&["why", &slow.to_string(), "--config", cfg])
        .await?;
    ensure!(
        out.code == Some(0) && out.stdout.contains("being published right now"),
        "{out:?}"
    );

    // Not visible yet: a producer transaction wrote it and is still open.
    let mut producer = pool.begin().await?;
    let producer_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *producer)
        .await?;
    let open = Uuid::now_v7();
    sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'Order', 'o5', 'order.changed', 'x')")
        .bind(open)
        .execute(&mut *producer)
        .await?;
    let out = work
        .run(&["why", &open.to_string(), "--config", cfg])
        .await?;
    out.assert_clear_error("no committed event with id")?;
    ensure!(
        out.stderr
            .contains(&format!("pid {producer_pid} (idle in transaction")),
        "the open writer is not named: {}",
        out.stderr
    );
    // A second producer of the same aggregate waits for the first one's ordering lock: its
    // insert has started, so it is a writer too, and `why` says whom it waits for.
    let blocked = Uuid::now_v7();
    let second = {
        let pool = pool.clone();
        tokio::spawn(async move {
            sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'Order', 'o5', 'order.changed', 'y')")
                .bind(blocked)
                .execute(&pool)
                .await
        })
    };
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(&pool)
        .await
        .is_ok_and(|n| n == 1)
    })
    .await
    .context("the second producer never waited for the lock")?;
    let out = work
        .run(&["why", &blocked.to_string(), "--config", cfg])
        .await?;
    out.assert_clear_error("no committed event with id")?;
    ensure!(
        out.stderr.contains(&format!(
            "waits for the aggregate's ordering lock held by pid {producer_pid}"
        )),
        "the lock wait is not explained: {}",
        out.stderr
    );
    producer.rollback().await?;
    second.await??;
    let out = work
        .run(&["why", &blocked.to_string(), "--config", cfg])
        .await?;
    ensure!(
        out.code == Some(0),
        "visible once the first producer ended: {out:?}"
    );

    // Ready: with no relay running, nothing holds it; the pending events before it that are
    // not in backoff are counted: `behind`, `slow` (released by the killed relay) and
    // `blocked` (the relay was still stuck on `slow`'s request, so never published it).
    relay.kill().await?;
    let ready = insert(&pool, "o6", "ready", "{}").await?;
    let out = work
        .run(&["why", &ready.to_string(), "--config", cfg])
        .await?;
    ensure!(
        out.code == Some(0)
            && out
                .stdout
                .contains("ready: nothing holds it; 3 pending event(s) not in backoff are ahead"),
        "{out:?}"
    );

    // Unknown and malformed ids.
    let out = work
        .run(&["why", &Uuid::now_v7().to_string(), "--config", cfg])
        .await?;
    out.assert_clear_error("no event with id")?;
    let out = work.run(&["why", "not-a-uuid", "--config", cfg]).await?;
    out.assert_clear_error("not-a-uuid")?;
    Ok(())
}
