//! Wires shop, relay and loyalty service together for one run and reports what happened.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_core::{Backoff, Relay, RelayConfig, RelayError, RelayReport, Sink, Source};
use outbox_inbox::{InboxMessage, PgInbox, SqliteInbox};
use rand::Rng;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::CONSUMER;
use crate::chaos::{Redeliver, lose_ack};
use crate::loyalty::{self, Counters};
use crate::shop::{self, OrderPlaced};

/// The signing secret shared by the demo's webhook sink and receiver.
const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// How long a run may take to deliver everything before it is reported as stuck.
const DEADLINE: Duration = Duration::from_secs(120);

/// What one run does.
#[derive(Debug, Clone)]
pub struct Options {
    /// Orders to place.
    pub orders: usize,
    /// Customers the orders are spread over.
    pub customers: usize,
    /// Fraction of relay batches published twice (a relay crash after publish, before mark).
    pub redeliver: f64,
    /// Fraction of first deliveries whose acknowledgement is lost after the consumer's commit
    /// (a consumer crash between commit and ack).
    pub lost_acks: f64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            orders: 50,
            customers: 5,
            redeliver: 0.3,
            lost_acks: 0.1,
        }
    }
}

/// What a run did, read back from the databases at the end.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `embedded` or `postgres+nats`.
    pub setup: String,
    /// Orders placed by this run (each with its event, in one transaction).
    pub orders: u64,
    /// Messages handed to the loyalty handler: first deliveries, redeliveries, retries.
    pub deliveries: u64,
    /// Deliveries the inbox recognised as already processed (handler side effect skipped).
    pub duplicates: u64,
    /// First deliveries whose ack was "lost" after the commit (each came back as a duplicate).
    pub lost_acks: u64,
    /// Rows in `awards` for this run's orders.
    pub awards: u64,
    /// Distinct orders among them.
    pub awarded_orders: u64,
    /// Points awarded for this run's orders.
    pub points: i64,
    /// Points the orders are worth: what exactly-once processing must award.
    pub expected_points: i64,
    /// Where to look (database files or URLs, secrets removed).
    pub look_at: Vec<String>,
}

impl Summary {
    /// Exactly once: one award per order, and the points the orders are worth.
    pub fn exactly_once(&self) -> bool {
        self.awards == self.orders
            && self.awarded_orders == self.orders
            && self.points == self.expected_points
    }
}

/// This run's orders, and the `LIKE` pattern matching exactly their ids.
fn orders_for_run(options: &Options) -> (Vec<OrderPlaced>, String) {
    let run = format!("o_{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    let mut rng = rand::rng();
    let orders = (0..options.orders)
        .map(|i| OrderPlaced {
            order_id: format!("{run}_{i:04}"),
            customer: format!("c_{}", rng.random_range(0..options.customers.max(1))),
            total_cents: rng.random_range(500..20_000),
        })
        .collect();
    (orders, format!("{run}_%"))
}

fn relay_config() -> RelayConfig {
    RelayConfig {
        // Retries come quickly in a demo (the default starts at 1 s).
        backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(500),
            ..Backoff::default()
        },
        workers: std::num::NonZeroUsize::MIN,
        ..RelayConfig::default()
    }
}

/// Starts the relay: it publishes what `source` reads to `sink`, a fraction `redeliver` of the
/// batches twice (see [`Redeliver`]), until the returned token is cancelled.
fn start_relay<K: Sink, S: Source>(
    config: RelayConfig,
    sink: K,
    redeliver: f64,
    source: S,
) -> (
    CancellationToken,
    JoinHandle<Result<RelayReport, RelayError>>,
) {
    let stop_relay = CancellationToken::new();
    let relay = Relay::new(config, Arc::new(Redeliver::new(sink, redeliver)));
    let stop = stop_relay.clone();
    let relay = tokio::spawn(async move { relay.run(vec![source], stop).await });
    (stop_relay, relay)
}

/// The shop's events the relay has not delivered yet.
const PENDING: &str = "SELECT count(*) FROM outbox WHERE state = 'pending'";

