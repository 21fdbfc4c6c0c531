//! `kind = "dynamodb"` through the `outbox` binary against moto's server (behind the testkit's
//! one-request-at-a-time proxy) and a real NATS JetStream:
//!
//! - the commands: `doctor` red before `migrate` and green after, the relay publishing only
//!   the outbox inserts (in `seq` order per aggregate, payload bytes exact), a broken outbox
//!   item dead-lettered with its reason while the rest flows, `status` and `dead list`, and
//!   clear errors for a bad table name and a missing table;
//! - guarantees 1-3 under `kill -9`: two relay processes, one killed and restarted again and
//!   again while a producer commits (and sometimes fails a version check): every committed
//!   event arrives, in order per aggregate, and no event of a failed transaction does.

mod support;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConditionCheck, KeySchemaElement, KeyType,
    ScalarAttributeType, TransactWriteItem, Update,
};
use outbox_core::NewEvent;
use outbox_dynamodb::{DynamoDbConfig, DynamoOutbox};
use outbox_testkit::serial_proxy::SerialProxy;
use outbox_testkit::services::{HttpReceiver, Moto, Nats};
use outbox_testkit::stream_faults::StreamFaults;
use rand::Rng;
use support::{Workdir, read_stream, terminate};

struct Setup {
    _moto: Moto,
    proxy: SerialProxy,
    /// The stream fault injector in front of `proxy`, when the test asked for one.
    faults: Option<StreamFaults>,
    client: Client,
    config: DynamoDbConfig,
    tag: String,
}

impl Setup {
    async fn new() -> anyhow::Result<Self> {
        Self::start(false).await
    }

