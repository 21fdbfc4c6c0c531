//! `kind = "dynamodb"` for the runtime and the `outbox` command: migrate, the relay's
//! pipeline (one [`DynamoStreamSource`] per relay process; replicas share the shards through
//! leases), `status` (shards, leases, checkpoints, dead letters) and `doctor`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, KeyType, TransactWriteItem, Update};
use outbox_core::admin::{DoctorCheck, DoctorThresholds, StatusReport};
use outbox_core::backend::{
    Backend, BackendConfig, BoxedSource, DynInspect, OpenError, OpenOptions, Pipelines,
};
use outbox_core::sink::BoxFuture;
use outbox_core::source::{Backlog, Inspect};
use outbox_core::stream_ledger::LedgerStats;
use outbox_core::{NewEvent, Ordering, RelayConfig, SourceError};
use time::OffsetDateTime;

use crate::config::DynamoDbConfig;
use crate::dead::DynamoDeadLetters;
use crate::migrate::{
    LEASE_KEY, check_keys, describe, key_name, migrate, stream_view, view_has_new_images,
};
use crate::stream::DynamoStreamSource;

impl BackendConfig for DynamoDbConfig {
    const KIND: &'static str = "dynamodb";

    fn claims_url(_url: &str) -> bool {
        false
    }

    fn validate(&self, relay: &RelayConfig) -> Result<(), String> {
        DynamoDbConfig::validate(self).map_err(|e| e.to_string())?;
        if relay.ordering == Ordering::Total {
            return Err("relay.ordering: `total` is not offered by the DynamoDB source (a stream has one order per shard); use `none` or `per-aggregate`".into());
        }
        outbox_core::backend::check_claim_outlasts_publish(
            "source.lease_duration",
            self.lease_duration,
            relay,
        )
        .map_err(|e| format!("{e}: a batch is published only while its shards' leases last"))
    }

    fn describe(&self) -> String {
        format!("DynamoDB table `{}`{}", self.table, self.place())
    }

    fn open(&self, _options: OpenOptions) -> BoxFuture<'_, Result<Arc<dyn Backend>, OpenError>> {
        Box::pin(async move {
            let client = crate::migrate::client(self).await;
            Ok(Arc::new(DynamoBackend {
                dead: DynamoDeadLetters::new(client.clone(), self.lease_table()),
                versions: Default::default(),
                config: self.clone(),
                client,
            }) as Arc<dyn Backend>)
        })
    }
}

impl DynamoDbConfig {
    /// ` at <endpoint>` / ` in <region>` for messages.
    fn place(&self) -> String {
        match (&self.endpoint_url, &self.region) {
            (Some(url), _) => format!(" at {url}"),
            (None, Some(region)) => format!(" in {region}"),
            (None, None) => String::new(),
        }
    }
}

/// An opened DynamoDB outbox.
#[derive(Debug)]
pub struct DynamoBackend {
    config: DynamoDbConfig,
    client: Client,
    dead: DynamoDeadLetters,
    /// `outbox bench`'s producer: each aggregate's version, read once, then kept here.
    versions: tokio::sync::Mutex<HashMap<(String, String), u64>>,
}

/// The backlog of a running source: events read from the stream and not yet settled.
struct StreamInspector(Arc<LedgerStats>);

impl Inspect for StreamInspector {
    async fn backlog(&self) -> Result<Backlog, SourceError> {
        let mut backlog = Backlog::default();
        self.0.fill(&mut backlog, OffsetDateTime::now_utc());
        Ok(backlog)
    }
}

fn unavailable(doing: &str, table: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError::unavailable(format!("{doing} (table `{table}`) failed: {e}"))
}

