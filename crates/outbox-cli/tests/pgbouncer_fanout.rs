//! Fan-out through PgBouncer in transaction mode under `kill -9` chaos (issue 35), the shape of
//! seed 003 in production: a `bookings` table captured on insert and update with the event
//! type taken from its `status` column; two subscriptions, `sms` (every event) and `payments`
//! (`booking.confirmed` only); two relays killed with SIGKILL over and over; four producers
//! with 10 % rollbacks; every client (producers, relays, `migrate`, `capture install`) through
//! one PgBouncer with three server connections, so that clients really share them. Bookings
//! written before the capture was installed reach both through `capture snapshot`, run through
//! the pooler too.
//!
//! Afterwards each subscription's webhook has every committed event it selects (lost 0), none
//! outside its filter, none from a rolled-back transaction (phantom 0), and each customer's
//! events in commit order (inversions 0).

#![allow(clippy::disallowed_methods)]

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, PgBouncer, Postgres};
use rand::Rng;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use support::Workdir;

const PRODUCERS: usize = 4;
const CUSTOMERS_PER_PRODUCER: usize = 3;
const WRITES_PER_PRODUCER: usize = 400;
const CREATED: &str = "booking.created";
const CONFIRMED: &str = "booking.confirmed";
/// Bookings in the table before the capture is installed.
const SEEDED: usize = 30;

fn seeded_status(i: usize) -> &'static str {
    if i.is_multiple_of(3) {
        CONFIRMED
    } else {
        CREATED
    }
}

/// What one producer committed: per customer, (token, status) in commit order; and the tokens
/// of its rolled-back writes.
#[derive(Default)]
struct Written {
    committed: BTreeMap<String, Vec<(String, String)>>,
    rolled_back: HashSet<String>,
}

