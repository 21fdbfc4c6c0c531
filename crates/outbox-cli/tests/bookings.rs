//! The bookings example (seed 003, `examples/bookings`) under `kill -9` chaos: bookings come in
//! through the HTTP handler (plain inserts, no outbox code), the capture trigger turns each into
//! an event in the same transaction, and three relay processes, killed with SIGKILL and
//! restarted over and over, fan the events out to the SMS and payment webhooks. Afterwards
//! each webhook has every committed booking (lost 0), none that was rolled back (phantom 0),
//! and each customer's bookings in booking order (disorder 0).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::{HttpReceiver, Postgres};
use support::Workdir;

const CUSTOMERS: usize = 6;
const BOOKINGS_PER_CUSTOMER: usize = 25;

/// The example's outbox.toml, pointed at this test's database and receivers.
fn config(url: &str, sms: &HttpReceiver, payments: &HttpReceiver) -> anyhow::Result<String> {
    let toml = outbox_example_bookings::OUTBOX_TOML;
    for default in [
        "postgres://postgres@127.0.0.1:5432/bookings",
        "http://127.0.0.1:8081/sms",
        "http://127.0.0.1:8082/payments",
    ] {
        ensure!(
            toml.contains(default),
            "examples/bookings/outbox.toml no longer has {default}"
        );
    }
    Ok(toml
        .replace("postgres://postgres@127.0.0.1:5432/bookings", url)
        .replace("http://127.0.0.1:8081/sms", &sms.url_for("/sms"))
        .replace(
            "http://127.0.0.1:8082/payments",
            &payments.url_for("/payments"),
        )
        // Short backoff: a relay killed mid-request leaves nothing to wait for.
        .replace(
            "max_attempts = 10",
            "max_attempts = 10\nbatch_size = 20\npoll_interval = \"2ms\"",
        ))
}