impl DynamoBackend {
    /// Each shard's lease: (shard, owner, checkpoint, finished, lease expiry in Unix ms), and
    /// the number of dead letters.
    async fn leases(&self) -> Result<(Vec<LeaseRow>, u64), SourceError> {
        let table = self.config.lease_table();
        let mut rows = Vec::new();
        let mut dead = 0;
        let mut start = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&table)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| {
                    unavailable(
                        "reading the lease table",
                        &table,
                        outbox_core::relay::ErrorChain(&e),
                    )
                })?;
            for item in page.items() {
                let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
                let key = text(LEASE_KEY).unwrap_or_default();
                if key.starts_with("dead#") {
                    dead += 1;
                } else if let Some(shard) = key.strip_prefix("shard#") {
                    rows.push(LeaseRow {
                        shard: shard.to_owned(),
                        owner: text("owner"),
                        checkpoint: text("checkpoint"),
                        finished: item
                            .get("finished")
                            .and_then(|v| v.as_bool().ok())
                            .copied()
                            .unwrap_or(false),
                        lease_until_ms: item
                            .get("lease_until")
                            .and_then(|v| v.as_n().ok())
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0),
                    });
                }
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        rows.sort_by(|a, b| a.shard.cmp(&b.shard));
        Ok((rows, dead))
    }
}

/// The sort key of the aggregate item that `outbox bench` versions (`seq` comes from it).
const BENCH_AGGREGATE_SK: &str = "AGGREGATE";

impl DynamoBackend {
    /// Writes `events` as an application does: per aggregate, one `TransactWriteItems` that
    /// bumps the aggregate's version and puts its events with the next `seq`s (at most 99
    /// events per transaction, DynamoDB's limit being 100 items).
    async fn write(&self, events: &[NewEvent]) -> Result<(), SourceError> {
        let outbox = crate::DynamoOutbox::new(&self.config)
            .map_err(|e| SourceError::fatal(e.to_string()))?;
        let mut groups: Vec<((String, String), Vec<&NewEvent>)> = Vec::new();
        for e in events {
            let key = (e.aggregate_type.clone(), e.aggregate_id.clone());
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) => list.push(e),
                None => groups.push((key, vec![e])),
            }
        }
        let table = &self.config.table;
        let err = |doing: &str, e: &dyn std::fmt::Display| unavailable(doing, table, e);
        let mut versions = self.versions.lock().await;
        for (key, list) in groups {
            let pk = AttributeValue::S(format!("{}#{}", key.0, key.1));
            let sk = AttributeValue::S(BENCH_AGGREGATE_SK.into());
            let mut version = match versions.get(&key) {
                Some(v) => *v,
                None => self
                    .client
                    .get_item()
                    .table_name(table)
                    .key(&self.config.partition_key, pk.clone())
                    .key(&self.config.sort_key, sk.clone())
                    .consistent_read(true)
                    .send()
                    .await
                    .map_err(|e| {
                        err(
                            "reading an aggregate's version",
                            &outbox_core::relay::ErrorChain(&e),
                        )
                    })?
                    .item()
                    .and_then(|i| i.get("version"))
                    .and_then(|v| v.as_n().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            };
            for chunk in list.chunks(99) {
                let next = version + chunk.len() as u64;
                let bump = Update::builder()
                    .table_name(table)
                    .key(&self.config.partition_key, pk.clone())
                    .key(&self.config.sort_key, sk.clone())
                    .update_expression("SET #v = :next")
                    .condition_expression("attribute_not_exists(#v) OR #v = :v")
                    .expression_attribute_names("#v", "version")
                    .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
                    .expression_attribute_values(":next", AttributeValue::N(next.to_string()))
                    .build()
                    .map_err(|e| err("building a transaction", &e))?;
                let mut items = vec![TransactWriteItem::builder().update(bump).build()];
                for (i, e) in chunk.iter().enumerate() {
                    let write = outbox
                        .put(pk.clone(), e, version + 1 + i as u64)
                        .map_err(|e| SourceError::fatal(e.to_string()))?;
                    items.push(
                        write
                            .into_transact_item()
                            .map_err(|e| SourceError::fatal(e.to_string()))?,
                    );
                }
                self.client
                    .transact_write_items()
                    .set_transact_items(Some(items))
                    .send()
                    .await
                    .map_err(|e| err("writing events", &outbox_core::relay::ErrorChain(&e)))?;
                version = next;
            }
            versions.insert(key, version);
        }
        Ok(())
    }
}