    /// With `faults`, the relay's endpoint is a [`StreamFaults`] proxy in front of moto.
    async fn start(faults: bool) -> anyhow::Result<Self> {
        Moto::set_aws_env();
        let moto = Moto::start().await?;
        let proxy = SerialProxy::start(moto.url()).await?;
        let faults = match faults {
            true => Some(StreamFaults::start(proxy.url()).await?),
            false => None,
        };
        let tag = format!("ddb{}", uuid::Uuid::new_v4().simple());
        let mut config = DynamoDbConfig::new(format!("app-{tag}"));
        config.region = Some(Moto::REGION.to_owned());
        config.endpoint_url = Some(
            faults
                .as_ref()
                .map_or_else(|| proxy.url(), |f| f.url())
                .to_owned(),
        );
        let client = outbox_dynamodb::client(&config).await;
        let key = |name: &str, kind: KeyType| -> anyhow::Result<_> {
            Ok((
                AttributeDefinition::builder()
                    .attribute_name(name)
                    .attribute_type(ScalarAttributeType::S)
                    .build()?,
                KeySchemaElement::builder()
                    .attribute_name(name)
                    .key_type(kind)
                    .build()?,
            ))
        };
        let (pa, pk) = key("pk", KeyType::Hash)?;
        let (sa, sk) = key("sk", KeyType::Range)?;
        client
            .create_table()
            .table_name(&config.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(pa)
            .attribute_definitions(sa)
            .key_schema(pk)
            .key_schema(sk)
            .send()
            .await?;
        Ok(Self {
            _moto: moto,
            proxy,
            faults,
            client,
            config,
            tag,
        })
    }

    fn config_file(&self, work: &Workdir, nats: &Nats, extra: &str) -> anyhow::Result<PathBuf> {
        work.write_config(
            "outbox.toml",
            &format!(
                r#"
[source]
kind = "dynamodb"
table = "{table}"
region = "{region}"
endpoint_url = "{endpoint}"
{extra}
[relay]
batch_size = 50
poll_interval = "5ms"
[sink]
kind = "nats"
url = "{nats}"
destination = "{tag}.{{aggregate_id}}"
stream = "{tag}"
"#,
                table = self.config.table,
                region = Moto::REGION,
                endpoint = self.config.endpoint_url.as_deref().unwrap_or_default(),
                nats = nats.url(),
                tag = self.tag,
            ),
        )
    }

    /// Commits `payloads` as events of `aggregate` with its version bump, one transaction;
    /// `fail` adds a version check that fails (nothing is written). Returns the event ids.
    async fn commit(
        &self,
        outbox: &DynamoOutbox,
        aggregate: &str,
        payloads: &[Vec<u8>],
        fail: bool,
    ) -> anyhow::Result<Vec<String>> {
        let events: Vec<NewEvent> = payloads
            .iter()
            .map(|p| NewEvent::new("Order", aggregate, "order.changed", p.clone()))
            .collect();
        self.commit_events(outbox, aggregate, &events, fail).await
    }

    /// [`Setup::commit`] with the events as given.
    async fn commit_events(
        &self,
        outbox: &DynamoOutbox,
        aggregate: &str,
        events: &[NewEvent],
        fail: bool,
    ) -> anyhow::Result<Vec<String>> {
        let pk = AttributeValue::S(format!("ORDER#{aggregate}"));
        let version: u64 = self
            .client
            .get_item()
            .table_name(&self.config.table)
            .key("pk", pk.clone())
            .key("sk", AttributeValue::S("ORDER".into()))
            .consistent_read(true)
            .send()
            .await?
            .item()
            .and_then(|i| i.get("version"))
            .and_then(|v| v.as_n().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bump = Update::builder()
            .table_name(&self.config.table)
            .key("pk", pk.clone())
            .key("sk", AttributeValue::S("ORDER".into()))
            .update_expression("SET #v = :next")
            .condition_expression("attribute_not_exists(#v) OR #v = :v")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
            .expression_attribute_values(
                ":next",
                AttributeValue::N((version + events.len() as u64).to_string()),
            )
            .build()?;
        let mut items = vec![TransactWriteItem::builder().update(bump).build()];
        let mut ids = Vec::new();
        for (i, event) in events.iter().enumerate() {
            let write = outbox.put(pk.clone(), event, version + 1 + i as u64)?;
            ids.push(write.id.to_string());
            items.push(write.into_transact_item()?);
        }
        if fail {
            items.push(
                TransactWriteItem::builder()
                    .condition_check(
                        ConditionCheck::builder()
                            .table_name(&self.config.table)
                            .key("pk", pk.clone())
                            .key("sk", AttributeValue::S("ORDER".into()))
                            .condition_expression("#v = :stale")
                            .expression_attribute_names("#v", "version")
                            .expression_attribute_values(
                                ":stale",
                                AttributeValue::N("999999".into()),
                            )
                            .build()?,
                    )
                    .build(),
            );
        }
        let sent = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .send()
            .await;
        ensure!(
            sent.is_ok() != fail,
            "transaction outcome {sent:?}, fail = {fail}"
        );
        Ok(ids)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_commands_migrate_relay_and_report_a_dynamodb_outbox() -> anyhow::Result<()> {
    let s = Setup::new().await?;
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    let config = s.config_file(&work, nats, "")?;
    let cfg = config.to_str().context("path")?;

    let doctor = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(
        doctor.code == Some(1) && doctor.stdout.contains("stream") && doctor.stdout.contains("off"),
        "doctor before migrate: {doctor:?}"
    );
    let migrate = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(
        migrate.code == Some(0) && migrate.stdout.contains("turned the stream"),
        "migrate: {migrate:?}"
    );
    let doctor = work.run(&["doctor", "--config", cfg]).await?;
    ensure!(doctor.code == Some(0), "doctor after migrate: {doctor:?}");
    // No AWS credentials anywhere: red, saying so in one line, no SDK debug dump.
    let mut cmd = work.command(&["doctor", "--config", cfg]);
    cmd.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            work.path().join("no-credentials"),
        )
        .env("AWS_CONFIG_FILE", work.path().join("no-config"))
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let no_credentials = support::output(cmd).await?;
    ensure!(
        no_credentials.code == Some(1)
            && no_credentials
                .stdout
                .contains("no providers in chain provided credentials")
            && no_credentials.stdout.contains("AWS credentials")
            && !no_credentials.stdout.contains("DispatchFailure"),
        "doctor without credentials: {no_credentials:?}"
    );

    let outbox = DynamoOutbox::new(&s.config)?;
    let mut expected: HashMap<String, Vec<String>> = HashMap::new();
    for round in 0..3u8 {
        for agg in ["a", "b"] {
            let payload = vec![round, 0xff, 0x00, b'{'];
            let ids = s
                .commit(&outbox, agg, &[payload.clone(), payload], false)
                .await?;
            expected.entry(agg.to_owned()).or_default().extend(ids);
        }
    }
    // A business write (not an event) and an outbox item without its attributes.
    s.client
        .put_item()
        .table_name(&s.config.table)
        .item("pk", AttributeValue::S("ORDER#a".into()))
        .item("sk", AttributeValue::S("NOTE#1".into()))
        .send()
        .await?;
    s.client
        .put_item()
        .table_name(&s.config.table)
        .item("pk", AttributeValue::S("ORDER#c".into()))
        .item(
            "sk",
            AttributeValue::S(format!("OUTBOX#{}", uuid::Uuid::now_v7())),
        )
        .item("aggregate_type", AttributeValue::S("Order".into()))
        .send()
        .await?;

    // Before any relay ran: the lag is the age of the oldest record, in text and JSON.
    let status = work.run(&["status", "--config", cfg]).await?;
    ensure!(
        status.code == Some(0)
            && status.stdout.contains("the oldest unread record is")
            && status.stdout.contains("not read yet"),
        "status before the relay: {status:?}"
    );
    let json = work.run(&["status", "--config", cfg, "--json"]).await?;
    let json: serde_json::Value =
        serde_json::from_str(&json.stdout).with_context(|| format!("status --json: {json:?}"))?;
    ensure!(
        json["oldest_pending_age_seconds"]
            .as_f64()
            .is_some_and(|a| a > 0.0)
            && json["shards"][0]["oldest_unread_age_seconds"]
                .as_f64()
                .is_some(),
        "status --json before the relay: {json}"
    );

    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let client = nats.connect().await?;
    let total: usize = expected.values().map(Vec::len).sum();
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        read_stream(&client, &s.tag)
            .await
            .is_ok_and(|got| got.len() >= total)
    })
    .await
    .with_context(|| format!("not every event arrived:\n{}", work.read_log("relay.log")))?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}:\n{}",
        work.read_log("relay.log")
    );

    let received = read_stream(&client, &s.tag).await?;
    ensure!(
        received.len() == total,
        "{} messages, {total} events",
        received.len()
    );
    let mut by_aggregate: HashMap<String, Vec<String>> = HashMap::new();
    for m in &received {
        ensure!(
            m.payload[1..] == [0xff, 0x00, b'{'],
            "payload bytes: {:?}",
            m.payload
        );
        by_aggregate
            .entry(m.aggregate_id.clone())
            .or_default()
            .push(m.id.clone());
    }
    ensure!(
        by_aggregate == expected,
        "order: {by_aggregate:?} vs {expected:?}"
    );

    let status = work.run(&["status", "--config", cfg]).await?;
    ensure!(
        status.code == Some(0)
            && status.stdout.contains("shard")
            && status.stdout.contains("checkpoint")
            && status.stdout.contains("no relay holds it")
            && status.stdout.contains("every record is read"),
        "status after a clean stop: {status:?}"
    );
    let dead = work.run(&["dead", "list", "--config", cfg]).await?;
    ensure!(
        // The list cuts the reason to its column; the id and the start of the reason show.
        dead.code == Some(0) && dead.stdout.contains("attribute `aggregate_"),
        "dead list: {dead:?}"
    );

    // Bad input: a table name DynamoDB cannot have, and a table that does not exist.
    let bad = work.write_config(
        "bad.toml",
        "[source]\nkind = \"dynamodb\"\ntable = \"no spaces\"\n[sink]\nkind = \"stdout\"\n",
    )?;
    work.run(&["check-config", "--config", bad.to_str().context("path")?])
        .await?
        .assert_clear_error("source.table")?;
    let missing = work.write_config(
        "missing.toml",
        &format!(
            "[source]\nkind = \"dynamodb\"\ntable = \"nope-{}\"\nendpoint_url = \"{}\"\n[sink]\nkind = \"stdout\"\n",
            s.tag,
            s.proxy.url()
        ),
    )?;
    let relay = work
        .run(&["relay", "--config", missing.to_str().context("path")?])
        .await?;
    relay.assert_clear_error("does not exist")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkilled_dynamodb_relays_lose_nothing_invent_nothing_and_keep_order() -> anyhow::Result<()>
{
    outbox_testkit::init_tracing();
    let s = Setup::new().await?;
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    // Short leases so that a killed relay's shard is taken over within seconds; a batch is
    // published only while its lease lasts, so it must outlast publish_timeout.
    let config = s.config_file(
        &work,
        nats,
        "lease_duration = \"3s\"\n[relay.placeholder]\n",
    );
    drop(config);
    let config = work.write_config(
        "outbox.toml",
        &std::fs::read_to_string(work.path().join("outbox.toml"))?
            .replace("[relay.placeholder]\n", "")
            .replace("[relay]\n", "[relay]\npublish_timeout = \"2s\"\n"),
    )?;
    let migrate = work
        .run(&["migrate", "--config", config.to_str().context("path")?])
        .await?;
    ensure!(migrate.code == Some(0), "migrate: {migrate:?}");
    let mut relays = [
        work.spawn_relay(&config, "relay-0.log")?,
        work.spawn_relay(&config, "relay-1.log")?,
    ];

    let outbox = DynamoOutbox::new(&s.config)?;
    let producer = async {
        let mut committed: Vec<(String, u32)> = Vec::new();
        let mut failed_ids: Vec<String> = Vec::new();
        let mut next: HashMap<String, u32> = HashMap::new();
        for t in 0..120u32 {
            let (agg, n, fail) = {
                let mut rng = rand::rng();
                (
                    format!("a{}", rng.random_range(0..6)),
                    rng.random_range(1..=3u32),
                    t % 7 == 3,
                )
            };
            let start = *next.get(&agg).unwrap_or(&0);
            let payloads: Vec<Vec<u8>> = (start..start + n)
                .map(|i| i.to_string().into_bytes())
                .collect();
            let ids = s.commit(&outbox, &agg, &payloads, fail).await?;
            if fail {
                failed_ids.extend(ids);
            } else {
                next.insert(agg.clone(), start + n);
                committed.extend((start..start + n).map(|i| (agg.clone(), i)));
            }
        }
        anyhow::Ok((committed, failed_ids))
    };
    let killer = async {
        for k in 0..6 {
            let pause = rand::rng().random_range(400..900);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let victim = rand::rng().random_range(0..2usize);
            relays[victim].start_kill()?; // SIGKILL
            relays[victim].wait().await?;
            work.append_log(&format!("relay-{victim}.log"), support::RESTART_MARKER)?;
            relays[victim] = work.spawn_relay(&config, &format!("relay-{victim}.log"))?;
            tracing::info!(kill = k, victim, "relay killed and restarted");
        }
        anyhow::Ok(())
    };
    let (produced, killed) = tokio::join!(producer, killer);
    killed?;
    let (committed, failed_ids) = produced?;

    let client = nats.connect().await?;
    let expected_total = committed.len();
    outbox_testkit::wait::eventually(Duration::from_secs(120), || async {
        read_stream(&client, &s.tag).await.is_ok_and(|got| {
            got.iter().map(|m| &m.id).collect::<HashSet<_>>().len() >= expected_total
        })
    })
    .await
    .with_context(|| {
        format!(
            "not every committed event arrived:\n{}\n{}",
            work.read_log("relay-0.log"),
            work.read_log("relay-1.log")
        )
    })?;
    support::stop_restarted_relays(&work, &mut relays).await?;

    let received = read_stream(&client, &s.tag).await?;
    let failed: HashSet<&String> = failed_ids.iter().collect();
    let mut seen = HashSet::new();
    let mut by_aggregate: HashMap<String, Vec<u32>> = HashMap::new();
    for m in &received {
        ensure!(
            !failed.contains(&m.id),
            "phantom: event {} of a failed transaction",
            m.id
        );
        if seen.insert(m.id.clone()) {
            let n: u32 = std::str::from_utf8(&m.payload)?.parse()?;
            by_aggregate
                .entry(m.aggregate_id.clone())
                .or_default()
                .push(n);
        }
    }
    let mut expected: HashMap<String, Vec<u32>> = HashMap::new();
    for (agg, n) in committed {
        expected.entry(agg).or_default().push(n);
    }
    ensure!(
        seen.len() == expected_total,
        "lost: {} distinct events arrived, {expected_total} committed",
        seen.len()
    );
    for (agg, ns) in &expected {
        ensure!(
            by_aggregate.get(agg) == Some(ns),
            "disorder in {agg}: {:?}, committed {ns:?}",
            by_aggregate.get(agg)
        );
    }
    tracing::info!(
        committed = expected_total,
        delivered_messages = received.len(),
        failed_transactions_events = failed_ids.len(),
        "lost 0, phantom 0, disorder 0"
    );
    Ok(())
}

