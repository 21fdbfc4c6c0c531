//! End to end through the binary for the Redis Streams and RabbitMQ sinks: plain-SQL
//! producers, PostgreSQL, `outbox relay`, and a real consumer of the broker. Checks that the
//! `[sink]` kinds are wired in, the per-aggregate order, the exact bytes and the event id,
//! and that SIGTERM drains and exits cleanly.

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use support::{Workdir, terminate, wait_drained};

const WAIT: Duration = Duration::from_secs(30);

/// A name no other test uses.
fn unique() -> String {
    format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

/// Migrates a fresh database with `config` and writes three events the way a producer in any
/// language would; returns the pool and the ids in commit order.
async fn produce(
    work: &Workdir,
    config: &str,
    url: &str,
) -> anyhow::Result<(sqlx::PgPool, Vec<String>)> {
    let out = work.run(&["migrate", "--config", config]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = sqlx::PgPool::connect(url).await?;
    for (aggregate_type, aggregate_id, event_type, payload) in [
        ("Order", "o_1", "order.placed", "{\"n\":1}"),
        ("Invoice", "i_1", "invoice.sent", "{\"n\":2}"),
        ("Order", "o_1", "order.paid", "{\"n\":3}"),
    ] {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ($1, $2, $3, convert_to($4, 'UTF8'), '{\"tenant\":\"acme\"}')",
        )
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(event_type)
        .bind(payload)
        .execute(&pool)
        .await?;
    }
    let ids = sqlx::query_scalar::<_, String>("SELECT id::text FROM outbox ORDER BY created_at")
        .fetch_all(&pool)
        .await?;
    Ok((pool, ids))
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_appends_events_to_redis_streams() -> anyhow::Result<()> {
    use outbox_testkit::services::Redis;

    let url = Postgres::shared().await?.fresh_database().await?;
    let redis = Redis::shared().await?;
    let scope = unique();
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
[sink]
kind = "redis"
url = "{redis}"
destination = "{scope}.{{aggregate_type}}"
maxlen = 1000
"#,
            redis = redis.url()
        ),
    )?;
    let config = config.to_str().context("utf-8 path")?;
    let (pool, ids) = produce(&work, config, &url).await?;
    let mut relay = work.spawn_relay(std::path::Path::new(config), "relay.log")?;

    let client = redis::Client::open(redis.url())?;
    let connection = client.get_multiplexed_async_connection().await?;
    let deadline = Instant::now() + WAIT;
    let (orders, invoices) = loop {
        let read = |stream: String| {
            let mut connection = connection.clone();
            async move {
                redis::cmd("XRANGE")
                    .arg(stream)
                    .arg("-")
                    .arg("+")
                    .query_async::<Vec<(String, Vec<(String, Vec<u8>)>)>>(&mut connection)
                    .await
            }
        };
        let orders = read(format!("{scope}.Order")).await?;
        let invoices = read(format!("{scope}.Invoice")).await?;
        if orders.len() >= 2 && !invoices.is_empty() {
            break (orders, invoices);
        }
        ensure!(
            Instant::now() < deadline,
            "events did not reach Redis: {}",
            work.read_log("relay.log")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    let field = |fields: &[(String, Vec<u8>)], name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    let order_ids: Vec<Option<String>> = orders.iter().map(|(_, f)| field(f, "id")).collect();
    ensure!(
        order_ids == [Some(ids[0].clone()), Some(ids[2].clone())],
        "o_1 in commit order: {order_ids:?} vs {ids:?}"
    );
    ensure!(field(&orders[1].1, "payload").as_deref() == Some("{\"n\":3}"));
    ensure!(field(&orders[1].1, "h:tenant").as_deref() == Some("acme"));
    ensure!(field(&invoices[0].1, "id").as_deref() == Some(ids[1].as_str()));

    wait_drained(&pool, WAIT).await?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}: {}",
        work.read_log("relay.log")
    );
    Ok(())
}

#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_events_to_rabbitmq_with_confirms() -> anyhow::Result<()> {
    use lapin::options::{
        BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::FieldTable;
    use lapin::{Connection, ConnectionProperties, ExchangeKind};
    use outbox_testkit::services::RabbitMq;

    let url = Postgres::shared().await?.fresh_database().await?;
    let broker = RabbitMq::shared().await?;
    let scope = unique();
    let (exchange, queue) = (format!("x.{scope}"), format!("q.{scope}"));

    // The consumer's side: a durable queue bound to every routing key of this test.
    let connection = Connection::connect(broker.url(), ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await?;
    let queue_options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.as_str().into(), queue_options, FieldTable::default())
        .await?;
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            format!("{scope}.#").into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
[sink]
kind = "rabbitmq"
url = "{amqp}"
exchange = "{exchange}"
destination = "{scope}.{{aggregate_type}}.{{event_type}}"
"#,
            amqp = broker.url()
        ),
    )?;
    let config = config.to_str().context("utf-8 path")?;
    let (pool, ids) = produce(&work, config, &url).await?;
    let mut relay = work.spawn_relay(std::path::Path::new(config), "relay.log")?;
    wait_drained(&pool, WAIT)
        .await
        .with_context(|| work.read_log("relay.log"))?;

    let mut got = Vec::new();
    while let Some(message) = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await?
    {
        let delivery = message.delivery;
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string());
        got.push((delivery.routing_key.to_string(), id, delivery.data));
    }
    ensure!(got.len() == 3, "3 messages in the queue, got {got:?}");
    let order: Vec<&Option<String>> = got
        .iter()
        .filter(|(key, _, _)| key.contains(".Order."))
        .map(|(_, id, _)| id)
        .collect();
    ensure!(
        order == [&Some(ids[0].clone()), &Some(ids[2].clone())],
        "o_1 in commit order: {got:?} vs {ids:?}"
    );
    ensure!(
        got.iter().any(
            |(key, _, body)| key == &format!("{scope}.Invoice.invoice.sent")
                && body == b"{\"n\":2}"
        ),
        "{got:?}"
    );

    let code = terminate(&mut relay, WAIT).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}: {}",
        work.read_log("relay.log")
    );
    connection.close(200, "done".into()).await?;
    Ok(())
}

#[cfg(feature = "rabbitmq")]
#[tokio::test]
async fn a_broker_password_never_appears_in_a_config_error() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        "[sink]\nkind = \"rabbitmq\"\nurl = \"amqp://relay:hunter2@rabbit:notaport/%2f\"\n",
    )?;
    let out = work
        .run(&[
            "check-config",
            "--config",
            config.to_str().context("utf-8 path")?,
        ])
        .await?;
    out.assert_clear_error("sink.url")?;
    ensure!(!out.stderr.contains("hunter2"), "{}", out.stderr);
    ensure!(out.stderr.contains("relay:***@rabbit"), "{}", out.stderr);
    Ok(())
}
