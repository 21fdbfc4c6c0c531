//! `outbox migrate` for DynamoDB: the application's table is the application's (this never
//! creates it); migrate checks its keys, turns its stream on with new images (or checks the
//! stream that is on), and creates the relay's lease and checkpoint table. Idempotent.

use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    StreamSpecification, StreamViewType, TableDescription, TableStatus,
};
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use tokio::time::Instant;

use crate::config::DynamoDbConfig;
use crate::error::DynamoError;

/// The lease table's key: `shard#<id>` (lease and checkpoint of a stream shard), `aggregate#<type>#<id>` (the last position delivered), `dead#<event id>` (a dead letter).
pub const LEASE_KEY: &str = "lease_key";

/// Longest wait for a table to become `ACTIVE` after a change.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// What [`migrate`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// The stream was off and this call turned it on (`NEW_IMAGE`).
    pub stream_enabled: bool,
    /// The stream's view type (`NEW_IMAGE` or `NEW_AND_OLD_IMAGES`).
    pub stream_view: String,
    /// The stream's ARN.
    pub stream_arn: String,
    /// The lease table, and whether this call created it.
    pub lease_table: String,
    /// Whether this call created the lease table.
    pub lease_table_created: bool,
}

/// A client for `config` (the standard credential chain, `region`, `endpoint_url`, the
/// timeouts; the SDK retries a call once more on a transient failure).
pub async fn client(config: &DynamoDbConfig) -> Client {
    Client::new(&sdk_config(config).await)
}

/// The SDK configuration for `config`: shared by the table and the stream clients.
pub(crate) async fn sdk_config(config: &DynamoDbConfig) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(config.connect_timeout)
                .operation_attempt_timeout(config.timeout)
                .build(),
        );
    if let Some(region) = &config.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(url) = &config.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}

/// Checks the table's keys, turns its stream on (new images) when it is off, refuses a
/// stream without new images, and creates the lease table when it is missing.
pub async fn migrate(
    client: &Client,
    config: &DynamoDbConfig,
) -> Result<MigrateReport, DynamoError> {
    config.validate()?;
    let table =
        describe(client, &config.table)
            .await?
            .ok_or_else(|| DynamoError::TableMissing {
                table: config.table.clone(),
                where_: config
                    .region
                    .as_ref()
                    .map(|r| format!(" in region {r}"))
                    .unwrap_or_default(),
                partition_key: config.partition_key.clone(),
                sort_key: config.sort_key.clone(),
            })?;
    check_keys(config, &table)?;
    let (stream_enabled, table) = match stream_view(&table) {
        Some(view) if view_has_new_images(&view) => (false, table),
        Some(view) => {
            return Err(DynamoError::Table {
                table: config.table.clone(),
                problem: format!(
                    "its stream's view type is {view}; the relay needs NEW_IMAGE or NEW_AND_OLD_IMAGES. \
                     A view type cannot be changed while the stream is on: turn the stream off and on again \
                     with NEW_IMAGE (records of the old stream stay readable for 24 hours)"
                ),
            });
        }
        None => {
            client
                .update_table()
                .table_name(&config.table)
                .stream_specification(
                    StreamSpecification::builder()
                        .stream_enabled(true)
                        .stream_view_type(StreamViewType::NewImage)
                        .build()
                        .map_err(|e| {
                            DynamoError::call("turning the stream on", &config.table, e)
                        })?,
                )
                .send()
                .await
                .map_err(|e| DynamoError::call("turning the stream on", &config.table, e))?;
            tracing::info!(table = %config.table, "turned the table's stream on (NEW_IMAGE)");
            (true, wait_active(client, &config.table).await?)
        }
    };
    let stream_arn = table.latest_stream_arn().unwrap_or_default().to_owned();
    let stream_view = stream_view(&table).unwrap_or_default();

    let lease_table = config.lease_table();
    let lease_table_created = match describe(client, &lease_table).await? {
        Some(existing) => {
            let hash = key_name(&existing, KeyType::Hash);
            if hash.as_deref() != Some(LEASE_KEY) || key_name(&existing, KeyType::Range).is_some() {
                return Err(DynamoError::Table {
                    table: lease_table,
                    problem: format!(
                        "exists but is not a lease table (its key must be `{LEASE_KEY}` alone, found {hash:?}): \
                         drop it or set source.lease_table to another name"
                    ),
                });
            }
            false
        }
        None => {
            create_lease_table(client, &lease_table).await?;
            wait_active(client, &lease_table).await?;
            tracing::info!(table = %lease_table, "created the relay's lease table");
            true
        }
    };
    Ok(MigrateReport {
        stream_enabled,
        stream_view,
        stream_arn,
        lease_table,
        lease_table_created,
    })
}