/// Commits numbered events per aggregate (payload = the event's number within its
/// aggregate) and remembers what committed, in order.
#[derive(Default)]
struct Numbered {
    next: HashMap<String, u32>,
    committed: Vec<(String, u32)>,
}

impl Numbered {
    async fn commit(
        &mut self,
        s: &Setup,
        outbox: &DynamoOutbox,
        agg: &str,
        n: u32,
    ) -> anyhow::Result<()> {
        let start = *self.next.get(agg).unwrap_or(&0);
        let payloads: Vec<Vec<u8>> = (start..start + n)
            .map(|i| i.to_string().into_bytes())
            .collect();
        s.commit(outbox, agg, &payloads, false).await?;
        self.next.insert(agg.to_owned(), start + n);
        self.committed
            .extend((start..start + n).map(|i| (agg.to_owned(), i)));
        Ok(())
    }
}

/// Waits until `count` distinct events are in the NATS stream.
async fn wait_delivered(
    client: &async_nats::Client,
    s: &Setup,
    work: &Workdir,
    count: usize,
) -> anyhow::Result<()> {
    outbox_testkit::wait::eventually(Duration::from_secs(90), || async {
        read_stream(client, &s.tag)
            .await
            .is_ok_and(|got| got.iter().map(|m| &m.id).collect::<HashSet<_>>().len() >= count)
    })
    .await
    .with_context(|| {
        format!(
            "{count} events did not arrive:\n{}",
            work.read_log("relay.log")
        )
    })
}

