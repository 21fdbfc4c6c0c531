//! SIGTERM in the middle of a drain, for every broker: the relay finishes the batches it has
//! in flight (publish, await acks, record) and exits 0, so that what the broker holds is
//! *exactly* what the outbox marked delivered — no published-but-unrecorded tail (that would
//! be an abandoned batch: duplicates on restart) and no recorded-but-unpublished event (loss).
//! A second relay then drains the rest: every event reaches the broker once, in per-aggregate
//! order.
//!
//! Real parts only: PostgreSQL, the `outbox` binary, and each broker read back by a consumer.

mod support;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use support::{Workdir, terminate, wait_drained};

const EVENTS: i64 = 20_000;
const AGGREGATES: i64 = 40;
const WAIT: Duration = Duration::from_secs(60);

/// One message as the broker's consumer saw it: the event id and the body (`o_7/123`:
/// aggregate and its position in the producer's order).
#[derive(Debug, Clone)]
struct Seen {
    id: String,
    body: String,
}

/// One `XRANGE` entry: its id and its field/value pairs.
#[cfg(feature = "redis")]
type StreamEntry = (String, Vec<(String, Vec<u8>)>);

/// A name no other test uses (lower-case letters and digits: valid for every broker).
fn unique() -> String {
    format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..])
}

/// The scenario, for a `[sink]` section and a reader returning everything the broker holds
/// once it holds at least the given number of messages.
async fn sigterm_mid_drain<R, F>(sink_toml: &str, read: R) -> anyhow::Result<()>
where
    R: Fn(usize) -> F,
    F: Future<Output = anyhow::Result<Vec<Seen>>>,
{
    let url = Postgres::shared().await?.fresh_database().await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "postgres"
url = "{url}"
on_delivered = "mark"
[relay]
batch_size = 100
workers = 2
{sink_toml}
"#
        ),
    )?;
    let out = work
        .run(&[
            "migrate",
            "--config",
            config.to_str().context("utf-8 path")?,
        ])
        .await?;
    ensure!(out.code == Some(0), "{out:?}");
    let pool = sqlx::PgPool::connect(&url).await?;
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'Order', 'o_' || (g % $2), 'order.step', convert_to('o_' || (g % $2) || '/' || g, 'UTF8') \
         FROM generate_series(1, $1) AS g",
    )
    .bind(EVENTS)
    .bind(AGGREGATES)
    .execute(&pool)
    .await?;

    // SIGTERM as soon as the first batch is recorded: the relay is mid-drain.
    let mut relay = work.spawn_relay(&config, "relay-1.log")?;
    let delivered = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'delivered'")
            .fetch_one(&pool)
            .await
            .unwrap_or(0)
    };
    outbox_testkit::wait::eventually(WAIT, || async { delivered().await > 0 })
        .await
        .with_context(|| work.read_log("relay-1.log"))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?} after SIGTERM: {}",
        work.read_log("relay-1.log")
    );

    let marked: HashSet<String> =
        sqlx::query_scalar::<_, String>("SELECT id::text FROM outbox WHERE state = 'delivered'")
            .fetch_all(&pool)
            .await?
            .into_iter()
            .collect();
    ensure!(
        (marked.len() as i64) < EVENTS,
        "the relay drained all {EVENTS} events before SIGTERM arrived; the test cannot tell a drain from an abort"
    );
    let seen = read(marked.len()).await?;
    let published: HashSet<String> = seen.iter().map(|s| s.id.clone()).collect();
    ensure!(
        published.len() == seen.len(),
        "duplicates at the broker after one relay run"
    );
    let lost: Vec<&String> = marked.difference(&published).take(5).collect();
    ensure!(
        lost.is_empty(),
        "{} event(s) marked delivered are not at the broker, e.g. {lost:?}",
        marked.difference(&published).count()
    );
    let abandoned: Vec<&String> = published.difference(&marked).take(5).collect();
    ensure!(
        abandoned.is_empty(),
        "{} event(s) reached the broker but were not recorded (an in-flight batch was abandoned), e.g. {abandoned:?}",
        published.difference(&marked).count()
    );

    // A new relay drains the rest.
    let mut relay = work.spawn_relay(&config, "relay-2.log")?;
    wait_drained(&pool, WAIT)
        .await
        .with_context(|| work.read_log("relay-2.log"))?;
    let code = terminate(&mut relay, WAIT).await?;
    ensure!(code == Some(0), "{}", work.read_log("relay-2.log"));

    let seen = read(EVENTS as usize).await?;
    let ids: HashSet<&str> = seen.iter().map(|s| s.id.as_str()).collect();
    ensure!(
        ids.len() == EVENTS as usize,
        "{} distinct events at the broker, expected {EVENTS}",
        ids.len()
    );
    let mut last: HashMap<&str, i64> = HashMap::new();
    for s in &seen {
        let (aggregate, n) = s
            .body
            .split_once('/')
            .with_context(|| format!("unexpected body {:?}", s.body))?;
        let n: i64 = n.parse()?;
        let before = last.insert(aggregate, n).unwrap_or(0);
        ensure!(
            n > before,
            "aggregate {aggregate}: event {n} arrived after {before}"
        );
    }
    Ok(())
}

