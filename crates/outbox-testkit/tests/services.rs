//! The testkit's servers work: each starts, does a round trip, and survives stop/restart.

use std::time::Duration;

use async_nats::jetstream;
use outbox_testkit::services::{HttpReceiver, Nats, Postgres, RabbitMq, Redis};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

const WAIT: Duration = Duration::from_secs(10);

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

#[tokio::test]
async fn each_fresh_database_is_empty_and_separate() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let (a, b) = (pg.fresh_database().await?, pg.fresh_database().await?);
    assert_ne!(a, b);

    let mut conn_a = PgConnection::connect(&a).await?;
    sqlx::query("CREATE TABLE t (x int)")
        .execute(&mut conn_a)
        .await?;
    let mut conn_b = PgConnection::connect(&b).await?;
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename = 't'")
        .fetch_one(&mut conn_b)
        .await?;
    assert_eq!(tables, 0);

    let wal_level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(&mut conn_a)
        .await?;
    assert_eq!(wal_level, "logical", "CDC tests need logical decoding");
    Ok(())
}

#[tokio::test]
async fn the_shared_postgres_cannot_be_stopped() -> anyhow::Result<()> {
    let pg = Postgres::shared().await?;
    let err = pg
        .stop()
        .await
        .expect_err("shared servers are not ours to stop");
    assert!(err.to_string().contains("start_private"), "{err}");
    Ok(())
}

#[tokio::test]
async fn private_postgres_keeps_its_data_across_stop_and_restart() -> anyhow::Result<()> {
    let pg = Postgres::start_private().await?;
    let url = pg.fresh_database().await?;
    let mut conn = PgConnection::connect(&url).await?;
    sqlx::raw_sql("CREATE TABLE t (x int); INSERT INTO t VALUES (42)")
        .execute(&mut conn)
        .await?;
    drop(conn);

    pg.stop().await?;
    assert!(!pg.is_running());
    assert!(
        PgConnection::connect(&url).await.is_err(),
        "connections are refused while stopped"
    );

    pg.restart().await?;
    let mut conn = PgConnection::connect(&url).await?;
    let x: i32 = sqlx::query_scalar("SELECT x FROM t")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(x, 42);
    drop(conn);

    let dir = pg
        .log_path()
        .and_then(|p| p.parent().map(ToOwned::to_owned))
        .expect("local server");
    drop(pg);
    assert!(!dir.exists(), "the data directory is removed on drop");
    Ok(())
}

#[tokio::test]
async fn shared_nats_round_trips_through_jetstream() -> anyhow::Result<()> {
    let nats = Nats::shared().await?;
    let js = jetstream::new(nats.connect().await?);
    let name = unique("TESTKIT");
    let subject = format!("{name}.event");
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await?;
    js.publish(subject, "hello".into()).await?.await?;
    let stream = js.get_stream(&name).await?;
    let message = stream.get_raw_message(1).await?;
    assert_eq!(&message.payload[..], b"hello");
    js.delete_stream(&name).await?;
    Ok(())
}

#[tokio::test]
async fn private_nats_keeps_jetstream_data_across_stop_and_restart() -> anyhow::Result<()> {
    let nats = Nats::start().await?;
    let js = jetstream::new(nats.connect().await?);
    js.create_stream(jetstream::stream::Config {
        name: "KEPT".into(),
        subjects: vec!["kept.>".into()],
        ..Default::default()
    })
    .await?;
    js.publish("kept.one", "1".into()).await?.await?;

    nats.stop().await?;
    assert!(
        nats.connect().await.is_err(),
        "connections are refused while stopped"
    );
    nats.restart().await?;

    let js = jetstream::new(nats.connect().await?);
    let mut stream = js.get_stream("KEPT").await?;
    assert_eq!(stream.info().await?.state.messages, 1);
    assert!(Nats::shared().await?.url() != nats.url());
    Ok(())
}

