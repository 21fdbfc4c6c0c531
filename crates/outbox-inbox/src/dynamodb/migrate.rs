//! `DynamoDbInbox::migrate`: creates the inbox table when it is missing (on-demand capacity,
//! string keys) or checks the keys of an existing one, and turns its TTL on for the inbox's
//! TTL attribute. Idempotent, and safe to run concurrently.

use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    TableDescription, TableStatus, TimeToLiveSpecification, TimeToLiveStatus,
};
use tokio::time::Instant;

use super::{DynamoDbInbox, DynamoDbInboxError};

/// Longest wait for a new table to become `ACTIVE`.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// What [`DynamoDbInbox::migrate`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamoDbMigrateReport {
    /// The table was missing and this call created it.
    pub table_created: bool,
    /// TTL was off and this call turned it on.
    pub ttl_enabled: bool,
}

impl DynamoDbInbox {
    /// Creates the table when it is missing (partition and sort key of type S, on-demand
    /// capacity) or checks an existing table's keys, then turns TTL on for the TTL attribute
    /// (`expires_at`) unless it is on already. Refuses a table whose TTL reads another
    /// attribute (set [`ttl_attribute`](Self::ttl_attribute) to it). Needs
    /// `dynamodb:DescribeTable`, `CreateTable`, `DescribeTimeToLive`, `UpdateTimeToLive`;
    /// an operator may create the table instead and skip this.
    pub async fn migrate(&self) -> Result<DynamoDbMigrateReport, DynamoDbInboxError> {
        let table_created = match self.describe().await? {
            Some(table) => {
                self.check_keys(&table)?;
                false
            }
            None => {
                self.create().await?;
                self.wait_active().await?;
                tracing::info!(table = %self.table, "created the inbox table");
                true
            }
        };
        let ttl_enabled = self.enable_ttl().await?;
        Ok(DynamoDbMigrateReport {
            table_created,
            ttl_enabled,
        })
    }

    async fn describe(&self) -> Result<Option<TableDescription>, DynamoDbInboxError> {
        match self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await
        {
            Ok(out) => Ok(out.table),
            Err(e) if e.code() == Some("ResourceNotFoundException") => Ok(None),
            Err(e) => Err(DynamoDbInboxError::call(
                "describe the table",
                &self.table,
                e,
            )),
        }
    }

    fn check_keys(&self, table: &TableDescription) -> Result<(), DynamoDbInboxError> {
        for (kind, want) in [
            (KeyType::Hash, &self.partition_key),
            (KeyType::Range, &self.sort_key),
        ] {
            let found = table
                .key_schema()
                .iter()
                .find(|k| *k.key_type() == kind)
                .map(|k| k.attribute_name());
            let ty = table
                .attribute_definitions()
                .iter()
                .find(|a| Some(a.attribute_name()) == found)
                .map(|a| a.attribute_type());
            if found != Some(want.as_str()) || ty != Some(&ScalarAttributeType::S) {
                return Err(DynamoDbInboxError::Table {
                    table: self.table.clone(),
                    problem: format!(
                        "its {} key is {}; the inbox needs `{want}` of type S (set \
                         DynamoDbInbox::keys to the table's key names, or use another table)",
                        if kind == KeyType::Hash {
                            "partition"
                        } else {
                            "sort"
                        },
                        match (found, ty) {
                            (Some(name), Some(ty)) => format!("`{name}` of type {}", ty.as_str()),
                            _ => "missing".to_owned(),
                        },
                    ),
                });
            }
        }
        Ok(())
    }

    async fn create(&self) -> Result<(), DynamoDbInboxError> {
        let key = |name: &str, kind: KeyType| {
            (
                AttributeDefinition::builder()
                    .attribute_name(name)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .expect("name and type are set"),
                KeySchemaElement::builder()
                    .attribute_name(name)
                    .key_type(kind)
                    .build()
                    .expect("name and type are set"),
            )
        };
        let (pk_def, pk_key) = key(&self.partition_key, KeyType::Hash);
        let (sk_def, sk_key) = key(&self.sort_key, KeyType::Range);
        let result = self
            .client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(pk_def)
            .attribute_definitions(sk_def)
            .key_schema(pk_key)
            .key_schema(sk_key)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // A concurrent migrate created it first.
            Err(e) if e.code() == Some("ResourceInUseException") => Ok(()),
            Err(e) => Err(DynamoDbInboxError::call("create the table", &self.table, e)),
        }
    }

    /// Polls until the table is `ACTIVE`.
    async fn wait_active(&self) -> Result<(), DynamoDbInboxError> {
        let deadline = Instant::now() + ACTIVE_TIMEOUT;
        loop {
            if let Some(t) = self.describe().await?
                && t.table_status() == Some(&TableStatus::Active)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(DynamoDbInboxError::Table {
                    table: self.table.clone(),
                    problem: format!("not ACTIVE after {ACTIVE_TIMEOUT:?}; run migrate again"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Turns TTL on for the TTL attribute; `true` when this call did.
    async fn enable_ttl(&self) -> Result<bool, DynamoDbInboxError> {
        let described = self
            .client
            .describe_time_to_live()
            .table_name(&self.table)
            .send()
            .await
            .map_err(|e| DynamoDbInboxError::call("describe the TTL", &self.table, e))?;
        let ttl = described.time_to_live_description();
        let status = ttl.and_then(|t| t.time_to_live_status());
        let attribute = ttl.and_then(|t| t.attribute_name());
        let problem = |problem: String| DynamoDbInboxError::Table {
            table: self.table.clone(),
            problem,
        };
        match status {
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) => {
                if attribute == Some(self.ttl_attribute.as_str()) {
                    Ok(false)
                } else {
                    Err(problem(format!(
                        "its TTL reads the attribute {attribute:?}, the inbox writes `{}`: set \
                         DynamoDbInbox::ttl_attribute to the table's (a table has one TTL attribute)",
                        self.ttl_attribute
                    )))
                }
            }
            Some(TimeToLiveStatus::Disabling) => Err(problem(
                "its TTL is being turned off; run migrate again when that is done (up to an hour)"
                    .to_owned(),
            )),
            _ => {
                self.client
                    .update_time_to_live()
                    .table_name(&self.table)
                    .time_to_live_specification(
                        TimeToLiveSpecification::builder()
                            .enabled(true)
                            .attribute_name(&self.ttl_attribute)
                            .build()
                            .expect("enabled and attribute are set"),
                    )
                    .send()
                    .await
                    .map_err(|e| DynamoDbInboxError::call("turn TTL on", &self.table, e))?;
                tracing::info!(table = %self.table, attribute = %self.ttl_attribute, "turned the inbox table's TTL on");
                Ok(true)
            }
        }
    }
}