/// Polls `read_all` until it returns at least `at_least` messages (or 30 s pass).
async fn at_least<F, Fut>(at_least: usize, read_all: F) -> anyhow::Result<Vec<Seen>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<Vec<Seen>>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let seen = read_all().await?;
        if seen.len() >= at_least || std::time::Instant::now() >= deadline {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_sigterm_drains_in_flight_batches() -> anyhow::Result<()> {
    use outbox_testkit::services::Nats;
    let nats = Nats::shared().await?;
    let tag = unique();
    let client = async_nats::connect(nats.url()).await?;
    let sink = format!(
        "[sink]\nkind = \"nats\"\nurl = \"{}\"\ndestination = \"{tag}.{{aggregate_id}}\"\nstream = \"{tag}\"\n",
        nats.url()
    );
    sigterm_mid_drain(&sink, |n| {
        let client = client.clone();
        let tag = tag.clone();
        async move {
            at_least(n, || async {
                Ok(support::read_stream(&client, &tag)
                    .await?
                    .into_iter()
                    .map(|r| Seen {
                        id: r.id,
                        body: String::from_utf8_lossy(&r.payload).into_owned(),
                    })
                    .collect())
            })
            .await
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sigterm_drains_in_flight_batches() -> anyhow::Result<()> {
    use outbox_testkit::services::HttpReceiver;
    let hooks = HttpReceiver::start().await?;
    // Slow answers: SIGTERM certainly finds requests in flight. Per-aggregate order sends one
    // event per aggregate per wave (40 here), so 20k events are 500 waves: at 20 ms an answer
    // that was 10 s of pure waiting (30 s on a busy machine); 5 ms keeps requests in flight
    // all the same.
    hooks.set_delay(Duration::from_millis(5));
    let sink = format!(
        "[sink]\nkind = \"http\"\nurl = \"{}\"\n",
        hooks.url_for("/hooks/{aggregate_id}")
    );
    sigterm_mid_drain(&sink, |n| {
        let hooks = &hooks;
        async move {
            at_least(n, || async {
                Ok(hooks
                    .received()
                    .into_iter()
                    .filter(|r| r.method == "POST" && r.accepted())
                    .map(|r| Seen {
                        id: r.header("outbox-id").unwrap_or_default().to_owned(),
                        body: String::from_utf8_lossy(&r.body).into_owned(),
                    })
                    .collect())
            })
            .await
        }
    })
    .await
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sigterm_drains_in_flight_batches() -> anyhow::Result<()> {
    use outbox_testkit::services::Redis;
    let redis = Redis::shared().await?;
    let stream = unique();
    let client = redis::Client::open(redis.url())?;
    // 20,000 entries in one XRANGE reply take longer than the client's default timeout.
    let connection = client
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(Some(WAIT)),
        )
        .await?;
    let sink = format!(
        "[sink]\nkind = \"redis\"\nurl = \"{}\"\ndestination = \"{stream}\"\n",
        redis.url()
    );
    sigterm_mid_drain(&sink, |n| {
        let (connection, stream) = (&connection, &stream);
        async move {
            at_least(n, || {
                let mut connection = connection.clone();
                async move {
                    let entries: Vec<StreamEntry> = redis::cmd("XRANGE")
                        .arg(stream)
                        .arg("-")
                        .arg("+")
                        .query_async(&mut connection)
                        .await?;
                    Ok(entries
                        .into_iter()
                        .map(|(_, fields)| {
                            let field = |name: &str| {
                                fields
                                    .iter()
                                    .find(|(n, _)| n == name)
                                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                                    .unwrap_or_default()
                            };
                            Seen {
                                id: field("id"),
                                body: field("payload"),
                            }
                        })
                        .collect())
                }
            })
            .await
        }
    })
    .await
}

#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_sigterm_drains_in_flight_batches() -> anyhow::Result<()> {
    use lapin::options::{
        BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::FieldTable;
    use lapin::{Connection, ConnectionProperties, ExchangeKind};
    use outbox_testkit::services::RabbitMq;

    let broker = RabbitMq::shared().await?;
    let scope = unique();
    let (exchange, queue) = (format!("x.{scope}"), format!("q.{scope}"));
    let connection = Connection::connect(broker.url(), ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
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
    let sink = format!(
        "[sink]\nkind = \"rabbitmq\"\nurl = \"{}\"\nexchange = \"{exchange}\"\ndestination = \"{scope}.{{aggregate_id}}\"\n",
        broker.url()
    );
    // A queue is consumed by reading it: keep what was read for the next call.
    let taken = std::sync::Mutex::new(Vec::<Seen>::new());
    sigterm_mid_drain(&sink, |n| {
        let (channel, queue, taken) = (&channel, &queue, &taken);
        async move {
            at_least(n, || async {
                while let Some(message) = channel
                    .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                    .await?
                {
                    let delivery = message.delivery;
                    let id = delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .map(|id| id.to_string())
                        .unwrap_or_default();
                    let body = String::from_utf8_lossy(&delivery.data).into_owned();
                    taken
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(Seen { id, body });
                }
                Ok(taken
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?
                    .clone())
            })
            .await
        }
    })
    .await?;
    connection.close(200, "done".into()).await?;
    Ok(())
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sigterm_drains_in_flight_batches() -> anyhow::Result<()> {
    use outbox_testkit::services::Kafka;
    use rdkafka::message::{Headers, Message};

    let kafka = Kafka::shared().await?;
    let topic = unique();
    let sink = format!(
        "[sink]\nkind = \"kafka\"\nbrokers = \"{}\"\ndestination = \"{topic}\"\ncreate_topics = true\ntopic_partitions = 2\ndelivery_timeout = \"10s\"\n",
        kafka.brokers()
    );
    sigterm_mid_drain(&sink, |n| {
        let (kafka, topic) = (&kafka, &topic);
        async move {
            let messages = kafka
                .consume(&[topic.as_str()], n, Duration::from_secs(30))
                .await?;
            Ok(messages
                .iter()
                .map(|m| Seen {
                    id: m
                        .headers()
                        .and_then(|hs| {
                            hs.iter()
                                .find(|h| h.key == "id")
                                .and_then(|h| h.value)
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                        })
                        .unwrap_or_default(),
                    body: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                })
                .collect())
        }
    })
    .await
}