/// Waits until nothing is `pending()` in the outbox and `totals()` shows all `orders` awarded
/// (or fails after [`DEADLINE`]), then stops the relay and the consumer (`stop`, awaited in
/// either case) and reads the `totals()` of the awards a last time: `(awards, awarded orders,
/// points)`.
async fn finish<P, Pending, T, Totals>(
    orders: usize,
    pending: P,
    totals: T,
    stop: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<(i64, i64, i64)>
where
    P: Fn() -> Pending,
    Pending: Future<Output = sqlx::Result<i64>>,
    T: Fn() -> Totals,
    Totals: Future<Output = sqlx::Result<(i64, i64, i64)>>,
{
    let orders = orders as u64;
    let waited = async {
        let start = std::time::Instant::now();
        loop {
            let pending = pending().await?;
            let (_, awarded, _) = totals().await?;
            let done = if pending == 0 { awarded as u64 } else { 0 };
            if done >= orders {
                return Ok(());
            }
            ensure!(
                start.elapsed() < DEADLINE,
                "only {done} of {orders} orders were awarded after {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    .await;
    stop.await?;
    waited?;
    Ok(totals().await?)
}

/// The embedded setup: the shop's SQLite file (`shop.db`: orders + outbox), the loyalty
/// service's SQLite file (`loyalty.db`: points, awards, processed_events), the relay
/// publishing signed webhooks to the loyalty service's HTTP endpoint on 127.0.0.1.
pub async fn run_embedded(dir: &Path, options: &Options) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating `{}`", dir.display()))?;
    let shop_config = outbox_sqlite::SqliteConfig::new(dir.join("shop.db"));
    let shop_pool = outbox_sqlite::connect(&shop_config)
        .await
        .context("opening shop.db")?;
    outbox_sqlite::migrate(&shop_pool, &shop_config.table).await?;
    shop::prepare_sqlite(&shop_pool).await?;

    let loyalty_path: PathBuf = dir.join("loyalty.db");
    let loyalty_pool = sqlx::SqlitePool::connect_with(
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&loyalty_path)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10)),
    )
    .await
    .context("opening loyalty.db")?;
    let inbox = SqliteInbox::default();
    loyalty::prepare_sqlite(&loyalty_pool, &inbox).await?;

    // The loyalty service: a webhook endpoint verifying signatures, handling via the inbox.
    let counters = Arc::new(Counters::default());
    let stop_consumer = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}/webhooks/loyalty", listener.local_addr()?);
    let consumer = {
        let (pool, inbox, counters, rate) = (
            loyalty_pool.clone(),
            inbox.clone(),
            counters.clone(),
            options.lost_acks,
        );
        let receiver = outbox_inbox::http::WebhookReceiver::new(WEBHOOK_SECRET)?;
        tokio::spawn(receiver.serve(
            listener,
            move |message: InboxMessage| {
                let (pool, inbox, counters) = (pool.clone(), inbox.clone(), counters.clone());
                async move {
                    let begin = inbox.begin(&pool, CONSUMER, message.id);
                    loyalty::handle(&counters, begin, &loyalty::SQLITE, message, lose_ack(rate))
                        .await
                }
            },
            stop_consumer.clone(),
        ))
    };

    // The relay.
    let sink = outbox_sinks::HttpConfig {
        url: endpoint.clone(),
        secret: Some(WEBHOOK_SECRET.into()),
        ..outbox_sinks::HttpConfig::default()
    }
    .build()
    .await?;
    let config = relay_config();
    let source = outbox_sqlite::SqlitePollSource::new(
        shop_pool.clone(),
        &shop_config,
        config.ordering,
        config.dead_letter,
    );
    let (stop_relay, relay) = start_relay(config, sink, options.redeliver, source);

    // The shop.
    let (orders, prefix) = orders_for_run(options);
    for order in &orders {
        shop::place_order_sqlite(&shop_pool, order).await?;
    }
    // Done when every order is awarded and the relay has nothing left to (re)deliver: the
    // retries after lost acks must arrive, and be skipped, before the summary is taken.
    let pending = || sqlx::query_scalar(PENDING).fetch_one(&shop_pool);
    let totals = || {
        sqlx::query_as(
            "SELECT count(*), count(DISTINCT order_id), coalesce(sum(points), 0) FROM awards WHERE order_id LIKE ?",
        )
        .bind(&prefix)
        .fetch_one(&loyalty_pool)
    };
    let stopped = stop(stop_relay, relay, &counters, stop_consumer, consumer);
    let totals = finish(orders.len(), pending, totals, stopped).await?;
    Ok(summary(
        "embedded",
        &orders,
        &counters,
        totals,
        vec![
            format!(
                "sqlite3 {} 'SELECT * FROM orders'",
                dir.join("shop.db").display()
            ),
            format!(
                "sqlite3 {} 'SELECT * FROM points; SELECT count(*) FROM processed_events'",
                loyalty_path.display()
            ),
        ],
    ))
}