/// Per aggregate, the numbers delivered (first copy of each event), in arrival order.
async fn delivered(
    client: &async_nats::Client,
    s: &Setup,
) -> anyhow::Result<HashMap<String, Vec<u32>>> {
    let mut seen = HashSet::new();
    let mut by_aggregate: HashMap<String, Vec<u32>> = HashMap::new();
    for m in read_stream(client, &s.tag).await? {
        if seen.insert(m.id.clone()) {
            let n: u32 = std::str::from_utf8(&m.payload)?.parse()?;
            by_aggregate
                .entry(m.aggregate_id.clone())
                .or_default()
                .push(n);
        }
    }
    Ok(by_aggregate)
}

fn expected(committed: &[(String, u32)]) -> HashMap<String, Vec<u32>> {
    let mut expected: HashMap<String, Vec<u32>> = HashMap::new();
    for (agg, n) in committed {
        expected.entry(agg.clone()).or_default().push(*n);
    }
    expected
}

impl Setup {
    async fn stream_arn(&self) -> anyhow::Result<String> {
        self.client
            .describe_table()
            .table_name(&self.config.table)
            .send()
            .await?
            .table()
            .and_then(|t| t.latest_stream_arn())
            .map(str::to_owned)
            .context("the table has no stream")
    }

    async fn migrate(&self, work: &Workdir, config: &std::path::Path) -> anyhow::Result<()> {
        let migrate = work
            .run(&["migrate", "--config", config.to_str().context("path")?])
            .await?;
        ensure!(migrate.code == Some(0), "migrate: {migrate:?}");
        Ok(())
    }
}