/// The table's description, or `None` when it does not exist.
pub(crate) async fn describe(
    client: &Client,
    table: &str,
) -> Result<Option<TableDescription>, DynamoError> {
    match client.describe_table().table_name(table).send().await {
        Ok(out) => Ok(out.table),
        Err(e) if e.code() == Some("ResourceNotFoundException") => Ok(None),
        Err(e) => Err(DynamoError::call("describing the table", table, e)),
    }
}

pub(crate) fn key_name(table: &TableDescription, kind: KeyType) -> Option<String> {
    table
        .key_schema()
        .iter()
        .find(|k| *k.key_type() == kind)
        .map(|k| k.attribute_name().to_owned())
}

pub(crate) fn check_keys(
    config: &DynamoDbConfig,
    table: &TableDescription,
) -> Result<(), DynamoError> {
    let problem = |problem: String| DynamoError::Table {
        table: config.table.clone(),
        problem,
    };
    let hash = key_name(table, KeyType::Hash);
    if hash.as_deref() != Some(config.partition_key.as_str()) {
        return Err(problem(format!(
            "its partition key is {}, source.partition_key says `{}`",
            hash.map(|h| format!("`{h}`"))
                .unwrap_or_else(|| "missing".into()),
            config.partition_key
        )));
    }
    let Some(range) = key_name(table, KeyType::Range) else {
        return Err(problem(format!(
            "it has no sort key; the outbox items need one (`{}`, type S, values `OUTBOX#<id>`)",
            config.sort_key
        )));
    };
    if range != config.sort_key {
        return Err(problem(format!(
            "its sort key is `{range}`, source.sort_key says `{}`",
            config.sort_key
        )));
    }
    let range_type = table
        .attribute_definitions()
        .iter()
        .find(|a| a.attribute_name() == range)
        .map(|a| a.attribute_type().clone());
    if range_type != Some(ScalarAttributeType::S) {
        return Err(problem(format!(
            "its sort key `{range}` is of type {}, the outbox items need S",
            range_type
                .map(|t| t.as_str().to_owned())
                .unwrap_or_else(|| "unknown".into())
        )));
    }
    Ok(())
}

pub(crate) fn stream_view(table: &TableDescription) -> Option<String> {
    let spec = table.stream_specification()?;
    if !spec.stream_enabled() {
        return None;
    }
    Some(
        spec.stream_view_type()
            .map(|v| v.as_str().to_owned())
            .unwrap_or_else(|| "unknown".into()),
    )
}

pub(crate) fn view_has_new_images(view: &str) -> bool {
    view == StreamViewType::NewImage.as_str() || view == StreamViewType::NewAndOldImages.as_str()
}

async fn create_lease_table(client: &Client, name: &str) -> Result<(), DynamoError> {
    let err = |e| DynamoError::call("creating the lease table", name, e);
    let result = client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(LEASE_KEY)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(err)?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(LEASE_KEY)
                .key_type(KeyType::Hash)
                .build()
                .map_err(err)?,
        )
        .send()
        .await;
    match result {
        Ok(_) => Ok(()),
        // A concurrent migrate created it first.
        Err(e) if e.code() == Some("ResourceInUseException") => Ok(()),
        Err(e) => Err(DynamoError::call("creating the lease table", name, e)),
    }
}

/// Polls until `table` is `ACTIVE` (with its stream ARN, when a stream is on).
async fn wait_active(client: &Client, table: &str) -> Result<TableDescription, DynamoError> {
    let deadline = Instant::now() + ACTIVE_TIMEOUT;
    loop {
        if let Some(t) = describe(client, table).await?
            && t.table_status() == Some(&TableStatus::Active)
            && (stream_view(&t).is_none() || t.latest_stream_arn().is_some())
        {
            return Ok(t);
        }
        if Instant::now() >= deadline {
            return Err(DynamoError::Table {
                table: table.to_owned(),
                problem: format!("not ACTIVE after {ACTIVE_TIMEOUT:?}; try `outbox migrate` again"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