/// Books for one customer, one request after the other: booking order is the order of the
/// returned ids.
async fn book_all(base: String, customer: String, n: usize) -> anyhow::Result<Vec<i64>> {
    let client = reqwest::Client::new();
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let body = serde_json::json!({
            "customer_id": customer,
            "starts_at": format!("2026-12-{:02}T09:00:00Z", 1 + i % 28),
            "amount_cents": 1000 + i,
        });
        let response = client
            .post(format!("{base}/bookings"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await?;
        ensure!(
            response.status() == 201,
            "booking refused: {}",
            response.status()
        );
        let booking: outbox_example_bookings::Booking =
            serde_json::from_slice(&response.bytes().await?)?;
        ids.push(booking.id);
        if i % 5 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    Ok(ids)
}

/// Per customer, the booking ids a receiver accepted, in the order it accepted them.
fn delivered(receiver: &HttpReceiver) -> anyhow::Result<HashMap<String, Vec<i64>>> {
    let mut out: HashMap<String, Vec<i64>> = HashMap::new();
    // Only the webhooks: the sink's healthcheck also calls the URL (without a body).
    for request in receiver
        .received()
        .into_iter()
        .filter(|r| r.accepted() && r.method == "POST")
    {
        let row = request.json()?;
        let customer = row["customer_id"]
            .as_str()
            .context("customer_id")?
            .to_owned();
        let id = row["id"].as_i64().context("id")?;
        out.entry(customer).or_default().push(id);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookings_survive_sigkill_chaos_with_nothing_lost_or_reordered() -> anyhow::Result<()> {
    outbox_testkit::init_tracing();
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let pool = sqlx::PgPool::connect(&url).await?;
    outbox_example_bookings::create_schema(&pool).await?;
    let sms = HttpReceiver::start().await?;
    let payments = HttpReceiver::start().await?;
    let work = Workdir::new()?;
    let cfg = work.write_config("outbox.toml", &config(&url, &sms, &payments)?)?;
    let cfg_arg = cfg.to_str().context("path")?;
    work.run_ok(&["migrate", "--config", cfg_arg]).await?;
    work.run_ok(&["capture", "install", "--config", cfg_arg])
        .await?;

    // The booking service, as the example runs it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let app = outbox_example_bookings::router(pool.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut relays = [
        work.spawn_relay(&cfg, "relay-0.log")?,
        work.spawn_relay(&cfg, "relay-1.log")?,
        work.spawn_relay(&cfg, "relay-2.log")?,
    ];
    let mut customers = Vec::new();
    for c in 0..CUSTOMERS {
        customers.push(tokio::spawn(book_all(
            base.clone(),
            format!("c{c}"),
            BOOKINGS_PER_CUSTOMER,
        )));
    }
    // A booking whose transaction rolls back: its trigger's event goes with it.
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO bookings (customer_id, starts_at, amount_cents) VALUES ('phantom', now(), 1)",
    )
    .execute(&mut *tx)
    .await?;
    tx.rollback().await?;

    // SIGKILL a random relay every 150-400 ms while bookings come in, and a few times after.
    let kills = support::kill_relays_until(&work, &cfg, &mut relays, 12, || {
        customers.iter().all(tokio::task::JoinHandle::is_finished)
    })
    .await?;
    let mut booked: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (c, task) in customers.into_iter().enumerate() {
        booked.insert(format!("c{c}"), task.await??);
    }
    let total = CUSTOMERS * BOOKINGS_PER_CUSTOMER;

    // Both webhooks eventually have every booking (the last relays are left running).
    for (name, receiver) in [("sms", &sms), ("payments", &payments)] {
        let arrived = outbox_testkit::wait::eventually(Duration::from_secs(120), || async {
            delivered(receiver)
                .is_ok_and(|d| d.values().flatten().collect::<HashSet<_>>().len() >= total)
        })
        .await;
        if arrived.is_err() {
            let states: Vec<(String, String, i64)> = sqlx::query_as(
                "SELECT 'outbox', state, count(*) FROM outbox GROUP BY state
                 UNION ALL SELECT 'sms', state, count(*) FROM outbox_sub_sms GROUP BY state
                 UNION ALL SELECT 'payments', state, count(*) FROM outbox_sub_payments GROUP BY state",
            )
            .fetch_all(&pool)
            .await?;
            let bookings: i64 = sqlx::query_scalar("SELECT count(*) FROM bookings")
                .fetch_one(&pool)
                .await?;
            let got = delivered(receiver)?;
            eprintln!(
                "{name}: {} distinct of {total}; {bookings} bookings; rows by state {states:?}; {} requests received",
                got.values().flatten().collect::<HashSet<_>>().len(),
                receiver.received().len()
            );
        }
        arrived.with_context(|| {
            format!(
                "{name}: not every booking arrived\n{}",
                (0..3)
                    .map(|i| work.read_log(&format!("relay-{i}.log")))
                    .collect::<Vec<_>>()
                    .join("\n---\n")
            )
        })?;
    }
    support::stop_restarted_relays(&work, &mut relays).await?;

    for (name, receiver) in [("sms", &sms), ("payments", &payments)] {
        let got = delivered(receiver)?;
        ensure!(
            !got.contains_key("phantom"),
            "{name}: a rolled-back booking was delivered"
        );
        let mut duplicates = 0;
        for (customer, ids) in &booked {
            let arrived = got.get(customer).cloned().unwrap_or_default();
            // Lost: every committed booking arrived at least once.
            let distinct: HashSet<i64> = arrived.iter().copied().collect();
            let missing: Vec<&i64> = ids.iter().filter(|id| !distinct.contains(id)).collect();
            ensure!(
                missing.is_empty(),
                "{name}: customer {customer} lost bookings {missing:?}"
            );
            ensure!(
                distinct.len() == ids.len(),
                "{name}: customer {customer} got bookings it never made: {arrived:?}"
            );
            // Disorder: in order of first arrival, the bookings are in booking order. (A relay
            // killed after publishing a batch and before recording it publishes the batch
            // again: duplicates, which consumers drop by event id.)
            let mut first_seen = Vec::new();
            let mut seen = HashSet::new();
            for id in &arrived {
                if seen.insert(*id) {
                    first_seen.push(*id);
                } else {
                    duplicates += 1;
                }
            }
            ensure!(
                &first_seen == ids,
                "{name}: customer {customer} in delivery order {first_seen:?}, booked in order {ids:?}"
            );
        }
        tracing::info!(
            name,
            kills,
            duplicates,
            "bookings delivered: lost 0, disorder 0"
        );
    }
    Ok(())
}