/// A shard split (moto has none: the testkit's `StreamFaults` presents moto's shard as a
/// parent closed at the split and two children that share every later record by a hash of
/// its key, so one aggregate's events spread over both). The relay reads the parent to its
/// end before either child, and each aggregate still arrives complete and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_shard_is_read_parent_first_and_aggregates_spread_over_its_children_keep_order()
-> anyhow::Result<()> {
    let s = Setup::start(true).await?;
    let faults = s.faults.as_ref().context("the fault proxy")?;
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    let config = s.config_file(&work, nats, "")?;
    s.migrate(&work, &config).await?;
    let outbox = DynamoOutbox::new(&s.config)?;
    let mut numbered = Numbered::default();
    // Written before the relay starts: it finds a parent with unread records and two
    // children at once.
    for _ in 0..3 {
        for agg in ["a", "b", "c"] {
            numbered.commit(&s, &outbox, agg, 2).await?;
        }
    }
    let arn = s.stream_arn().await?;
    faults.split(&arn).await?;
    // The parent takes several reads: a child read early would show.
    faults.page_size(4);
    for _ in 0..3 {
        for agg in ["a", "b", "c"] {
            numbered.commit(&s, &outbox, agg, 3).await?;
        }
    }
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let client = nats.connect().await?;
    wait_delivered(&client, &s, &work, numbered.committed.len()).await?;
    // And while it runs.
    for _ in 0..4 {
        for agg in ["a", "b", "c"] {
            numbered.commit(&s, &outbox, agg, 3).await?;
        }
    }
    wait_delivered(&client, &s, &work, numbered.committed.len()).await?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}:\n{}",
        work.read_log("relay.log")
    );

    let got = delivered(&client, &s).await?;
    ensure!(
        got == expected(&numbered.committed),
        "lost or out of order: {got:?}"
    );
    let seen = faults.observed();
    ensure!(
        seen.child_before_parent == 0,
        "a child shard was read before its parent's end: {seen:?}"
    );
    ensure!(
        seen.read.iter().filter(|s| s.contains("-child-")).count() == 2
            && seen.closed_read.len() == 1,
        "the parent read to its end and both children read: {seen:?}"
    );
    Ok(())
}