/// PostgreSQL + NATS JetStream: the shop's tables and the outbox in `public`, the loyalty
/// service's tables in schema `loyalty` of the same database (in production it would own its
/// database), the relay publishing to stream `LOYALTY_DEMO`, the loyalty service consuming
/// it with the durable pull consumer `loyalty`.
pub async fn run_postgres_nats(
    database_url: &str,
    nats_url: &str,
    options: &Options,
) -> anyhow::Result<Summary> {
    let config = outbox_postgres::PostgresConfig::new(database_url);
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("--postgres: {e}"))?;
    let pool = outbox_postgres::connect(&config, 8)
        .await
        .with_context(|| format!("connecting to {}", config.url))?;
    outbox_postgres::migrate(&pool, &config.qualified_table(), false).await?;
    shop::prepare_postgres(&pool).await?;
    let inbox = PgInbox::new(outbox_core::QualifiedTable::new(
        Some(outbox_core::Identifier::new("loyalty")?),
        outbox_core::Identifier::new(outbox_inbox::DEFAULT_TABLE)?,
    ));
    loyalty::prepare_postgres(&pool, &inbox).await?;

    // The relay first: its NATS sink creates the stream the consumer reads.
    let sink = outbox_sinks::NatsConfig {
        url: nats_url.to_owned(),
        stream: "LOYALTY_DEMO".to_owned(),
        destination: outbox_core::Destination::parse("loyalty_demo.{event_type}")?,
        ..outbox_sinks::NatsConfig::default()
    }
    .build()
    .await
    .with_context(|| format!("connecting to NATS at {nats_url}"))?;
    let relay_cfg = relay_config();
    let source = outbox_postgres::PgPollSource::new(
        pool.clone(),
        &config,
        relay_cfg.ordering,
        relay_cfg.dead_letter,
    );
    let (stop_relay, relay) = start_relay(relay_cfg, sink, options.redeliver, source);

    // The loyalty service.
    let counters = Arc::new(Counters::default());
    let stop_consumer = CancellationToken::new();
    let mut jetstream =
        outbox_inbox::nats::JetStreamConsumer::new(nats_url, "LOYALTY_DEMO", "loyalty");
    jetstream.policy.backoff_base = Duration::from_millis(50);
    let consumer = {
        let (pool, inbox, counters, rate) = (
            pool.clone(),
            inbox.clone(),
            counters.clone(),
            options.lost_acks,
        );
        let stop = stop_consumer.clone();
        tokio::spawn(async move {
            jetstream
                .run(
                    move |message: InboxMessage| {
                        let (pool, inbox, counters) =
                            (pool.clone(), inbox.clone(), counters.clone());
                        async move {
                            let begin = inbox.begin(&pool, CONSUMER, message.id);
                            let sql = &loyalty::POSTGRES;
                            loyalty::handle(&counters, begin, sql, message, lose_ack(rate)).await
                        }
                    },
                    stop,
                )
                .await
        })
    };

    // The shop: a few concurrent customers.
    let (orders, prefix) = orders_for_run(options);
    let mut shoppers = tokio::task::JoinSet::new();
    for chunk in orders.chunks(orders.len().div_ceil(4).max(1)) {
        let (pool, chunk) = (pool.clone(), chunk.to_vec());
        shoppers.spawn(async move {
            for order in &chunk {
                shop::place_order_postgres(&pool, order).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = shoppers.join_next().await {
        done.context("shop task")??;
    }
    // Done when every order is awarded and nothing is pending in the outbox; then the
    // consumer gets a moment for redeliveries of lost acks still on their way back.
    let pending = || sqlx::query_scalar(PENDING).fetch_one(&pool);
    let totals = || {
        sqlx::query_as(
            "SELECT count(*), count(DISTINCT order_id), coalesce(sum(points), 0)::bigint FROM loyalty.awards WHERE order_id LIKE $1",
        )
        .bind(&prefix)
        .fetch_one(&pool)
    };
    let stopped = stop(stop_relay, relay, &counters, stop_consumer, consumer);
    let totals = finish(orders.len(), pending, totals, stopped).await?;
    Ok(summary(
        "postgres+nats",
        &orders,
        &counters,
        totals,
        vec![
            format!("psql {} -c 'SELECT * FROM loyalty.points'", config.url),
            format!("nats stream info LOYALTY_DEMO --server {nats_url}"),
        ],
    ))
}

/// Stops the relay, lets lost acks come back (after the consumer's backoff: 50 ms, then
/// doubling) and be skipped, then stops the consumer.
async fn stop<R, RE, C, CE>(
    stop_relay: CancellationToken,
    relay: tokio::task::JoinHandle<Result<R, RE>>,
    counters: &Counters,
    stop_consumer: CancellationToken,
    consumer: tokio::task::JoinHandle<Result<C, CE>>,
) -> anyhow::Result<()>
where
    RE: std::error::Error + Send + Sync + 'static,
    CE: std::error::Error + Send + Sync + 'static,
{
    stop_relay.cancel();
    relay.await.context("relay task")??;
    let redelivered = async {
        while Counters::get(&counters.duplicates) < Counters::get(&counters.lost_acks) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), redelivered).await;
    stop_consumer.cancel();
    consumer.await.context("consumer task")??;
    Ok(())
}

fn summary(
    setup: &str,
    orders: &[OrderPlaced],
    counters: &Counters,
    (awards, awarded_orders, points): (i64, i64, i64),
    look_at: Vec<String>,
) -> Summary {
    Summary {
        setup: setup.to_owned(),
        orders: orders.len() as u64,
        deliveries: Counters::get(&counters.deliveries),
        duplicates: Counters::get(&counters.duplicates),
        lost_acks: Counters::get(&counters.lost_acks),
        awards: awards as u64,
        awarded_orders: awarded_orders as u64,
        points,
        expected_points: orders.iter().map(loyalty::points_for).sum(),
        look_at,
    }
}
