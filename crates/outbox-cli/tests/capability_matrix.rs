//! docs/architecture.md, "What each database can do", kept true: for the rows a command can
//! check, each cell's `yes` (or its reason) is what the binary does against the real
//! database of that column. `outbox replay --dry-run` for the replay row; `outbox migrate`
//! with a `[[subscription]]` for the fan-out row.

mod support;

use anyhow::{Context, ensure};
use outbox_testkit::services::{MariaDb, Moto, Postgres};
use support::Workdir;

/// The matrix's columns, in the document's order.
const COLUMNS: [&str; 6] = [
    "PG poll",
    "PG CDC",
    "SQLite",
    "MySQL poll",
    "MySQL CDC",
    "DynamoDB",
];

/// The cells of the matrix row whose first cell starts with `capability`.
fn row(capability: &str) -> anyhow::Result<Vec<String>> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/architecture.md"
    ))?;
    let section = doc
        .split("## What each database can do")
        .nth(1)
        .context("architecture.md lost its capability matrix")?;
    let header = section
        .lines()
        .find(|l| l.starts_with("| capability"))
        .context("the matrix has no header")?;
    let names: Vec<&str> = header.split('|').map(str::trim).collect();
    ensure!(
        names[2..8] == COLUMNS,
        "the matrix's columns changed: {header}"
    );
    let line = section
        .lines()
        .find(|l| l.starts_with(&format!("| {capability}")))
        .with_context(|| format!("no matrix row for {capability}"))?;
    Ok(line
        .split('|')
        .map(str::trim)
        .skip(2)
        .take(COLUMNS.len())
        .map(str::to_owned)
        .collect())
}

/// One `[source]` per column, against real servers.
async fn sources(moto: &Moto) -> anyhow::Result<Vec<String>> {
    let pg = Postgres::shared().await?;
    let maria = MariaDb::shared().await?;
    let dynamo_table = format!("matrix-{}", uuid::Uuid::new_v4().simple());
    create_dynamodb_table(moto, &dynamo_table).await?;
    Ok(vec![
        format!(
            "kind = \"postgres\"\nurl = \"{}\"\n",
            pg.fresh_database().await?
        ),
        format!(
            "kind = \"postgres\"\nurl = \"{}\"\nmode = \"cdc\"\n",
            pg.fresh_database().await?
        ),
        "kind = \"sqlite\"\npath = \"matrix.db\"\n".to_owned(),
        format!(
            "kind = \"mysql\"\nurl = \"{}\"\n",
            maria.fresh_database().await?
        ),
        format!(
            "kind = \"mysql\"\nurl = \"{}\"\nmode = \"cdc\"\n",
            maria.fresh_database().await?
        ),
        format!(
            "kind = \"dynamodb\"\ntable = \"{dynamo_table}\"\nregion = \"{}\"\nendpoint_url = \"{}\"\n",
            Moto::REGION,
            moto.url()
        ),
    ])
}

/// The application's table (`pk`, `sk`), as a DynamoDB user creates it before `migrate`.
async fn create_dynamodb_table(moto: &Moto, table: &str) -> anyhow::Result<()> {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let mut config = outbox_dynamodb::DynamoDbConfig::new(table.to_owned());
    config.region = Some(Moto::REGION.to_owned());
    config.endpoint_url = Some(moto.url().to_owned());
    let client = outbox_dynamodb::client(&config).await;
    let mut create = client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest);
    for (name, kind) in [("pk", KeyType::Hash), ("sk", KeyType::Range)] {
        create = create
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(name)
                    .attribute_type(ScalarAttributeType::S)
                    .build()?,
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(name)
                    .key_type(kind)
                    .build()?,
            );
    }
    create.send().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capability_matrix_says_what_the_binary_does() -> anyhow::Result<()> {
    Moto::set_aws_env();
    let moto = Moto::start().await?;
    let replay = row("`outbox replay`")?;
    let fan_out = row("`[[subscription]]` fan-out")?;
    let mut wrong = Vec::new();
    for ((column, source), (replay_cell, fan_out_cell)) in COLUMNS
        .iter()
        .zip(sources(&moto).await?)
        .zip(replay.iter().zip(&fan_out))
    {
        let work = Workdir::new()?;
        let plain = work.write_config(
            "plain.toml",
            &format!("[source]\n{source}[sink]\nkind = \"file\"\npath = \"events.jsonl\"\n"),
        )?;
        let plain = plain.to_str().context("path")?;
        let migrated = work.run(&["migrate", "--config", plain]).await?;
        ensure!(migrated.code == Some(0), "{column}: migrate: {migrated:?}");

        let out = work
            .run(&["replay", "--since", "1h", "--dry-run", "--config", plain])
            .await?;
        if (out.code == Some(0)) != replay_cell.starts_with("yes") {
            wrong.push(format!(
                "{column}, replay: the matrix says `{replay_cell}`, the binary: {out:?}"
            ));
        }

        let subscribed = work.write_config(
            "subscribed.toml",
            &format!(
                "[source]\n{source}[sinks.audit]\nkind = \"file\"\npath = \"audit.jsonl\"\n[[subscription]]\nname = \"audit\"\nsink = \"audit\"\n"
            ),
        )?;
        let out = work
            .run(&["migrate", "--config", subscribed.to_str().context("path")?])
            .await?;
        if (out.code == Some(0)) != fan_out_cell.starts_with("yes") {
            wrong.push(format!(
                "{column}, fan-out: the matrix says `{fan_out_cell}`, the binary: {out:?}"
            ));
        }
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}