impl DynamoBackend {
    /// A backlog fill for `outbox bench`: the outbox items with `BatchWriteItem` (25 per
    /// call, no transaction) and each aggregate's version once at the end. Only valid with
    /// no other writer, which is how `bench backlog` runs.
    async fn fill_batches(&self, events: &[NewEvent]) -> Result<(), SourceError> {
        use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
        let outbox = crate::DynamoOutbox::new(&self.config)
            .map_err(|e| SourceError::fatal(e.to_string()))?;
        let table = &self.config.table;
        let err = |e: &dyn std::fmt::Display| unavailable("writing the backlog", table, e);
        let mut versions = self.versions.lock().await;
        let mut requests = Vec::with_capacity(events.len() + 64);
        let mut touched = Vec::new();
        for e in events {
            let key = (e.aggregate_type.clone(), e.aggregate_id.clone());
            let pk = AttributeValue::S(format!("{}#{}", key.0, key.1));
            let version = match versions.get(&key) {
                Some(v) => *v,
                None => 0,
            } + 1;
            versions.insert(key.clone(), version);
            if !touched.contains(&key) {
                touched.push(key);
            }
            let write = outbox
                .put(pk, e, version)
                .map_err(|e| SourceError::fatal(e.to_string()))?;
            let put = PutRequest::builder()
                .set_item(Some(write.item().clone()))
                .build()
                .map_err(|e| err(&e))?;
            requests.push(WriteRequest::builder().put_request(put).build());
        }
        for key in touched {
            let put = PutRequest::builder()
                .item(
                    &self.config.partition_key,
                    AttributeValue::S(format!("{}#{}", key.0, key.1)),
                )
                .item(
                    &self.config.sort_key,
                    AttributeValue::S(BENCH_AGGREGATE_SK.into()),
                )
                .item("version", AttributeValue::N(versions[&key].to_string()))
                .build()
                .map_err(|e| err(&e))?;
            requests.push(WriteRequest::builder().put_request(put).build());
        }
        for chunk in requests.chunks(25) {
            let mut pending = HashMap::from([(table.clone(), chunk.to_vec())]);
            while !pending.is_empty() {
                let out = self
                    .client
                    .batch_write_item()
                    .set_request_items(Some(pending))
                    .send()
                    .await
                    .map_err(|e| err(&outbox_core::relay::ErrorChain(&e)))?;
                pending = out.unprocessed_items.unwrap_or_default();
                pending.retain(|_, v| !v.is_empty());
            }
        }
        Ok(())
    }
}

outbox_core::forward_producer!(DynamoBackend, fill = fill_batches, commit = write);

struct LeaseRow {
    shard: String,
    owner: Option<String>,
    checkpoint: Option<String>,
    finished: bool,
    lease_until_ms: u64,
}

impl DynamoBackend {
    /// `outbox migrate`: turns the table's stream on and creates the lease table; what it
    /// did, one line each.
    async fn migrate_lines(&self) -> Result<Vec<String>, SourceError> {
        let report = migrate(&self.client, &self.config)
            .await
            .map_err(|e| match e {
                crate::DynamoError::Call { .. } => SourceError::unavailable(e.to_string()),
                _ => SourceError::fatal(e.to_string()),
            })?;
        let mut lines = vec![if report.stream_enabled {
            format!(
                "turned the stream of `{}` on (NEW_IMAGE)",
                self.config.table
            )
        } else {
            format!(
                "the stream of `{}` is on ({})",
                self.config.table, report.stream_view
            )
        }];
        lines.push(if report.lease_table_created {
            format!("created the lease table `{}`", report.lease_table)
        } else {
            format!("the lease table `{}` is in place", report.lease_table)
        });
        Ok(lines)
    }