#[tokio::test]
async fn http_receiver_records_requests_and_follows_its_script() -> anyhow::Result<()> {
    let hooks = HttpReceiver::start().await?;
    let client = reqwest::Client::new();
    let post = |body: &'static str, aggregate: &'static str| {
        client
            .post(hooks.url_for("/hooks?x=1"))
            .header("outbox-aggregate_id", aggregate)
            .body(body)
            .send()
    };

    hooks.fail_next(1, 503);
    hooks.reject_when_header("outbox-aggregate_id", "poison", 400);
    assert_eq!(post("a", "o_1").await?.status(), 503);
    assert_eq!(post("b", "o_1").await?.status(), 200);
    assert_eq!(post("c", "poison").await?.status(), 400);
    hooks.respond_with(429);
    assert_eq!(post("d", "o_2").await?.status(), 429);

    let got = hooks.wait_for(4, WAIT).await?;
    let summary: Vec<_> = got.iter().map(|r| (r.seq, &r.body[..], r.status)).collect();
    assert_eq!(
        summary,
        vec![
            (0, &b"a"[..], 503),
            (1, &b"b"[..], 200),
            (2, &b"c"[..], 400),
            (3, &b"d"[..], 429)
        ]
    );
    assert_eq!(got[0].method, "POST");
    assert_eq!(got[0].path, "/hooks?x=1");
    assert_eq!(got[0].header("Outbox-Aggregate_Id"), Some("o_1"));

    let err = hooks
        .wait_for_accepted(2, Duration::from_millis(100))
        .await
        .expect_err("only one 2xx");
    assert!(err.to_string().contains("got 4"), "{err}");
    Ok(())
}

#[tokio::test]
async fn http_receiver_simulates_slowness_and_outages() -> anyhow::Result<()> {
    let hooks = HttpReceiver::start().await?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()?;

    hooks.set_delay(Duration::from_secs(5));
    let slow = client.post(hooks.url()).body("slow").send().await;
    assert!(
        slow.is_err_and(|e| e.is_timeout()),
        "a delayed answer times out the client"
    );
    hooks.set_delay(Duration::ZERO);

    hooks.stop().await;
    assert!(!hooks.is_running());
    assert!(
        client.post(hooks.url()).body("lost").send().await.is_err(),
        "refused while stopped"
    );

    hooks.restart().await?;
    assert_eq!(
        client.post(hooks.url()).body("back").send().await?.status(),
        200
    );
    let bodies: Vec<_> = hooks
        .wait_for(2, WAIT)
        .await?
        .into_iter()
        .map(|r| r.body)
        .collect();
    assert_eq!(bodies, vec!["slow", "back"]);
    Ok(())
}

#[tokio::test]
async fn http_receiver_stop_drops_open_connections() -> anyhow::Result<()> {
    let hooks = HttpReceiver::start().await?;
    hooks.set_delay(Duration::from_secs(30));
    let client = reqwest::Client::new();
    let in_flight = tokio::spawn(client.post(hooks.url()).body("x").send());
    hooks.wait_for(1, WAIT).await?;
    hooks.stop().await;
    let result = tokio::time::timeout(WAIT, in_flight).await??;
    assert!(
        result.is_err(),
        "a request in flight gets no answer: {result:?}"
    );
    Ok(())
}

/// Sends one command over a raw connection (inline RESP) and returns the raw reply.
async fn redis_command(redis: &Redis, command: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", redis.port())).await?;
    stream
        .write_all(format!("{command}\r\n").as_bytes())
        .await?;
    let mut reply = vec![0u8; 4096];
    let n = tokio::time::timeout(WAIT, stream.read(&mut reply)).await??;
    Ok(String::from_utf8_lossy(&reply[..n]).into_owned())
}

#[tokio::test]
async fn private_redis_keeps_its_streams_across_stop_and_restart() -> anyhow::Result<()> {
    let redis = Redis::start().await?;
    let reply = redis_command(&redis, "XADD kept * f 1").await?;
    assert!(reply.starts_with('$'), "XADD answered {reply:?}");
    let reply = redis_command(&redis, "CONFIG GET proto-max-bulk-len").await?;
    assert!(
        reply.contains(&Redis::MAX_BULK_LEN.to_string()),
        "CONFIG GET answered {reply:?}"
    );

    redis.stop().await?;
    assert!(!redis.is_running());
    assert!(
        redis_command(&redis, "PING").await.is_err(),
        "connections are refused while stopped"
    );
    redis.restart().await?;
    assert_eq!(redis_command(&redis, "XLEN kept").await?, ":1\r\n");
    assert!(Redis::shared().await?.url() != redis.url());
    Ok(())
}

#[tokio::test]
async fn the_shared_redis_and_rabbitmq_cannot_be_stopped() -> anyhow::Result<()> {
    let redis = Redis::shared().await?;
    let err = redis.stop().await.expect_err("shared");
    assert!(err.to_string().contains("Redis::start()"), "{err}");
    assert!(redis_command(redis, "PING").await?.starts_with("+PONG"));

    let rabbitmq = RabbitMq::shared().await?;
    let err = rabbitmq.restart().await.expect_err("shared");
    assert!(err.to_string().contains("RabbitMq::start()"), "{err}");
    assert!(rabbitmq.url().starts_with("amqp://"), "{}", rabbitmq.url());
    assert!(rabbitmq.is_running());
    Ok(())
}
