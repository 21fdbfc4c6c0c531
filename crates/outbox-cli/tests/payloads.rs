//! Claim-check and encryption through the binary, checked by consumers that are not ours:
//! boto3 (S3, SQS, KMS) and `cryptography` in `tests/support/payload_consumer.py`, and
//! async-nats for JetStream. A SQLite outbox (no database server), moto for the AWS APIs, a
//! real nats-server.
//!
//! - A 5 MiB event through SQS and through NATS is claim-checked to S3: the message carries
//!   the reference, boto3 fetches the object and its size and SHA-256 match the event's
//!   payload; the inbox's decoder gives the payload back as well.
//! - An event encrypted with a KMS data key is decrypted by the Python consumer following
//!   docs/payloads.md, also when it is claim-checked too (encrypted first, then offloaded).
//! - A store that cannot be reached holds events pending, never dead-lettered.

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine as _;
use outbox_testkit::services::{Moto, Nats};
use sha2::Digest as _;
use support::{Workdir, terminate};

/// A name no other test run uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::now_v7().simple())
}

/// Runs `tests/support/payload_consumer.py ENDPOINT args…`; its stdout.
async fn consumer(moto: &Moto, args: &[&str]) -> anyhow::Result<String> {
    let mut all = vec![moto.url()];
    all.extend_from_slice(args);
    support::python_consumer("payload_consumer.py", &all).await
}

/// `bytes` bytes that are not UTF-8 text nor compressible runs: a stand-in for a document.
fn document(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha2::Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A migrated SQLite outbox in `work` for `config`; the pool on it.
async fn migrated(
    work: &Workdir,
    config: &std::path::Path,
) -> anyhow::Result<(sqlx::SqlitePool, String)> {
    let cfg = config.to_str().context("utf-8 path")?.to_owned();
    let migrate = work.run_ok(&["migrate", "--config", &cfg]).await?;
    Ok((pool(work).await?, migrate))
}

/// A pool on `work`'s SQLite outbox.
async fn pool(work: &Workdir) -> anyhow::Result<sqlx::SqlitePool> {
    Ok(sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        work.path().join("app.db").display()
    ))
    .await?)
}

/// Inserts `(aggregate_id, payload)` events of `Order`, in order; their ids.
async fn insert(pool: &sqlx::SqlitePool, events: &[(&str, &[u8])]) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for (aggregate_id, payload) in events {
        let id = uuid::Uuid::now_v7().to_string();
        sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (?, 'Order', ?, 'order.document', ?)")
            .bind(&id)
            .bind(aggregate_id)
            .bind(*payload)
            .execute(pool)
            .await?;
        ids.push(id);
    }
    Ok(ids)
}

/// Runs the relay of `config` until `n` events are delivered; fails naming any dead one.
async fn relay_until_delivered(
    work: &Workdir,
    config: &std::path::Path,
    pool: &sqlx::SqlitePool,
    n: i64,
) -> anyhow::Result<()> {
    let mut relay = work.spawn_relay(config, "relay.log")?;
    let delivered = outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'delivered'")
            .fetch_one(pool)
            .await
            .is_ok_and(|found| found == n)
    })
    .await;
    terminate(&mut relay, Duration::from_secs(10)).await?;
    let dead: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT aggregate_id, last_error FROM outbox WHERE state = 'dead'")
            .fetch_all(pool)
            .await?;
    ensure!(
        dead.is_empty(),
        "dead-lettered: {dead:?}\n{}",
        work.read_log("relay.log")
    );
    delivered.with_context(|| format!("not every event delivered:\n{}", work.read_log("relay.log")))
}

/// The S3 part of a sink's `claim_check` on moto.
fn claim_check(moto: &Moto, bucket: &str) -> String {
    format!(
        "claim_check = {{ store = \"s3://{bucket}/claims\", endpoint_url = \"{}\", region = \"{}\" }}",
        moto.url(),
        Moto::REGION
    )
}

/// One message as the Python consumer decoded it.
struct Consumed {
    id: String,
    headers: serde_json::Value,
    body: Vec<u8>,
    payload: Vec<u8>,
}

async fn consume_sqs(moto: &Moto, queue_url: &str, count: usize) -> anyhow::Result<Vec<Consumed>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    consumer(moto, &["sqs", queue_url, &count.to_string()])
        .await?
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            Ok(Consumed {
                id: v["id"].as_str().context("id")?.to_owned(),
                headers: v["headers"].clone(),
                body: b64.decode(v["body_b64"].as_str().context("body")?)?,
                payload: b64.decode(v["payload_b64"].as_str().context("payload")?)?,
            })
        })
        .collect()
}

