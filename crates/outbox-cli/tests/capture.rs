//! `outbox capture` (docs/capture.md) against a real PostgreSQL: a business table's writes
//! become outbox events in the same transaction, through a trigger the command installs.
//!
//! - Concurrent writers on a few customers, some rolling back, with `outbox relay` running
//!   into a file sink: every committed booking is published exactly once with the row as its
//!   payload, no rolled-back one is, and each customer's events arrive in commit order. The
//!   oracle does not trust the outbox: every writer transaction first bumps its customer's
//!   counter row (`UPDATE ... RETURNING n`, a row lock held to commit), so the committed `n`
//!   of one customer are 1, 2, 3, ... in commit order, and a rolled-back `n` is reused.
//! - Updates (`on = ["insert", "update"]`), column payloads (jsonb text, bytea bytes),
//!   an event type from a column, literal values that need quoting, a NULL that cannot
//!   become an event.
//! - Bad input: a clear error naming the key, and nothing created.
//! - `capture remove`.
//! - SQLite: the same, through AFTER INSERT / AFTER UPDATE triggers, relayed to a file.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use outbox_testkit::services::Postgres;
use rand::Rng;
use sqlx::PgPool;
use support::{Output, Workdir, terminate, wait_drained};
use uuid::Uuid;

const CUSTOMERS: [&str; 3] = ["c1", "c2", "c3"];
const WRITERS: usize = 6;
const TX_PER_WRITER: usize = 30;

const BOOKINGS: &str = r#"
CREATE TABLE customers (id text PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
INSERT INTO customers (id) VALUES ('c1'), ('c2'), ('c3');
CREATE TABLE bookings (
    id          uuid        PRIMARY KEY,
    customer_id text        NOT NULL,
    n           bigint      NOT NULL,
    seats       integer     NOT NULL,
    note        text,
    kind        text,
    booked_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
"#;

const BOOKINGS_CAPTURE: &str = r#"
[[capture]]
table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
"#;

fn config(url: &str, extra: &str) -> String {
    format!(
        "[source]\nkind = \"postgres\"\nurl = \"{url}\"\n[relay]\nbatch_size = 7\nworkers = 2\npoll_interval = \"5ms\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n{extra}"
    )
}

async fn run_ok(work: &Workdir, args: &[&str]) -> anyhow::Result<Output> {
    let out = work.run(args).await?;
    ensure!(out.code == Some(0), "outbox {args:?} failed: {out:?}");
    Ok(out)
}

/// A database with the outbox migrated and `ddl` run; its URL and a pool.
async fn database(work: &Workdir, ddl: &str) -> anyhow::Result<(String, PgPool)> {
    let pg = Postgres::shared().await?;
    let url = pg.fresh_database().await?;
    let cfg = work.write_config("migrate.toml", &config(&url, ""))?;
    run_ok(
        work,
        &["migrate", "--config", cfg.to_str().context("path")?],
    )
    .await?;
    let pool = PgPool::connect(&url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.to_owned()))
        .execute(&pool)
        .await?;
    Ok((url, pool))
}

/// User triggers and capture functions in the database: what a failed install must not
/// leave behind.
async fn capture_objects(pool: &PgPool) -> anyhow::Result<(i64, i64)> {
    let triggers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
         JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE NOT t.tgisinternal AND c.relname NOT LIKE 'outbox%' AND n.nspname NOT IN ('pg_catalog', 'information_schema')",
    )
    .fetch_one(pool)
    .await?;
    let functions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc WHERE proname LIKE '%\\_outbox\\_capture'",
    )
    .fetch_one(pool)
    .await?;
    Ok((triggers, functions))
}

async fn outbox_count(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(pool)
        .await?)
}

/// The JSON lines the file sink wrote.
fn published(work: &Workdir) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(work.path().join("events.jsonl")).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad line {l}")))
        .collect()
}

/// Pending events in the outbox (SQLite, MySQL).
const PENDING: &str = "SELECT count(*) FROM outbox WHERE state = 'pending'";

/// Runs `outbox relay` with `cfg_path` until `drained` holds (a readiness wait, not a
/// timed assertion: up to 120 s on a busy machine), then stops it; it must exit 0.
async fn relay_until_drained<F, Fut>(
    work: &Workdir,
    cfg_path: &std::path::Path,
    drained: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut relay = work.spawn_relay(cfg_path, "relay.log")?;
    outbox_testkit::wait::eventually(Duration::from_secs(120), drained)
        .await
        .with_context(|| work.read_log("relay.log"))?;
    ensure!(
        terminate(&mut relay, Duration::from_secs(30)).await? == Some(0),
        "relay did not exit 0:\n{}",
        work.read_log("relay.log")
    );
    Ok(())
}

/// What one writer did: committed bookings (customer, n, id) and rolled-back booking ids.
#[derive(Default)]
struct Written {
    committed: Vec<(String, i64, Uuid)>,
    rolled_back: Vec<Uuid>,
}

/// Books one seat count for a customer in the transaction: returns the customer's new `n`
/// and the booking's id.
type Book<DB> = for<'t> fn(
    &'t mut sqlx::Transaction<'static, DB>,
    &'static str,
    i32,
    String,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = anyhow::Result<(i64, Uuid)>> + Send + 't>,
>;

/// One writer's transactions: each books 1 or 2 seats for a random customer through
/// `book` (which bumps the customer's counter `n`, inserts the booking, and returns `n` and
/// the booking's id), and about 15 % roll back (writer 0's fourth always does).
async fn write_bookings<DB: sqlx::Database>(
    pool: sqlx::Pool<DB>,
    w: usize,
    book: Book<DB>,
) -> anyhow::Result<Written> {
    let mut out = Written::default();
    for t in 0..TX_PER_WRITER {
        let (customer, bookings, rollback) = {
            let mut rng = rand::rng();
            (
                CUSTOMERS[rng.random_range(0..CUSTOMERS.len())],
                rng.random_range(1..=2_i32),
                // At least one rollback for sure, more at random.
                (w == 0 && t == 3) || rng.random_bool(0.15),
            )
        };
        let mut tx = pool.begin().await?;
        let mut this = Vec::new();
        for b in 0..bookings {
            let note = format!("writer {w}'s \"booking\" ☂ {t}");
            let (n, id) = book(&mut tx, customer, b + 1, note).await?;
            this.push((customer.to_owned(), n, id));
        }
        if rollback {
            tx.rollback().await?;
            out.rolled_back.extend(this.iter().map(|(_, _, id)| *id));
        } else {
            tx.commit().await?;
            out.committed.extend(this);
        }
    }
    Ok(out)
}