/// One producer: inserts its customers' bookings, then updates them (status alternating at
/// random between created and confirmed), each write its own transaction, one in ten rolled
/// back. All through PgBouncer, with unnamed statements as a pooled client must.
async fn produce(pool: sqlx::PgPool, producer: usize) -> anyhow::Result<Written> {
    let mut written = Written::default();
    let mut exists = HashSet::new();
    for i in 0..WRITES_PER_PRODUCER {
        let customer = format!("c{producer}_{}", i % CUSTOMERS_PER_PRODUCER);
        let token = format!("p{producer}w{i}");
        let (status, rollback) = {
            let mut rng = rand::rng();
            let status = if rng.random_bool(0.5) {
                CONFIRMED
            } else {
                CREATED
            };
            (status, rng.random_bool(0.1))
        };
        let mut tx = pool.begin().await?;
        let write = if exists.contains(&customer) {
            "UPDATE bookings SET status = $2, token = $3, version = version + 1 WHERE customer_id = $1"
        } else {
            "INSERT INTO bookings (customer_id, status, token, version) VALUES ($1, $2, $3, 1)"
        };
        sqlx::query(write)
            .persistent(false)
            .bind(&customer)
            .bind(status)
            .bind(&token)
            .execute(&mut *tx)
            .await?;
        if rollback {
            tx.rollback().await?;
            written.rolled_back.insert(token);
        } else {
            tx.commit().await?;
            exists.insert(customer.clone());
            written
                .committed
                .entry(customer)
                .or_default()
                .push((token, status.to_owned()));
        }
        if i % 7 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(written)
}

/// Per customer, the (token, status) of each accepted webhook, in arrival order.
fn delivered(receiver: &HttpReceiver) -> anyhow::Result<HashMap<String, Vec<(String, String)>>> {
    let mut out: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for request in receiver
        .received()
        .into_iter()
        .filter(|r| r.accepted() && r.method == "POST")
    {
        let row = request.json()?;
        let field = |name: &str| -> anyhow::Result<String> {
            Ok(row[name].as_str().context(name.to_owned())?.to_owned())
        };
        out.entry(field("customer_id")?)
            .or_default()
            .push((field("token")?, field("status")?));
    }
    Ok(out)
}

fn config(bouncer: &str, sms: &HttpReceiver, payments: &HttpReceiver) -> String {
    format!(
        r#"[source]
kind = "postgres"
url = "{bouncer}"
transaction_pooling = true

[relay]
batch_size = 20
poll_interval = "2ms"
max_attempts = 10
workers = 1

[[capture]]
table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type_column = "status"
on = ["insert", "update"]

[sinks.sms]
kind = "http"
url = "{sms}"

[sinks.payments]
kind = "http"
url = "{payments}"

[[subscription]]
name = "sms"
sink = "sms"

[[subscription]]
name = "payments"
sink = "payments"
event_type = "{CONFIRMED}"
"#,
        sms = sms.url_for("/sms"),
        payments = payments.url_for("/payments"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn filtered_fan_out_through_pgbouncer_loses_nothing_and_crosses_no_filter_under_sigkill()
-> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let direct = pg.fresh_database().await?;
    {
        let setup = sqlx::PgPool::connect(&direct).await?;
        sqlx::query(
            "CREATE TABLE bookings (
                 id bigserial PRIMARY KEY,
                 customer_id text NOT NULL UNIQUE,
                 status text NOT NULL,
                 token text NOT NULL,
                 version int NOT NULL
             )",
        )
        .execute(&setup)
        .await?;
        // Bookings from before the capture: `capture snapshot` turns them into events.
        for i in 0..SEEDED {
            sqlx::query(
                "INSERT INTO bookings (customer_id, status, token, version) VALUES ($1, $2, $1, 1)",
            )
            .bind(format!("seed{i}"))
            .bind(seeded_status(i))
            .execute(&setup)
            .await?;
        }
        setup.close().await;
    }
    // Three server connections for everyone: two relays (each a claim pool and a pool for the
    // fan-out copies and gauges), four producers and the commands. A claim holds its server
    // connection while its batch is copied over another one, so the pooler needs more server
    // connections than replicas x relay.workers (docs/operations.md, "Through PgBouncer").
    let bouncer = PgBouncer::start(&direct, 3).await?;
    let sms = HttpReceiver::start().await?;
    let payments = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let cfg = work.write_config("outbox.toml", &config(bouncer.url(), &sms, &payments))?;
    let cfg_arg = cfg.to_str().context("path")?;
    // The schema, the subscriptions' tables and the capture trigger, through the pooler too.
    work.run_ok(&["migrate", "--config", cfg_arg]).await?;
    work.run_ok(&["capture", "install", "--config", cfg_arg])
        .await?;
    let listed = work
        .run_ok(&["capture", "list", "--config", cfg_arg])
        .await?;
    ensure!(listed.contains("bookings"), "capture list: {listed}");

    let mut relays = [
        work.spawn_relay(&cfg, "relay-0.log")?,
        work.spawn_relay(&cfg, "relay-1.log")?,
    ];
    let options: PgConnectOptions = bouncer.url().parse()?;
    let producers_pool = PgPoolOptions::new()
        .max_connections(u32::try_from(PRODUCERS)?)
        .connect_with(options.extra_float_digits(None))
        .await?;
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(producers_pool.clone(), p)))
        .collect();
    // While relays and producers share the pooler's server connections.
    work.run_ok(&[
        "capture", "snapshot", "--config", cfg_arg, "--rate", "100000",
    ])
    .await?;

    // SIGKILL a random relay every 150-400 ms while producers write, and a few times after.
    let kills = support::kill_relays_until(&work, &cfg, &mut relays, 10, || {
        producers.iter().all(tokio::task::JoinHandle::is_finished)
    })
    .await?;
    // Each seeded booking's one event is its snapshot.
    let mut committed: BTreeMap<String, Vec<(String, String)>> = (0..SEEDED)
        .map(|i| {
            let customer = format!("seed{i}");
            (
                customer.clone(),
                vec![(customer, seeded_status(i).to_owned())],
            )
        })
        .collect();
    let mut rolled_back = HashSet::new();
    for p in producers {
        let written = p.await??;
        committed.extend(written.committed);
        rolled_back.extend(written.rolled_back);
    }
    ensure!(
        !rolled_back.is_empty(),
        "no write was rolled back: no phantom check"
    );

    // What each subscription must receive: every committed event its filter selects.
    let expected = |filter: Option<&str>| -> BTreeMap<String, Vec<String>> {
        committed
            .iter()
            .map(|(customer, writes)| {
                let tokens = writes
                    .iter()
                    .filter(|(_, status)| filter.is_none_or(|f| f == status))
                    .map(|(token, _)| token.clone())
                    .collect();
                (customer.clone(), tokens)
            })
            .collect()
    };
    let subscriptions = [
        ("sms", &sms, expected(None)),
        ("payments", &payments, expected(Some(CONFIRMED))),
    ];
    for (name, receiver, want) in &subscriptions {
        let total: usize = want.values().map(Vec::len).sum();
        let wanted: HashSet<&String> = want.values().flatten().collect();
        let arrived = outbox_testkit::wait::eventually(Duration::from_secs(120), || async {
            delivered(receiver).is_ok_and(|d| {
                d.values()
                    .flatten()
                    .filter(|(token, _)| wanted.contains(token))
                    .map(|(token, _)| token)
                    .collect::<HashSet<_>>()
                    .len()
                    >= total
            })
        })
        .await;
        arrived.with_context(|| {
            format!(
                "{name}: not every committed event arrived (lost)\n{}",
                (0..2)
                    .map(|i| work.read_log(&format!("relay-{i}.log")))
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            )
        })?;
    }
    support::stop_restarted_relays(&work, &mut relays).await?;

    for (name, receiver, want) in &subscriptions {
        let got = delivered(receiver)?;
        let mut duplicates = 0;
        for (customer, arrived) in &got {
            for (token, status) in arrived {
                ensure!(
                    !rolled_back.contains(token),
                    "{name}: {customer} got {token}, written by a rolled-back transaction (phantom)"
                );
                ensure!(
                    *name != "payments" || status == CONFIRMED,
                    "{name}: {customer} got {token} with event type {status}, outside its filter"
                );
            }
        }
        for (customer, tokens) in want {
            let arrived = got.get(customer).cloned().unwrap_or_default();
            let mut first_seen = Vec::new();
            let mut seen = HashSet::new();
            for (token, _) in &arrived {
                if seen.insert(token.clone()) {
                    first_seen.push(token.clone());
                } else {
                    duplicates += 1;
                }
            }
            let missing: Vec<&String> = tokens.iter().filter(|t| !seen.contains(*t)).collect();
            ensure!(
                missing.is_empty(),
                "{name}: customer {customer} lost {missing:?}"
            );
            ensure!(
                &first_seen == tokens,
                "{name}: customer {customer} in delivery order {first_seen:?}, committed in order {tokens:?}"
            );
        }
        let events: usize = want.values().map(Vec::len).sum();
        tracing::info!(
            name,
            events,
            kills,
            duplicates,
            "fan-out through PgBouncer: lost 0, inversions 0, outside the filter 0, phantom 0"
        );
    }
    Ok(())
}