async fn sqs_queue(moto: &Moto, name: &str) -> anyhow::Result<String> {
    Ok(consumer(moto, &["create-queue", name])
        .await?
        .trim()
        .to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_event_through_sqs_is_claim_checked_to_s3_and_boto3_reads_it_back()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let bucket = unique("claims");
    consumer(moto, &["create-bucket", &bucket]).await?;
    let queue_url = sqs_queue(moto, &unique("docs")).await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"sqs\"\nqueue_url = \"{queue_url}\"\nendpoint_url = \"{}\"\nregion = \"{}\"\n{}\n",
            moto.url(),
            Moto::REGION,
            claim_check(moto, &bucket)
        ),
    )?;
    let (pool, migrate) = migrated(&work, &config).await?;
    ensure!(
        migrate.contains("claim_check:"),
        "migrate sets the expiry rule: {migrate}"
    );
    let big = document(5 << 20, 1);
    let small = br#"{"note":"fits"}"#.to_vec();
    let ids = insert(&pool, &[("o1", &big), ("o2", &small)]).await?;
    relay_until_delivered(&work, &config, &pool, 2).await?;

    let messages = consume_sqs(moto, &queue_url, 2).await?;
    let by_id = |id: &str| {
        messages
            .iter()
            .find(|m| m.id == id)
            .context("message missing")
    };
    let large = by_id(&ids[0])?;
    let url = format!("s3://{bucket}/claims/Order/{}", ids[0]);
    ensure!(
        large.headers["claim_check"] == url.as_str(),
        "{}",
        large.headers
    );
    ensure!(
        large.headers["claim_check_sha256"] == sha256_hex(&big).as_str()
            && large.headers["claim_check_size"] == (5u64 << 20).to_string().as_str(),
        "{}",
        large.headers
    );
    let reference: serde_json::Value = serde_json::from_slice(&large.body)?;
    ensure!(
        reference
            == serde_json::json!({"claim_check": url, "claim_check_sha256": sha256_hex(&big), "claim_check_size": 5u64 << 20}),
        "the body is the reference: {reference}"
    );
    ensure!(
        large.payload == big,
        "the object fetched by boto3 is the payload"
    );
    ensure!(
        large.headers["aggregate_id"] == "o1" && large.headers["event_type"] == "order.document",
        "every header kept: {}",
        large.headers
    );
    let fits = by_id(&ids[1])?;
    ensure!(
        fits.body == small && fits.headers.get("claim_check").is_none(),
        "a small event is untouched"
    );

    // `outbox doctor` finds the store writable and the expiry rule set by migrate.
    let doctor = work
        .run(&["doctor", "--config", config.to_str().context("path")?])
        .await?;
    ensure!(
        doctor.stdout.contains("payload_claim_check") && doctor.code == Some(0),
        "{}\n{}",
        doctor.stdout,
        doctor.stderr
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_event_through_nats_is_claim_checked_and_read_back_by_its_own_client()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let nats = Nats::shared().await?;
    let bucket = unique("claims");
    consumer(moto, &["create-bucket", &bucket]).await?;
    let scope = unique("docs").replace('-', "_");
    let stream = scope.to_uppercase();
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"nats\"\nurl = \"{}\"\ndestination = \"{scope}.{{aggregate_type}}\"\nstream = \"{stream}\"\n{}\n",
            nats.url(),
            claim_check(moto, &bucket)
        ),
    )?;
    let (pool, _) = migrated(&work, &config).await?;
    let big = document(5 << 20, 2);
    let ids = insert(&pool, &[("o1", &big), ("o1", br#"{"n":2}"#)]).await?;
    relay_until_delivered(&work, &config, &pool, 2).await?;

    let client = nats.connect().await?;
    let received = support::read_stream(&client, &stream).await?;
    ensure!(received.len() == 2, "{} messages", received.len());
    ensure!(
        received[0].id == ids[0] && received[1].id == ids[1],
        "in order"
    );
    let header = |name: &str| {
        received[0]
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .with_context(|| format!("no {name} header: {:?}", received[0].headers))
    };
    let url = header("claim_check")?;
    ensure!(
        url == format!("s3://{bucket}/claims/Order/{}", ids[0]),
        "{url}"
    );
    ensure!(
        received[0].payload.len() < 1024,
        "the body is the small reference"
    );
    // boto3 fetches the object and checks it against the headers.
    let fetched: serde_json::Value = serde_json::from_str(
        &consumer(
            moto,
            &[
                "s3-get",
                &url,
                &header("claim_check_sha256")?,
                &header("claim_check_size")?,
            ],
        )
        .await?,
    )?;
    ensure!(fetched["sha256"] == sha256_hex(&big).as_str(), "{fetched}");

    // The inbox's decoder (feature `payload`) gives the consumer the payload itself.
    let message = outbox_inbox::InboxMessage::from_headers(
        received[0]
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str())),
        &["Nats-Msg-Id"],
        received[0].payload.clone().into(),
    )?;
    let decoder = outbox_inbox::payload::Decoder::new().with_claim_check(
        outbox_inbox::payload::ClaimCheckFetcher::new(Some(Moto::REGION), Some(moto.url()))
            .await
            .allow(&format!("s3://{bucket}/claims")),
    );
    let decoded = message.decode(&decoder).await?;
    ensure!(
        decoded.payload.as_ref() == big.as_slice(),
        "decoded payload differs"
    );
    ensure!(
        !decoded
            .headers
            .iter()
            .any(|(n, _)| n.starts_with("claim_check")),
        "{:?}",
        decoded.headers
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_event_is_decrypted_by_a_boto3_and_cryptography_consumer() -> anyhow::Result<()>
{
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let bucket = unique("claims");
    consumer(moto, &["create-bucket", &bucket]).await?;
    let key_id = consumer(moto, &["create-key"]).await?.trim().to_owned();
    let queue_url = sqs_queue(moto, &unique("secret")).await?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"sqs\"\nqueue_url = \"{queue_url}\"\nendpoint_url = \"{url}\"\nregion = \"{region}\"\n{claim}\nencryption = {{ key = \"aws-kms:{key_id}\", endpoint_url = \"{url}\", region = \"{region}\" }}\n",
            url = moto.url(),
            region = Moto::REGION,
            claim = claim_check(moto, &bucket),
        ),
    )?;
    let (pool, _) = migrated(&work, &config).await?;
    let card = br#"{"card":"4111 1111 1111 1111","email":"ada@example.com"}"#.to_vec();
    // Over SQS' 256 KiB once encrypted: encrypted first, then offloaded.
    let large = document(300 << 10, 3);
    let ids = insert(&pool, &[("o1", &card), ("o2", &large)]).await?;
    relay_until_delivered(&work, &config, &pool, 2).await?;

    let messages = consume_sqs(moto, &queue_url, 2).await?;
    let by_id = |id: &str| {
        messages
            .iter()
            .find(|m| m.id == id)
            .context("message missing")
    };
    let small = by_id(&ids[0])?;
    ensure!(
        small.payload == card,
        "the Python consumer decrypted the payload"
    );
    ensure!(
        !small.body.windows(4).any(|w| w == b"4111") && small.body != card,
        "the broker saw ciphertext only"
    );
    ensure!(
        small.headers["encryption"] == "aes-256-gcm",
        "{}",
        small.headers
    );
    ensure!(
        small.headers.get("claim_check").is_none(),
        "{}",
        small.headers
    );
    let offloaded = by_id(&ids[1])?;
    ensure!(
        offloaded.headers.get("claim_check").is_some()
            && offloaded.headers["encryption"] == "aes-256-gcm",
        "{}",
        offloaded.headers
    );
    ensure!(offloaded.payload == large, "fetched, then decrypted");
    // The stored object is the ciphertext: its hash is not the plaintext's.
    ensure!(offloaded.headers["claim_check_sha256"] != sha256_hex(&large).as_str());
    ensure!(
        !work.read_log("relay.log").contains("4111"),
        "plaintext in the relay's log"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_reached_holds_events_pending_and_never_dead_letters_them()
-> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::shared().await?;
    let bucket = unique("claims");
    consumer(moto, &["create-bucket", &bucket]).await?;
    // A port nothing listens on: the store is down.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let work = Workdir::new()?;
    let down = work.write_config(
        "down.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\nclaim_check = {{ store = \"s3://{bucket}/claims\", above = \"1KiB\", endpoint_url = \"http://127.0.0.1:{closed}\", region = \"{}\" }}\n",
            Moto::REGION
        ),
    )?;
    let (pool, _) = migrated_without_expiry(&work, &down).await?;
    let big = document(64 << 10, 4);
    insert(&pool, &[("o1", &big), ("o1", b"{}")]).await?;
    let mut relay = work.spawn_relay(&down, "down.log")?;
    let said = outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        work.read_log("down.log").contains("claim-check")
    })
    .await;
    terminate(&mut relay, Duration::from_secs(10)).await?;
    said.with_context(|| format!("no word of the store: {}", work.read_log("down.log")))?;
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, attempts FROM outbox ORDER BY seq")
            .fetch_all(&pool)
            .await?;
    ensure!(
        states.iter().all(|(state, _)| state == "pending"),
        "nothing dead, nothing delivered out of order: {states:?}"
    );
    ensure!(
        !work.path().join("events.jsonl").exists()
            || std::fs::read(work.path().join("events.jsonl"))?.is_empty(),
        "the later event waited behind the first"
    );

    // The store back: both delivered, in order.
    let up = work.write_config(
        "up.toml",
        &format!(
            "[source]\nkind = \"sqlite\"\npath = \"app.db\"\n[sink]\nkind = \"file\"\npath = \"events.jsonl\"\nclaim_check = {{ store = \"s3://{bucket}/claims\", above = \"1KiB\", endpoint_url = \"{}\", region = \"{}\" }}\n",
            moto.url(),
            Moto::REGION
        ),
    )?;
    relay_until_delivered(&work, &up, &pool, 2).await?;
    Ok(())
}

/// As [`migrated`] for a config whose store is down: the outbox table only (`migrate` would
/// fail on the expiry rule, and says so).
async fn migrated_without_expiry(
    work: &Workdir,
    config: &std::path::Path,
) -> anyhow::Result<(sqlx::SqlitePool, String)> {
    let cfg = config.to_str().context("utf-8 path")?;
    let out = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(
        out.code != Some(0) && out.stderr.contains("claim_check"),
        "migrate with the store down fails naming it: {}{}",
        out.stdout,
        out.stderr
    );
    Ok((pool(work).await?, out.stdout))
}