/// Throttled reads and expired iterators (moto shows neither) cost time, never events:
/// the relay backs off, takes a fresh iterator after the last record it read, and every
/// event arrives once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn throttled_reads_and_expired_iterators_lose_and_repeat_nothing() -> anyhow::Result<()> {
    let s = Setup::start(true).await?;
    let faults = s.faults.as_ref().context("the fault proxy")?;
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    let config = s.config_file(&work, nats, "")?;
    s.migrate(&work, &config).await?;
    let outbox = DynamoOutbox::new(&s.config)?;
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let mut numbered = Numbered::default();
    for round in 0..8 {
        if round % 2 == 0 {
            faults.throttle(3);
        } else {
            faults.expire(2);
        }
        for agg in ["a", "b"] {
            numbered.commit(&s, &outbox, agg, 2).await?;
        }
    }
    let client = nats.connect().await?;
    wait_delivered(&client, &s, &work, numbered.committed.len()).await?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}:\n{}",
        work.read_log("relay.log")
    );
    let got = delivered(&client, &s).await?;
    ensure!(
        got == expected(&numbered.committed),
        "lost or out of order: {got:?}"
    );
    let messages = read_stream(&client, &s.tag).await?.len();
    ensure!(
        messages == numbered.committed.len(),
        "{messages} messages for {} events: an expired iterator made the relay read records again",
        numbered.committed.len()
    );
    let served = faults.observed().faults_served;
    ensure!(served == 4 * 3 + 4 * 2, "faults served: {served}");
    Ok(())
}

/// Records trimmed by the 24-hour retention while no relay ran (moto never trims): the relay
/// says in its log that events were lost, reads on from the oldest record left, and lets the
/// aggregate's later events go after `gap_timeout`, saying which predecessors never came.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_trimmed_behind_the_checkpoint_are_reported_and_the_rest_flows()
-> anyhow::Result<()> {
    let s = Setup::start(true).await?;
    let faults = s.faults.as_ref().context("the fault proxy")?;
    let nats = Nats::shared().await?;
    let work = Workdir::new()?;
    let config = s.config_file(&work, nats, "gap_timeout = \"1s\"\n")?;
    s.migrate(&work, &config).await?;
    let outbox = DynamoOutbox::new(&s.config)?;
    let mut numbered = Numbered::default();
    numbered.commit(&s, &outbox, "t", 3).await?;
    let client = nats.connect().await?;
    let mut relay = work.spawn_relay(&config, "relay.log")?;
    wait_delivered(&client, &s, &work, 3).await?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}:\n{}",
        work.read_log("relay.log")
    );

    numbered.commit(&s, &outbox, "t", 3).await?; // 3, 4, 5: lost to the trim
    let arn = s.stream_arn().await?;
    let trimmed = faults.last_seqnum(&arn).await?;
    numbered.commit(&s, &outbox, "t", 3).await?; // 6, 7, 8
    faults.trim_through(trimmed);

    let mut relay = work.spawn_relay(&config, "relay.log")?;
    wait_delivered(&client, &s, &work, 6).await?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    let log = work.read_log("relay.log");
    ensure!(code == Some(0), "relay exit {code:?}:\n{log}");
    let got = delivered(&client, &s).await?;
    ensure!(
        got.get("t") == Some(&vec![0, 1, 2, 6, 7, 8]),
        "delivered: {got:?}"
    );
    ensure!(
        log.contains("trimmed") && log.contains("events were lost"),
        "the loss is not in the log:\n{log}"
    );
    ensure!(
        log.contains("predecessor never appeared") && log.contains("missing_after=3"),
        "the gap is not in the log:\n{log}"
    );
    ensure!(
        faults.observed().trimmed_refusals >= 1,
        "{:?}",
        faults.observed()
    );
    Ok(())
}