    /// Checks the lease table, then builds the relay's single pipeline (replicas share the
    /// shards through leases).
    async fn pipelines(&self, relay: &RelayConfig) -> Result<Pipelines, SourceError> {
        let table = self.config.lease_table();
        match describe(&self.client, &table).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(SourceError::fatal(format!(
                    "the lease table `{table}` does not exist: run `outbox migrate`"
                )));
            }
            Err(e) => return Err(SourceError::unavailable(e.to_string())),
        }
        let owner = format!(
            "{}-{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "relay".into()),
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        );
        let source =
            DynamoStreamSource::new(&self.config, owner, relay.ordering, relay.dead_letter).await?;
        let inspector: Arc<dyn DynInspect> = Arc::new(StreamInspector(source.stats()));
        let closed = source.closed();
        Ok(Pipelines {
            sources: vec![BoxedSource::new(source)],
            inspector,
            watchdog: None,
            closed: Some(Box::pin(closed)),
        })
    }

    /// `outbox status` at `now`: shards, leases, checkpoints and dead letters.
    async fn status_report(
        &self,
        now: OffsetDateTime,
        _stuck_after: Duration,
    ) -> Result<StatusReport, SourceError> {
        let (leases, dead) = self.leases().await?;
        let known: HashMap<String, (Option<String>, bool)> = leases
            .iter()
            .map(|l| (l.shard.clone(), (l.checkpoint.clone(), l.finished)))
            .collect();
        let shards = crate::stream::unread(&self.config, &self.client, &known).await?;
        let oldest = shards
            .iter()
            .flatten()
            .filter_map(|s| s.oldest_unread)
            .min();
        let age = |at: OffsetDateTime| (now - at).as_seconds_f64().max(0.0);
        let backlog = Backlog {
            dead,
            oldest_pending_age_seconds: oldest.map_or(0.0, age),
            ..Backlog::default()
        };
        let mut status = StatusReport::new(self.database(), self.table(), backlog);
        let now_ms = (now.unix_timestamp_nanos() / 1_000_000) as u64;
        let Some(shards) = shards else {
            status
                .head_lines
                .push("stream: off (run `outbox migrate`, which turns it on)".to_owned());
            return Ok(status);
        };
        status.head_lines.push(format!(
            "stream shards: {} ({} finished); lag: {}",
            shards.len(),
            leases.iter().filter(|l| l.finished).count(),
            match oldest {
                Some(at) => format!("the oldest unread record is {:.1} s old", age(at)),
                None => "every record is read".to_owned(),
            }
        ));
        let mut rows = Vec::new();
        for shard in &shards {
            let lease = leases.iter().find(|l| l.shard == shard.shard);
            let holder = match lease {
                Some(l) if l.finished => "finished".to_owned(),
                Some(LeaseRow {
                    owner: Some(owner),
                    lease_until_ms,
                    ..
                }) if *lease_until_ms > now_ms => format!(
                    "read by {owner} (lease {:.0} s left)",
                    (lease_until_ms - now_ms) as f64 / 1000.0
                ),
                Some(_) => "no relay holds it".to_owned(),
                None => "not read yet".to_owned(),
            };
            let checkpoint = lease.and_then(|l| l.checkpoint.clone());
            let unread = match shard.oldest_unread {
                Some(at) => format!("oldest unread record {:.1} s old", age(at)),
                None => "nothing unread".to_owned(),
            };
            status.detail_lines.push(format!(
                "shard {}{}: {holder}; checkpoint {}; {unread}",
                shard.shard,
                shard
                    .parent
                    .as_deref()
                    .map(|p| format!(" (child of {p})"))
                    .unwrap_or_default(),
                checkpoint
                    .as_deref()
                    .unwrap_or("none (reads from the oldest record)")
            ));
            rows.push(serde_json::json!({
                "shard": shard.shard,
                "parent": shard.parent,
                "owner": lease.and_then(|l| l.owner.clone()),
                "checkpoint": checkpoint,
                "finished": lease.is_some_and(|l| l.finished),
                "lease_until_ms": lease.map_or(0, |l| l.lease_until_ms),
                "oldest_unread_age_seconds": shard.oldest_unread.map(age),
            }));
        }
        status
            .sections
            .insert("shards".into(), serde_json::json!(rows));
        Ok(status)
    }

    /// `None`: the backlog is the stream, not row state.
    async fn pending_events(&self) -> Result<Option<u64>, SourceError> {
        Ok(None)
    }

    /// `outbox doctor`: the table, its stream and the lease table.
    async fn checks(&self, _thresholds: DoctorThresholds) -> Vec<DoctorCheck> {
        let mut checks = Vec::new();
        let migrate_fix = "run `outbox migrate`";
        match describe(&self.client, &self.config.table).await {
            Err(e) => checks.push(DoctorCheck::red(
                "table",
                e.to_string(),
                "check source.region/endpoint_url and the AWS credentials (environment, profile, role)",
            )),
            Ok(None) => checks.push(DoctorCheck::red(
                "table",
                format!("DynamoDB table `{}` does not exist{}", self.config.table, self.config.place()),
                "create the table (the application owns it) or fix source.table",
            )),
            Ok(Some(table)) => {
                match check_keys(&self.config, &table) {
                    Ok(()) => checks.push(DoctorCheck::ok(
                        "table",
                        format!(
                            "`{}` reachable; keys `{}` / `{}`",
                            self.config.table, self.config.partition_key, self.config.sort_key
                        ),
                    )),
                    Err(e) => checks.push(DoctorCheck::red(
                        "table",
                        e.to_string(),
                        "set source.partition_key / source.sort_key to the table's key names",
                    )),
                }
                match stream_view(&table) {
                    Some(view) if view_has_new_images(&view) => checks.push(DoctorCheck::ok(
                        "stream",
                        format!("on, {view}"),
                    )),
                    Some(view) => checks.push(DoctorCheck::red(
                        "stream",
                        format!("on, but {view}: the relay needs NEW_IMAGE or NEW_AND_OLD_IMAGES"),
                        "turn the stream off and on again with NEW_IMAGE",
                    )),
                    None => checks.push(DoctorCheck::red("stream", "off", migrate_fix)),
                }
            }
        }
        let lease_table = self.config.lease_table();
        match describe(&self.client, &lease_table).await {
            Ok(Some(t)) if key_name(&t, KeyType::Hash).as_deref() == Some(LEASE_KEY) => {
                match self.leases().await {
                    Ok((leases, dead)) => checks.push(DoctorCheck::ok(
                        "leases",
                        format!(
                            "`{lease_table}`: {} shard(s) known, {dead} dead letter(s)",
                            leases.len()
                        ),
                    )),
                    Err(e) => {
                        checks.push(DoctorCheck::red("leases", e.to_string(), migrate_fix))
                    }
                }
            }
            Ok(Some(_)) => checks.push(DoctorCheck::red(
                "leases",
                format!("`{lease_table}` exists but is not a lease table (key `{LEASE_KEY}`)"),
                "drop it or set source.lease_table to another name",
            )),
            Ok(None) => checks.push(DoctorCheck::red(
                "leases",
                format!("the lease table `{lease_table}` does not exist"),
                migrate_fix,
            )),
            Err(e) => checks.push(DoctorCheck::red(
                "leases",
                e.to_string(),
                "check source.region/endpoint_url and the AWS credentials (environment, profile, role)",
            )),
        }
        checks
    }
}

impl Backend for DynamoBackend {
    fn kind(&self) -> &'static str {
        "dynamodb"
    }

    fn database(&self) -> String {
        format!("DynamoDB{}", self.config.place())
    }

    fn table(&self) -> String {
        self.config.table.clone()
    }

    fn single_pipeline(&self) -> bool {
        true
    }

    outbox_core::backend_commands!();

    outbox_core::backend_abilities!(dead_letters: dead, producer: self);
}