async fn writer(pool: PgPool, w: usize) -> anyhow::Result<Written> {
    write_bookings(pool, w, |tx, customer, seats, note| {
        Box::pin(async move {
            // The oracle: the customer's row lock orders these transactions, and `n` counts
            // their committed bookings in commit order.
            let n: i64 =
                sqlx::query_scalar("UPDATE customers SET n = n + 1 WHERE id = $1 RETURNING n")
                    .bind(customer)
                    .fetch_one(&mut **tx)
                    .await?;
            let id = Uuid::new_v4();
            sqlx::query(
            "INSERT INTO bookings (id, customer_id, n, seats, note) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id)
        .bind(customer)
        .bind(n)
        .bind(seats)
        .bind(note)
        .execute(&mut **tx)
        .await?;
            Ok((n, id))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn captured_inserts_are_published_once_in_commit_order_and_rolled_back_ones_never()
-> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (url, pool) = database(&work, BOOKINGS).await?;
    let cfg_path = work.write_config("outbox.toml", &config(&url, BOOKINGS_CAPTURE))?;
    let cfg = cfg_path.to_str().context("path")?;
    let out = run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains("capture bookings: installed")
            && out.stdout.contains("public.bookings"),
        "{out:?}"
    );
    // Idempotent: a second install replaces, it does not add a second trigger.
    let out = run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    ensure!(out.stdout.contains("capture bookings: replaced"), "{out:?}");
    ensure!(
        capture_objects(&pool).await? == (1, 1),
        "one trigger, one function"
    );

    let mut relay = work.spawn_relay(&cfg_path, "relay.log")?;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(pool.clone(), w)))
        .collect();
    let mut committed = Vec::new();
    let mut rolled_back = HashSet::new();
    for w in writers {
        let written = w.await??;
        committed.extend(written.committed);
        rolled_back.extend(written.rolled_back);
    }
    ensure!(!rolled_back.is_empty(), "no transaction rolled back");
    wait_drained(&pool, Duration::from_secs(60))
        .await
        .with_context(|| work.read_log("relay.log"))?;
    ensure!(
        terminate(&mut relay, Duration::from_secs(30)).await? == Some(0),
        "relay did not exit 0:\n{}",
        work.read_log("relay.log")
    );

    let rows: Vec<(Uuid, serde_json::Value)> =
        sqlx::query_as("SELECT id, to_jsonb(b) FROM bookings AS b")
            .fetch_all(&pool)
            .await?;
    let rows: HashMap<Uuid, serde_json::Value> = rows.into_iter().collect();
    ensure!(
        rows.len() == committed.len(),
        "{} bookings in the table, {} committed",
        rows.len(),
        committed.len()
    );

    // Each event once (a redelivery would repeat an event id, which is allowed; a second
    // event for one booking is not).
    let mut events_of: HashMap<Uuid, HashSet<String>> = HashMap::new();
    let mut order: HashMap<String, Vec<i64>> = HashMap::new();
    let mut seen = HashSet::new();
    for line in published(&work)? {
        let payload = &line["payload"];
        let booking: Uuid = payload["id"]
            .as_str()
            .context("payload without id")?
            .parse()?;
        ensure!(
            !rolled_back.contains(&booking),
            "a rolled-back booking was published: {line}"
        );
        ensure!(
            rows.get(&booking) == Some(payload),
            "payload is not the row: {payload} vs {:?}",
            rows.get(&booking)
        );
        let customer = payload["customer_id"].as_str().context("customer")?;
        ensure!(
            line["aggregate_type"] == "Customer"
                && line["aggregate_id"] == customer
                && line["event_type"] == "booking.created"
                && line["headers"]["capture_op"] == "insert"
                && line["headers"]["capture_table"] == "public.bookings",
            "unexpected event: {line}"
        );
        let id = line["id"].as_str().context("id")?.to_owned();
        events_of.entry(booking).or_default().insert(id.clone());
        if seen.insert(id) {
            order
                .entry(customer.to_owned())
                .or_default()
                .push(payload["n"].as_i64().context("n")?);
        }
    }
    for (_, _, booking) in &committed {
        let n = events_of.get(booking).map_or(0, HashSet::len);
        ensure!(n == 1, "booking {booking} produced {n} events");
    }
    ensure!(
        events_of.len() == committed.len(),
        "events of unknown bookings"
    );
    for customer in CUSTOMERS {
        let expected: Vec<i64> = (1..=committed.iter().filter(|(c, _, _)| c == customer).count())
            .map(|n| i64::try_from(n).expect("small"))
            .collect();
        let got = order.get(customer).cloned().unwrap_or_default();
        ensure!(
            got == expected,
            "customer {customer}: published n = {got:?}, commit order is {expected:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_column_payloads_and_quoted_values_are_captured_as_configured() -> anyhow::Result<()>
{
    let work = Workdir::new()?;
    let (url, pool) = database(
        &work,
        "CREATE SCHEMA shop;
         CREATE TABLE shop.orders (id bigint PRIMARY KEY, status text, doc jsonb NOT NULL);
         CREATE TABLE blobs (id integer PRIMARY KEY, body bytea NOT NULL);",
    )
    .await?;
    // TOML `\\` is one backslash: the aggregate type is `Order 'x' \ "y"`.
    let cfg_path = work.write_config(
        "outbox.toml",
        &config(
            &url,
            r#"
[[capture]]
table = "shop.orders"
name = "orders"
aggregate_type = "Order 'x' \\ \"y\""
aggregate_id = "id"
event_type_column = "status"
payload = "doc"
on = ["insert", "update"]

[[capture]]
table = "blobs"
aggregate_type = "Blob"
aggregate_id = "id"
event_type = "blob.stored"
payload = "body"
"#,
        ),
    )?;
    let cfg = cfg_path.to_str().context("path")?;
    run_ok(&work, &["capture", "install", "--config", cfg]).await?;

    sqlx::raw_sql(
        r#"INSERT INTO shop.orders VALUES (1, 'order.placed', '{"total": 10}');
           UPDATE shop.orders SET status = 'order.paid', doc = '{"total": 10, "paid": true}' WHERE id = 1;
           INSERT INTO blobs VALUES (7, '\xff0001');
           UPDATE blobs SET body = '\x00' WHERE id = 7;"#,
    )
    .execute(&pool)
    .await?;
    type Row = (String, String, String, Vec<u8>, serde_json::Value);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, event_type, payload, headers FROM outbox ORDER BY seq",
    )
    .fetch_all(&pool)
    .await?;
    let headers =
        |op: &str, table: &str| serde_json::json!({"capture_op": op, "capture_table": table});
    let order = "Order 'x' \\ \"y\"".to_owned();
    let expected: Vec<Row> = vec![
        (
            order.clone(),
            "1".into(),
            "order.placed".into(),
            br#"{"total": 10}"#.to_vec(),
            headers("insert", "shop.orders"),
        ),
        (
            order.clone(),
            "1".into(),
            "order.paid".into(),
            br#"{"paid": true, "total": 10}"#.to_vec(),
            headers("update", "shop.orders"),
        ),
        // The blob capture is on insert only: the update made no event.
        (
            "Blob".into(),
            "7".into(),
            "blob.stored".into(),
            vec![0xff, 0x00, 0x01],
            headers("insert", "public.blobs"),
        ),
    ];
    ensure!(
        rows == expected,
        "outbox rows:\n{rows:#?}\nexpected:\n{expected:#?}"
    );

    // A row that cannot become an event (no event type) is refused with the write.
    let err = sqlx::query("INSERT INTO shop.orders VALUES (2, NULL, '{}')")
        .execute(&pool)
        .await
        .expect_err("a NULL event type must fail the write");
    ensure!(
        err.to_string().contains(
            "outbox capture of shop.orders: the event_type column of the written row is NULL"
        ),
        "{err}"
    );
    ensure!(outbox_count(&pool).await? == 3);

    let out = run_ok(&work, &["capture", "list", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains("orders") && out.stdout.contains("on shop.orders (insert, update)"),
        "{out:?}"
    );
    ensure!(out.stdout.contains("on public.blobs (insert)"), "{out:?}");
    let out = run_ok(&work, &["capture", "list", "--json", "--config", cfg]).await?;
    let list: serde_json::Value = serde_json::from_str(&out.stdout)?;
    let by_name = |n: &str| {
        list.as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == n))
            .cloned()
            .unwrap_or_default()
    };
    ensure!(
        by_name("orders")["on"] == serde_json::json!(["insert", "update"])
            && by_name("orders")["enabled"] == true
            && by_name("orders")["config"]["aggregate_type"] == order.as_str()
            && by_name("blobs")["table"] == "public.blobs",
        "{list:#}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_captures_are_refused_by_key_and_create_nothing() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (url, pool) = database(&work, BOOKINGS).await?;
    let cases = [
        (
            r#"table = "nope"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created""#,
            "capture[0].table: table public.nope does not exist",
        ),
        (
            r#"table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer"
event_type = "booking.created""#,
            "capture[0].aggregate_id: column `customer` does not exist in table public.bookings",
        ),
        (
            r#"table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
event_type_column = "kind""#,
            "capture[0].event_type: set either event_type or event_type_column, not both",
        ),
        (
            r#"table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"
payload = "seats""#,
            "capture[0].payload: column `seats` of table public.bookings is of type integer",
        ),
        (
            r#"table = "outbox"
aggregate_type = "Outbox"
aggregate_id = "aggregate_id"
event_type = "again""#,
            "capture[0].table: public.outbox is the outbox table itself",
        ),
        // The first entry is fine, the second is not: neither is installed.
        (
            r#"table = "bookings"
aggregate_type = "Customer"
aggregate_id = "customer_id"
event_type = "booking.created"

[[capture]]
table = "customers"
aggregate_type = "Customer"
aggregate_id = "id"
event_type_column = "status""#,
            "capture[1].event_type_column: column `status` does not exist in table public.customers",
        ),
    ];
    for (i, (entry, needle)) in cases.iter().enumerate() {
        let cfg_path = work.write_config(
            &format!("bad-{i}.toml"),
            &config(&url, &format!("[[capture]]\n{entry}\n")),
        )?;
        let out = work
            .run(&[
                "capture",
                "install",
                "--config",
                cfg_path.to_str().context("path")?,
            ])
            .await?;
        out.assert_clear_error(needle)
            .with_context(|| format!("case {i}"))?;
        ensure!(
            capture_objects(&pool).await? == (0, 0),
            "case {i}: a failed install left a trigger or function behind"
        );
    }

    // --name that no entry has.
    let cfg_path = work.write_config("outbox.toml", &config(&url, BOOKINGS_CAPTURE))?;
    let cfg = cfg_path.to_str().context("path")?;
    work.run(&["capture", "install", "--name", "flights", "--config", cfg])
        .await?
        .assert_clear_error("--name flights: no [[capture]] entry has this name")?;

    // A table held by a long transaction: the install gives up after its lock_timeout,
    // says why, and the entry installed before it in the same run is rolled back too.
    let two = work.write_config(
        "two.toml",
        &config(
            &url,
            &format!(
                "{BOOKINGS_CAPTURE}\n[[capture]]\ntable = \"customers\"\naggregate_type = \"Customer\"\naggregate_id = \"id\"\nevent_type = \"customer.created\"\n"
            ),
        ),
    )?;
    let mut holder = pool.begin().await?;
    sqlx::query("LOCK TABLE customers IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await?;
    let out = work
        .run(&[
            "capture",
            "install",
            "--config",
            two.to_str().context("path")?,
        ])
        .await?;
    holder.rollback().await?;
    out.assert_clear_error("was not granted within 10s")?;
    ensure!(out.stderr.contains("public.customers"), "{out:?}");
    ensure!(
        capture_objects(&pool).await? == (0, 0),
        "a failed install left a trigger or function behind"
    );

    // No outbox table: say to migrate.
    let pg = Postgres::shared().await?;
    let bare = pg.fresh_database().await?;
    let bare_pool = PgPool::connect(&bare).await?;
    sqlx::raw_sql(BOOKINGS).execute(&bare_pool).await?;
    let cfg_path = work.write_config("bare.toml", &config(&bare, BOOKINGS_CAPTURE))?;
    let out = work
        .run(&[
            "capture",
            "install",
            "--config",
            cfg_path.to_str().context("path")?,
        ])
        .await?;
    out.assert_clear_error("outbox table public.outbox does not exist")?;
    ensure!(out.stderr.contains("run `outbox migrate` first"), "{out:?}");
    ensure!(capture_objects(&bare_pool).await? == (0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_capture_makes_no_more_events() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (url, pool) = database(&work, BOOKINGS).await?;
    let cfg_path = work.write_config("outbox.toml", &config(&url, BOOKINGS_CAPTURE))?;
    let cfg = cfg_path.to_str().context("path")?;
    run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    let insert =
        "INSERT INTO bookings (id, customer_id, n, seats) VALUES (gen_random_uuid(), 'c1', 0, 1)";
    sqlx::query(insert).execute(&pool).await?;
    ensure!(outbox_count(&pool).await? == 1, "the capture made no event");

    let out = run_ok(&work, &["capture", "remove", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains(
            "capture bookings: removed trigger bookings_outbox_capture from public.bookings"
        ),
        "{out:?}"
    );
    sqlx::query(insert).execute(&pool).await?;
    ensure!(
        outbox_count(&pool).await? == 1,
        "an insert after `capture remove` made an event"
    );
    ensure!(capture_objects(&pool).await? == (0, 0));

    // Again: nothing to do, not an error; and the list is empty.
    let out = run_ok(
        &work,
        &["capture", "remove", "--name", "bookings", "--config", cfg],
    )
    .await?;
    ensure!(out.stdout.contains("not installed"), "{out:?}");
    let out = run_ok(&work, &["capture", "list", "--config", cfg]).await?;
    ensure!(
        out.stdout
            .contains("no capture writes into outbox table public.outbox"),
        "{out:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// SQLite: AFTER INSERT / AFTER UPDATE triggers, the entry recorded in `outbox_capture`.

const SQLITE_BOOKINGS: &str = "CREATE TABLE bookings (
    id          TEXT    PRIMARY KEY,
    customer_id TEXT,
    seats       INTEGER NOT NULL,
    price       REAL,
    note        TEXT,
    status      TEXT,
    doc         JSON,
    raw         BLOB
)";

const SQLITE_CAPTURE: &str = r#"
[[capture]]
table = "bookings"
aggregate_type = "Customer 'O\\Brien'"
aggregate_id = "customer_id"
event_type = "booking.changed"
on = ["insert", "update"]

[[capture]]
table = "bookings"
name = "bookings_docs"
aggregate_type = "Doc"
aggregate_id = "id"
event_type_column = "status"
payload = "doc"
"#;

fn sqlite_config(extra: &str) -> String {
    format!(
        "[source]\nkind = \"sqlite\"\npath = \"outbox.db\"\n[relay]\nbatch_size = 7\npoll_interval = \"5ms\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n{extra}"
    )
}

/// The outbox file, migrated, with `ddl` run; a pool on it.
async fn sqlite_database(work: &Workdir, ddl: &str) -> anyhow::Result<sqlx::SqlitePool> {
    let cfg = work.write_config("migrate.toml", &sqlite_config(""))?;
    run_ok(
        work,
        &["migrate", "--config", cfg.to_str().context("path")?],
    )
    .await?;
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(work.path().join("outbox.db"))
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl.to_owned()))
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// Triggers and capture records in the SQLite file.
async fn sqlite_capture_objects(pool: &sqlx::SqlitePool) -> anyhow::Result<(i64, i64)> {
    let triggers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_schema WHERE type = 'trigger'")
            .fetch_one(pool)
            .await?;
    let has_records: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'outbox_capture'",
    )
    .fetch_one(pool)
    .await?;
    let records = if has_records == 0 {
        0
    } else {
        sqlx::query_scalar("SELECT count(*) FROM outbox_capture")
            .fetch_one(pool)
            .await?
    };
    Ok((triggers, records))
}

type SqliteEvent = (String, String, String, Vec<u8>, String);

/// An expected event: aggregate type and id, event type, the payload as JSON (a row) or as
/// bytes (a column), headers.
type Expected = (
    String,
    String,
    String,
    Option<serde_json::Value>,
    Vec<u8>,
    String,
);

async fn sqlite_events(pool: &sqlx::SqlitePool) -> anyhow::Result<Vec<SqliteEvent>> {
    Ok(sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, event_type, payload, headers FROM outbox ORDER BY seq",
    )
    .fetch_all(pool)
    .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_capture_turns_inserts_and_updates_into_events_in_commit_order() -> anyhow::Result<()>
{
    let work = Workdir::new()?;
    let pool = sqlite_database(&work, SQLITE_BOOKINGS).await?;
    let cfg_path = work.write_config("outbox.toml", &sqlite_config(SQLITE_CAPTURE))?;
    let cfg = cfg_path.to_str().context("path")?;
    let out = run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains("capture bookings: installed trigger bookings_outbox_capture_insert, bookings_outbox_capture_update on bookings (insert, update)")
            && out.stdout.contains("capture bookings_docs: installed trigger bookings_docs_outbox_capture_insert on bookings (insert)"),
        "{out:?}"
    );
    // Idempotent: a second install replaces, it does not add triggers.
    let out = run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    ensure!(out.stdout.contains("capture bookings: replaced"), "{out:?}");
    ensure!(
        sqlite_capture_objects(&pool).await? == (3, 2),
        "three triggers, two records: {:?}",
        sqlite_capture_objects(&pool).await?
    );

    // Insert, then update, then a rolled-back insert, then a second customer.
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO bookings VALUES ('b1', 'c1', 2, 9.5, 'it''s \"x\" ☂', 'booking.placed', '{\"n\":1}', x'ff00')")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    sqlx::query("UPDATE bookings SET seats = 3 WHERE id = 'b1'")
        .execute(&pool)
        .await?;
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO bookings (id, customer_id, seats, status, doc) VALUES ('b2', 'c1', 1, 's', '{}')")
        .execute(&mut *tx)
        .await?;
    tx.rollback().await?;
    sqlx::query("INSERT INTO bookings (id, customer_id, seats, status, doc) VALUES (7, 'c2', 1, 'booking.placed', '{\"n\":2}')")
        .execute(&pool)
        .await?;

    let customer = "Customer 'O\\Brien'".to_owned();
    let headers = |op: &str| format!(r#"{{"capture_op":"{op}","capture_table":"bookings"}}"#);
    let row1 = |seats: i64| {
        serde_json::json!({"id": "b1", "customer_id": "c1", "seats": seats, "price": 9.5,
            "note": "it's \"x\" ☂", "status": "booking.placed", "doc": "{\"n\":1}", "raw": "FF00"})
    };
    let events = sqlite_events(&pool).await?;
    let expected: Vec<Expected> = vec![
        (
            customer.clone(),
            "c1".into(),
            "booking.changed".into(),
            Some(row1(2)),
            vec![],
            headers("insert"),
        ),
        (
            "Doc".into(),
            "b1".into(),
            "booking.placed".into(),
            None,
            br#"{"n":1}"#.to_vec(),
            headers("insert"),
        ),
        (
            customer.clone(),
            "c1".into(),
            "booking.changed".into(),
            Some(row1(3)),
            vec![],
            headers("update"),
        ),
        (
            customer.clone(),
            "c2".into(),
            "booking.changed".into(),
            Some(
                serde_json::json!({"id": "7", "customer_id": "c2", "seats": 1, "price": null,
            "note": null, "status": "booking.placed", "doc": "{\"n\":2}", "raw": null}),
            ),
            vec![],
            headers("insert"),
        ),
        (
            "Doc".into(),
            "7".into(),
            "booking.placed".into(),
            None,
            br#"{"n":2}"#.to_vec(),
            headers("insert"),
        ),
    ];
    // Two captures of one row fire in an order SQLite does not define: compare each
    // capture's events (in seq order) with its own expected list.
    ensure!(events.len() == expected.len(), "events: {events:#?}");
    let mut sorted: Vec<&SqliteEvent> = events.iter().filter(|e| e.0 != "Doc").collect();
    sorted.extend(events.iter().filter(|e| e.0 == "Doc"));
    let mut expected_sorted: Vec<_> = expected.iter().filter(|e| e.0 != "Doc").collect();
    expected_sorted.extend(expected.iter().filter(|e| e.0 == "Doc"));
    for (got, want) in sorted.into_iter().zip(expected_sorted) {
        ensure!(
            got.0 == want.0 && got.1 == want.1 && got.2 == want.2 && got.4 == want.5,
            "event {got:?}, expected {want:?}"
        );
        match &want.3 {
            Some(json) => {
                let payload: serde_json::Value = serde_json::from_slice(&got.3)?;
                ensure!(&payload == json, "payload {payload} expected {json}");
            }
            None => ensure!(
                got.3 == want.4,
                "payload {:?}",
                String::from_utf8_lossy(&got.3)
            ),
        }
    }
    // The outbox's own defaults: a UUIDv7 id and a creation time.
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM outbox ORDER BY seq")
        .fetch_all(&pool)
        .await?;
    for id in &ids {
        ensure!(
            Uuid::parse_str(id)?.get_version_num() == 7,
            "id {id} is not a UUIDv7"
        );
    }

    // A row that cannot become an event fails the write, and nothing is written.
    let err = sqlx::query("INSERT INTO bookings (id, customer_id, seats, status, doc) VALUES ('b3', NULL, 1, 's', '{}')")
        .execute(&pool)
        .await
        .expect_err("a NULL aggregate_id must fail the write");
    ensure!(
        err.to_string().contains(
            "outbox capture of bookings: the aggregate_id column of the written row is NULL"
        ),
        "{err}"
    );
    ensure!(sqlite_events(&pool).await?.len() == 5);

    // list shows both, with their ops.
    let out = run_ok(&work, &["capture", "list", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains("on bookings (insert, update)") && out.stdout.contains("bookings_docs"),
        "{out:?}"
    );
    let out = run_ok(&work, &["capture", "list", "--json", "--config", cfg]).await?;
    let list: serde_json::Value = serde_json::from_str(&out.stdout)?;
    ensure!(
        list[0]["name"] == "bookings"
            && list[0]["on"] == serde_json::json!(["insert", "update"])
            && list[0]["config"]["aggregate_type"] == customer.as_str()
            && list[1]["name"] == "bookings_docs"
            && list[1]["on"] == serde_json::json!(["insert"]),
        "{list:#}"
    );

    // Relayed end to end into the file sink, in order, with aggregate_seq.
    relay_until_drained(&work, &cfg_path, || async {
        sqlx::query_scalar::<_, i64>(PENDING)
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 0)
    })
    .await?;
    let lines = published(&work)?;
    let c1: Vec<(&str, &str)> = lines
        .iter()
        .filter(|l| l["aggregate_id"] == "c1")
        .map(|l| {
            (
                l["headers"]["capture_op"].as_str().unwrap_or_default(),
                l["headers"]["aggregate_seq"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    ensure!(
        c1 == vec![("insert", "1"), ("update", "2")],
        "customer c1: {c1:?} in {lines:#?}"
    );
    ensure!(lines.len() == 5, "{lines:#?}");

    // remove drops the triggers and the records; writes make no more events.
    let out = run_ok(&work, &["capture", "remove", "--config", cfg]).await?;
    ensure!(
        out.stdout
            .contains("capture bookings: removed triggers bookings_outbox_capture_* from bookings"),
        "{out:?}"
    );
    ensure!(sqlite_capture_objects(&pool).await? == (0, 0));
    sqlx::query("UPDATE bookings SET seats = 4")
        .execute(&pool)
        .await?;
    ensure!(
        sqlite_events(&pool).await?.len() == 5,
        "an update after remove made an event"
    );
    let out = run_ok(&work, &["capture", "list", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains("no capture writes into outbox table"),
        "{out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_bad_captures_are_refused_by_key_and_create_nothing() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let pool = sqlite_database(&work, SQLITE_BOOKINGS).await?;
    let cases = [
        (
            "table = \"nope\"\naggregate_type = \"C\"\naggregate_id = \"customer_id\"\nevent_type = \"e\"",
            "capture[0].table: table nope does not exist",
        ),
        (
            "table = \"bookings\"\naggregate_type = \"C\"\naggregate_id = \"customer\"\nevent_type = \"e\"",
            "capture[0].aggregate_id: column `customer` does not exist in table bookings",
        ),
        (
            "table = \"bookings\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"e\"\npayload = \"seats\"",
            "capture[0].payload: column `seats` of table bookings is of type INTEGER",
        ),
        (
            "table = \"app.bookings\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"e\"",
            "capture[0].table: `app.bookings`: SQLite has no schemas",
        ),
        (
            "table = \"outbox\"\naggregate_type = \"C\"\naggregate_id = \"aggregate_id\"\nevent_type = \"e\"",
            "capture[0].table: outbox is the outbox table itself",
        ),
        // The first entry is fine, the second is not: neither is installed.
        (
            "table = \"bookings\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"e\"\n\n[[capture]]\ntable = \"bookings\"\nname = \"other\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type_column = \"state\"",
            "capture[1].event_type_column: column `state` does not exist in table bookings",
        ),
    ];
    for (i, (entry, needle)) in cases.iter().enumerate() {
        let cfg_path = work.write_config(
            &format!("bad-{i}.toml"),
            &sqlite_config(&format!("[[capture]]\n{entry}\n")),
        )?;
        work.run(&[
            "capture",
            "install",
            "--config",
            cfg_path.to_str().context("path")?,
        ])
        .await?
        .assert_clear_error(needle)
        .with_context(|| format!("case {i}"))?;
        ensure!(
            sqlite_capture_objects(&pool).await? == (0, 0),
            "case {i}: a failed install left a trigger or record behind"
        );
    }
    // A trigger of the same name that is not a capture's: refused, left alone.
    sqlx::query("CREATE TRIGGER bookings_outbox_capture_insert AFTER INSERT ON bookings BEGIN SELECT 1; END")
        .execute(&pool)
        .await?;
    let cfg_path = work.write_config("clash.toml", &sqlite_config(SQLITE_CAPTURE))?;
    work.run(&["capture", "install", "--config", cfg_path.to_str().context("path")?])
        .await?
        .assert_clear_error("capture[0].name: a trigger bookings_outbox_capture_insert exists and is not an outbox capture")?;
    ensure!(sqlite_capture_objects(&pool).await? == (1, 0));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// MySQL / MariaDB: AFTER INSERT / AFTER UPDATE triggers whose insert fires the outbox's own
// BEFORE INSERT trigger (UUIDv7, per-aggregate seq from the head row).

const MYSQL_BOOKINGS: &str =
    "CREATE TABLE customers (id VARCHAR(8) PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0);
INSERT INTO customers (id) VALUES ('c1'), ('c2'), ('c3');
CREATE TABLE bookings (
    id          CHAR(36)     PRIMARY KEY,
    customer_id VARCHAR(8),
    n           BIGINT       NOT NULL,
    seats       INT          NOT NULL,
    note        VARCHAR(200) CHARACTER SET utf8mb4,
    status      VARCHAR(40),
    doc         JSON,
    raw         VARBINARY(8)
)";

fn mysql_config(url: &str, extra: &str) -> String {
    format!(
        "[source]\nkind = \"mysql\"\nurl = \"{url}\"\n[relay]\nbatch_size = 7\nworkers = 2\npoll_interval = \"5ms\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n{extra}"
    )
}

async fn mysql_database(work: &Workdir) -> anyhow::Result<(String, sqlx::MySqlPool)> {
    let url = outbox_testkit::services::MariaDb::shared()
        .await?
        .fresh_database()
        .await?;
    let cfg = work.write_config("migrate.toml", &mysql_config(&url, ""))?;
    run_ok(
        work,
        &["migrate", "--config", cfg.to_str().context("path")?],
    )
    .await?;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(8)
        .connect(&url)
        .await?;
    sqlx::raw_sql(MYSQL_BOOKINGS).execute(&pool).await?;
    Ok((url, pool))
}

/// Triggers other than the outbox's own, and capture records.
async fn mysql_capture_objects(pool: &sqlx::MySqlPool) -> anyhow::Result<(i64, i64)> {
    let triggers: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE <> 'outbox'",
    )
    .fetch_one(pool)
    .await?;
    let has: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_capture'",
    )
    .fetch_one(pool)
    .await?;
    let records = if has == 0 {
        0
    } else {
        sqlx::query_scalar("SELECT count(*) FROM outbox_capture")
            .fetch_one(pool)
            .await?
    };
    Ok((triggers, records))
}

async fn mysql_writer(pool: sqlx::MySqlPool, w: usize) -> anyhow::Result<Written> {
    write_bookings(pool, w, |tx, customer, seats, note| {
        Box::pin(async move {
            sqlx::query("UPDATE customers SET n = n + 1 WHERE id = ?")
                .bind(customer)
                .execute(&mut **tx)
                .await?;
            let n: i64 = sqlx::query_scalar("SELECT n FROM customers WHERE id = ?")
                .bind(customer)
                .fetch_one(&mut **tx)
                .await?;
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO bookings (id, customer_id, n, seats, note) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(id.to_string())
            .bind(customer)
            .bind(n)
            .bind(seats)
            .bind(note)
            .execute(&mut **tx)
            .await?;
            Ok((n, id))
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_concurrent_captured_writes_keep_per_aggregate_commit_order_and_contiguous_seq()
-> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (url, pool) = mysql_database(&work).await?;
    let cfg_path = work.write_config("outbox.toml", &mysql_config(&url, BOOKINGS_CAPTURE))?;
    let cfg = cfg_path.to_str().context("path")?;
    let out = run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains(
            "capture bookings: installed trigger bookings_outbox_capture_insert on bookings (insert)"
        ),
        "{out:?}"
    );
    let out = run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    ensure!(out.stdout.contains("capture bookings: replaced"), "{out:?}");
    ensure!(mysql_capture_objects(&pool).await? == (1, 1));

    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(mysql_writer(pool.clone(), w)))
        .collect();
    let mut committed = Vec::new();
    let mut rolled_back = HashSet::new();
    for w in writers {
        let written = w.await??;
        committed.extend(written.committed);
        rolled_back.extend(written.rolled_back);
    }
    ensure!(!rolled_back.is_empty(), "no transaction rolled back");

    // In the outbox: per customer, seq 1, 2, 3, ... with no gap, in commit order (n), one
    // event per committed booking, none for a rolled-back one, and the producer's columns.
    let rows: Vec<(String, String, i64, Vec<u8>, String, String)> = sqlx::query_as(
        "SELECT id, aggregate_id, seq, payload, headers, event_type FROM outbox ORDER BY aggregate_id, seq",
    )
    .fetch_all(&pool)
    .await?;
    ensure!(
        rows.len() == committed.len(),
        "{} events for {} committed bookings",
        rows.len(),
        committed.len()
    );
    let mut per_customer: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for (id, customer, seq, payload, headers, event_type) in &rows {
        ensure!(Uuid::parse_str(id)?.get_version_num() == 7, "id {id}");
        let payload: serde_json::Value = serde_json::from_slice(payload)?;
        let booking: Uuid = payload["id"].as_str().context("id")?.parse()?;
        ensure!(!rolled_back.contains(&booking), "rolled back: {payload}");
        let headers: serde_json::Value = serde_json::from_str(headers)?;
        ensure!(
            headers == serde_json::json!({"capture_op": "insert", "capture_table": "bookings"})
                && event_type == "booking.created"
                && payload["customer_id"] == customer.as_str(),
            "{headers} {event_type} {payload}"
        );
        per_customer
            .entry(customer.clone())
            .or_default()
            .push((*seq, payload["n"].as_i64().context("n")?));
    }
    for (customer, list) in &per_customer {
        let expected: Vec<(i64, i64)> = (1..=i64::try_from(list.len())?).map(|i| (i, i)).collect();
        ensure!(
            *list == expected,
            "customer {customer}: (seq, n) = {list:?}"
        );
    }

    // Relayed end to end: each customer's events arrive in order, with aggregate_seq.
    relay_until_drained(&work, &cfg_path, || async {
        sqlx::query_scalar::<_, i64>(PENDING)
            .fetch_one(&pool)
            .await
            .is_ok_and(|n| n == 0)
    })
    .await?;
    let mut published_n: HashMap<String, Vec<(i64, String)>> = HashMap::new();
    let mut seen = HashSet::new();
    for line in published(&work)? {
        if seen.insert(line["id"].as_str().context("id")?.to_owned()) {
            published_n
                .entry(
                    line["aggregate_id"]
                        .as_str()
                        .context("aggregate")?
                        .to_owned(),
                )
                .or_default()
                .push((
                    line["payload"]["n"].as_i64().context("n")?,
                    line["headers"]["aggregate_seq"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ));
        }
    }
    for (customer, list) in &per_customer {
        let expected: Vec<(i64, String)> = (1..=i64::try_from(list.len())?)
            .map(|i| (i, i.to_string()))
            .collect();
        ensure!(
            published_n.get(customer) == Some(&expected),
            "customer {customer}: published (n, aggregate_seq) = {:?}",
            published_n.get(customer)
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_updates_payloads_list_remove_and_bad_input() -> anyhow::Result<()> {
    let work = Workdir::new()?;
    let (url, pool) = mysql_database(&work).await?;
    let capture = r#"
[[capture]]
table = "bookings"
aggregate_type = "Customer 'O\\Brien'"
aggregate_id = "customer_id"
event_type = "booking.changed"
on = ["insert", "update"]

[[capture]]
table = "bookings"
name = "bookings_docs"
aggregate_type = "Doc"
aggregate_id = "id"
event_type_column = "status"
payload = "doc"
"#;
    // Refused input first: nothing may be created.
    let cases = [
        (
            "table = \"nope\"\naggregate_type = \"C\"\naggregate_id = \"customer_id\"\nevent_type = \"e\"",
            "capture[0].table: table nope does not exist",
        ),
        (
            "table = \"bookings\"\naggregate_type = \"C\"\naggregate_id = \"customer\"\nevent_type = \"e\"",
            "capture[0].aggregate_id: column `customer` does not exist in table bookings",
        ),
        (
            "table = \"bookings\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"e\"\npayload = \"seats\"",
            "capture[0].payload: column `seats` of table bookings is of type int",
        ),
        (
            "table = \"other_db.bookings\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"e\"",
            "capture[0].table: `other_db.bookings`: MySQL captures tables of the outbox's own database",
        ),
        (
            "table = \"outbox\"\naggregate_type = \"C\"\naggregate_id = \"aggregate_id\"\nevent_type = \"e\"",
            "capture[0].table: outbox is the outbox table itself",
        ),
        (
            "table = \"bookings\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"e\"\n\n[[capture]]\ntable = \"customers\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type_column = \"state\"",
            "capture[1].event_type_column: column `state` does not exist in table customers",
        ),
    ];
    for (i, (entry, needle)) in cases.iter().enumerate() {
        let cfg_path = work.write_config(
            &format!("bad-{i}.toml"),
            &mysql_config(&url, &format!("[[capture]]\n{entry}\n")),
        )?;
        work.run(&[
            "capture",
            "install",
            "--config",
            cfg_path.to_str().context("path")?,
        ])
        .await?
        .assert_clear_error(needle)
        .with_context(|| format!("case {i}"))?;
        ensure!(
            mysql_capture_objects(&pool).await? == (0, 0),
            "case {i}: a failed install left a trigger or record behind"
        );
    }

    let cfg_path = work.write_config("outbox.toml", &mysql_config(&url, capture))?;
    let cfg = cfg_path.to_str().context("path")?;
    run_ok(&work, &["capture", "install", "--config", cfg]).await?;
    ensure!(mysql_capture_objects(&pool).await? == (3, 2));

    sqlx::raw_sql(
        r#"INSERT INTO bookings VALUES ('b1', 'c1', 1, 2, 'it''s ☂', 'booking.placed', '{"k": 1}', X'FF00');
           UPDATE bookings SET seats = 3 WHERE id = 'b1';"#,
    )
    .execute(&pool)
    .await?;
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO bookings (id, customer_id, n, seats, status, doc) VALUES ('b2', 'c1', 2, 1, 's', '{}')")
        .execute(&mut *tx)
        .await?;
    tx.rollback().await?;
    let err = sqlx::query("INSERT INTO bookings (id, customer_id, n, seats, status, doc) VALUES ('b3', NULL, 2, 1, 's', '{}')")
        .execute(&pool)
        .await
        .expect_err("a NULL aggregate_id must fail the write");
    ensure!(
        err.to_string().contains(
            "outbox capture of bookings: the aggregate_id column of the written row is NULL"
        ),
        "{err}"
    );
    type Row = (String, String, String, i64, Vec<u8>, String);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT aggregate_type, aggregate_id, event_type, seq, payload, headers FROM outbox ORDER BY aggregate_type, seq",
    )
    .fetch_all(&pool)
    .await?;
    let customer = "Customer 'O\\Brien'";
    let row = |seats: i64| {
        serde_json::json!({"id": "b1", "customer_id": "c1", "n": 1, "seats": seats, "note": "it's ☂",
            "status": "booking.placed", "doc": {"k": 1}, "raw": "FF00"})
    };
    ensure!(rows.len() == 3, "{rows:#?}");
    let json = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).unwrap_or_default();
    let headers = |h: &str| serde_json::from_str::<serde_json::Value>(h).unwrap_or_default();
    ensure!(
        (
            rows[0].0.as_str(),
            rows[0].1.as_str(),
            rows[0].2.as_str(),
            rows[0].3
        ) == ("Customer 'O\\Brien'", "c1", "booking.changed", 1)
            && json(&rows[0].4) == row(2)
            && headers(&rows[0].5)
                == serde_json::json!({"capture_op": "insert", "capture_table": "bookings"}),
        "{:?} {}",
        rows[0],
        String::from_utf8_lossy(&rows[0].4)
    );
    ensure!(
        (rows[1].0.as_str(), rows[1].1.as_str(), rows[1].3) == (customer, "c1", 2)
            && json(&rows[1].4) == row(3)
            && headers(&rows[1].5)["capture_op"] == "update",
        "{:?}",
        rows[1]
    );
    ensure!(
        (
            rows[2].0.as_str(),
            rows[2].1.as_str(),
            rows[2].2.as_str(),
            rows[2].3
        ) == ("Doc", "b1", "booking.placed", 1)
            && json(&rows[2].4) == serde_json::json!({"k": 1}),
        "{:?}",
        rows[2]
    );

    let out = run_ok(&work, &["capture", "list", "--json", "--config", cfg]).await?;
    let list: serde_json::Value = serde_json::from_str(&out.stdout)?;
    ensure!(
        list[0]["name"] == "bookings"
            && list[0]["table"] == "bookings"
            && list[0]["on"] == serde_json::json!(["insert", "update"])
            && list[0]["config"]["aggregate_type"] == customer
            && list[1]["name"] == "bookings_docs"
            && list[1]["on"] == serde_json::json!(["insert"]),
        "{list:#}"
    );

    // A trigger of another capture's name that is not one: refused, nothing else created.
    sqlx::query("CREATE TRIGGER customers_outbox_capture_insert AFTER INSERT ON customers FOR EACH ROW SET @x = 1")
        .execute(&pool)
        .await?;
    let clash = work.write_config(
        "clash.toml",
        &mysql_config(
            &url,
            "[[capture]]\ntable = \"customers\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"e\"\n",
        ),
    )?;
    work.run(&["capture", "install", "--config", clash.to_str().context("path")?])
        .await?
        .assert_clear_error("capture[0].name: a trigger customers_outbox_capture_insert exists and is not an outbox capture")?;
    sqlx::query("DROP TRIGGER customers_outbox_capture_insert")
        .execute(&pool)
        .await?;

    let out = run_ok(&work, &["capture", "remove", "--config", cfg]).await?;
    ensure!(
        out.stdout
            .contains("capture bookings: removed triggers bookings_outbox_capture_* from bookings")
            && out.stdout.contains("capture bookings_docs: removed"),
        "{out:?}"
    );
    ensure!(mysql_capture_objects(&pool).await? == (0, 0));
    sqlx::query("UPDATE bookings SET seats = 4")
        .execute(&pool)
        .await?;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&pool)
        .await?;
    ensure!(n == 3, "a write after remove made an event");
    let out = run_ok(&work, &["capture", "list", "--config", cfg]).await?;
    ensure!(
        out.stdout.contains("no capture writes into outbox table"),
        "{out:?}"
    );

    // A failure after the first entry's triggers were replaced (the second table is held by
    // a long transaction, so its LOCK TABLES gives up): the first capture is put back as it
    // was, on insert only, and the second gets nothing.
    let one = work.write_config("one.toml", &mysql_config(&url, BOOKINGS_CAPTURE))?;
    run_ok(
        &work,
        &[
            "capture",
            "install",
            "--config",
            one.to_str().context("path")?,
        ],
    )
    .await?;
    let two = work.write_config(
        "two.toml",
        &mysql_config(
            &url,
            &format!(
                "{}\non = [\"insert\", \"update\"]\n[[capture]]\ntable = \"customers\"\naggregate_type = \"C\"\naggregate_id = \"id\"\nevent_type = \"customer.created\"\n",
                BOOKINGS_CAPTURE.trim_end()
            ),
        ),
    )?;
    let mut holder = pool.begin().await?;
    sqlx::query("SELECT count(*) FROM customers")
        .execute(&mut *holder)
        .await?;
    let out = work
        .run(&[
            "capture",
            "install",
            "--config",
            two.to_str().context("path")?,
        ])
        .await?;
    holder.rollback().await?;
    out.assert_clear_error("was not granted within 10s")?;
    ensure!(out.stderr.contains("customers"), "{out:?}");
    ensure!(
        mysql_capture_objects(&pool).await? == (1, 1),
        "{:?}",
        mysql_capture_objects(&pool).await?
    );
    let out = run_ok(
        &work,
        &[
            "capture",
            "list",
            "--json",
            "--config",
            one.to_str().context("path")?,
        ],
    )
    .await?;
    let list: serde_json::Value = serde_json::from_str(&out.stdout)?;
    ensure!(
        list.as_array().map(Vec::len) == Some(1)
            && list[0]["on"] == serde_json::json!(["insert"])
            && list[0]["config"]["event_type"] == "booking.created",
        "{list:#}"
    );
    sqlx::query("INSERT INTO bookings (id, customer_id, n, seats) VALUES ('b9', 'c9', 1, 1)")
        .execute(&pool)
        .await?;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE aggregate_id = 'c9'")
        .fetch_one(&pool)
        .await?;
    ensure!(n == 1, "the restored capture made {n} events");
    Ok(())
}