/// `outbox dead retry` on DynamoDB: a poison event and the events held behind it go again,
/// whole and in `seq` order, picked up by the running relay from the lease table; an event
/// written during the retry goes after them; the dead letters and the aggregate's mark go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_retried_goes_again_with_the_events_held_behind_it_in_order()
-> anyhow::Result<()> {
    let s = Setup::new().await?;
    let hooks = HttpReceiver::start().await?;
    hooks.reject_when_header("outbox-poison", "1", 422);
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            "[source]\nkind = \"dynamodb\"\ntable = \"{}\"\nregion = \"{}\"\nendpoint_url = \"{}\"\n[relay]\npoll_interval = \"5ms\"\n[sink]\nkind = \"http\"\nurl = \"{}\"\n",
            s.config.table,
            Moto::REGION,
            s.proxy.url(),
            hooks.url_for("/in")
        ),
    )?;
    let cfg = config.to_str().context("path")?;
    s.migrate(&work, &config).await?;
    let outbox = DynamoOutbox::new(&s.config)?;
    let event = |agg: &str, n: u32| {
        NewEvent::new("Order", agg, "order.changed", n.to_string().into_bytes())
    };
    let poison = s
        .commit_events(
            &outbox,
            "o1",
            &[event("o1", 0).with_header("poison", "1")],
            false,
        )
        .await?;
    s.commit_events(&outbox, "o1", &[event("o1", 1), event("o1", 2)], false)
        .await?;
    s.commit_events(&outbox, "o2", &[event("o2", 0), event("o2", 1)], false)
        .await?;

    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let accepted_of = |agg: &str| -> Vec<String> {
        hooks
            .received()
            .iter()
            .filter(|r| r.accepted() && r.header("outbox-aggregate_id") == Some(agg))
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
            .collect()
    };
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        accepted_of("o2").len() == 2
            && work
                .run(&["dead", "list", "--config", cfg])
                .await
                .is_ok_and(|o| o.stdout.matches("order.changed").count() == 3)
    })
    .await
    .with_context(|| {
        format!(
            "poison not dead with two held:\n{}",
            work.read_log("relay.log")
        )
    })?;
    ensure!(accepted_of("o1").is_empty(), "o1 went past its dead letter");

    hooks.reset_script();
    let retry = work
        .run(&["dead", "retry", &poison[0], "--config", cfg])
        .await?;
    ensure!(
        retry.code == Some(0) && retry.stdout.contains("3 dead letter(s) put back in line"),
        "dead retry: {retry:?}"
    );
    s.commit_events(&outbox, "o1", &[event("o1", 3)], false)
        .await?;
    outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        accepted_of("o1").len() >= 4
    })
    .await
    .with_context(|| {
        format!(
            "the retried events did not arrive:\n{}",
            work.read_log("relay.log")
        )
    })?;
    ensure!(
        accepted_of("o1") == ["0", "1", "2", "3"],
        "o1 out of order: {:?}",
        accepted_of("o1")
    );
    outbox_testkit::wait::eventually(Duration::from_secs(30), || async {
        work.run(&["status", "--config", cfg, "--json"])
            .await
            .is_ok_and(|o| {
                serde_json::from_str::<serde_json::Value>(&o.stdout).is_ok_and(|v| v["dead"] == 0)
            })
    })
    .await
    .context("dead letters left after the retry")?;
    let code = terminate(&mut relay, Duration::from_secs(30)).await?;
    ensure!(
        code == Some(0),
        "relay exit {code:?}:\n{}",
        work.read_log("relay.log")
    );
    Ok(())
}
