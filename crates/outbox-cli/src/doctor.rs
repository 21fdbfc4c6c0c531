//! `outbox doctor`: checks the config, the database and the broker, and prints one verdict
//! per check (ok / warn / red) with the fix. Exits non-zero when anything is red.
//!
//! The database checks come from the backend ([`outbox_core::Backend::doctor`]); this module
//! adds the config and the sink (built exactly as the relay builds it, then its healthcheck).

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use outbox_core::SinkErrorKind;
use outbox_core::admin::{DoctorCheck, DoctorThresholds, Health};
use outbox_core::backend::OpenOptions;
use outbox_runtime::{Config, Origin};

/// `outbox doctor` arguments.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// An idle-in-transaction session holding a snapshot longer than this is red.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    stale_transaction: Duration,
    /// How long the broker may take to answer.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sink_timeout: Duration,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    config: String,
    checks: Vec<DoctorCheck>,
}

pub(crate) async fn run(
    loaded: anyhow::Result<(Config, Origin)>,
    args: DoctorArgs,
) -> anyhow::Result<()> {
    let (checks, origin) = match loaded {
        Ok((config, origin)) => (checks(&config, &args).await, origin.to_string()),
        Err(e) => (
            vec![check(
                "config",
                Health::Red,
                crate::chain(e.as_ref()),
                Some("fix the key named above (`outbox check-config` prints the resolved config)"),
            )],
            "the config".to_owned(),
        ),
    };
    let red = checks.iter().filter(|c| c.health == Health::Red).count();
    let warn = checks.iter().filter(|c| c.health == Health::Warn).count();
    if args.json {
        let report = Report {
            config: origin,
            checks,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("outbox doctor ({origin})");
        for c in &checks {
            let verdict = match c.health {
                Health::Ok => "ok  ",
                Health::Warn => "warn",
                Health::Red => "RED ",
            };
            println!("  {verdict}  {:<22} {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("        {:<22} fix: {fix}", "");
            }
        }
        println!(
            "{} check(s): {} ok, {warn} warn, {red} red",
            checks.len(),
            checks.len() - red - warn
        );
    }
    if red > 0 {
        bail!("{red} check(s) red; see the fixes above");
    }
    Ok(())
}

fn check(name: &'static str, health: Health, detail: String, fix: Option<&str>) -> DoctorCheck {
    DoctorCheck {
        name,
        health,
        detail,
        fix: fix.map(str::to_owned),
    }
}

async fn checks(config: &Config, args: &DoctorArgs) -> Vec<DoctorCheck> {
    let described = if config.subscriptions.is_empty() {
        format!("{} sink", config.sink.kind())
    } else {
        let names: Vec<&str> = config
            .subscriptions
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        format!("subscriptions {}", names.join(", "))
    };
    let mut out = vec![check(
        "config",
        Health::Ok,
        format!("valid: {} source, {described}", config.source.kind()),
        None,
    )];
    if let Some(schemas) = schemas(config) {
        out.push(schemas);
    }
    // The database and the broker are checked at the same time: with both down, the answer
    // takes one timeout, not two.
    let database = async {
        match config.source.open(OpenOptions { connections: 2 }).await {
            Ok(backend) => {
                let thresholds = DoctorThresholds {
                    stuck_after: config.metrics.stuck_after,
                    stale_transaction: args.stale_transaction,
                };
                backend.doctor(thresholds).await
            }
            Err(e) => vec![check(
                "database",
                Health::Red,
                crate::chain(&e),
                Some(e.fix),
            )],
        }
    };
    if config.subscriptions.is_empty() {
        let (database, sink, payload) = tokio::join!(
            database,
            sink(&config.sink, None, args.sink_timeout),
            payload(config, &config.sink, None, args.sink_timeout)
        );
        out.extend(database);
        out.push(sink);
        out.extend(payload);
        out.extend(crate::subscription_cmd::doctor(config).await);
        return out;
    }
    let subscriptions = futures::future::join_all(
        config
            .subscriptions
            .iter()
            .map(|s| subscription(config, &s.name, args.sink_timeout)),
    );
    let (database, subscriptions) = tokio::join!(database, subscriptions);
    out.extend(database);
    out.extend(subscriptions.into_iter().flatten());
    out.extend(crate::subscription_cmd::doctor(config).await);
    out
}

/// `[payload] schemas`: every schema file compiled, as the relay compiles them at start; a
/// broken one is red, named. `None` when no schemas are configured.
fn schemas(config: &Config) -> Option<DoctorCheck> {
    let dir = config.payload.schemas.as_deref()?;
    Some(match outbox_runtime::schemas::Schemas::load(dir) {
        Ok(schemas) => {
            let files = schemas.files();
            check(
                "payload_schemas",
                Health::Ok,
                format!(
                    "{} schema(s) in {} compile: {}",
                    files.len(),
                    dir.display(),
                    if files.is_empty() {
                        "none (every event passes unvalidated)".to_owned()
                    } else {
                        files.join(", ")
                    }
                ),
                None,
            )
        }
        Err(errors) => check(
            "payload_schemas",
            Health::Red,
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            Some(
                "fix or remove the file named above: the relay refuses to start with it (docs/payloads.md)",
            ),
        ),
    })
}

/// A subscription's table (it exists: `outbox migrate` created it) and its sink.
async fn subscription(config: &Config, name: &str, timeout: Duration) -> Vec<DoctorCheck> {
    let one = match outbox_runtime::subscription::for_subscription(config, name) {
        Ok(one) => one,
        Err(e) => return vec![check("subscription", Health::Red, e, None)],
    };
    let table = async {
        match one.source.open(OpenOptions { connections: 1 }).await {
            Ok(backend) => match backend.pending().await {
                Ok(pending) => check(
                    "subscription",
                    Health::Ok,
                    format!(
                        "`{name}`: table {} readable, {} pending",
                        backend.table(),
                        pending.map_or_else(|| "n/a".to_owned(), |p| p.to_string())
                    ),
                    None,
                ),
                Err(e) => check(
                    "subscription",
                    Health::Red,
                    format!("`{name}`: table {}: {}", backend.table(), crate::chain(&e)),
                    Some("run `outbox migrate` (it creates every subscription's table)"),
                ),
            },
            Err(e) => check(
                "subscription",
                Health::Red,
                format!("`{name}`: {}", crate::chain(&e)),
                Some(e.fix),
            ),
        }
    };
    let (table, sink, payload) = tokio::join!(
        table,
        sink(&one.sink, Some(name), timeout),
        payload(config, &one.sink, Some(name), timeout)
    );
    let mut out = vec![table, sink];
    out.extend(payload);
    out
}

/// The sink's `encryption` and `claim_check` (its own or `[payload]`'s), each checked as the
/// relay will use it: a data key made, the store written to and its expiry rule in place.
async fn payload(
    config: &Config,
    sink: &outbox_runtime::SinkConfig,
    subscription: Option<&str>,
    timeout: Duration,
) -> Vec<DoctorCheck> {
    let prefix = subscription.map_or_else(String::new, |name| format!("`{name}`: "));
    let options = sink.payload(&config.payload.options());
    let encoder = match outbox_payload::Encoder::connect(&options, sink.message_limit()).await {
        Ok(Some(encoder)) => encoder,
        Ok(None) => return Vec::new(),
        Err(e) => {
            return vec![check(
                "payload",
                Health::Red,
                format!("{prefix}{}", e.report()),
                Some("fix `claim_check` / `encryption` as named above (docs/payloads.md)"),
            )];
        }
    };
    let Ok(results) = tokio::time::timeout(timeout, encoder.check()).await else {
        return vec![check(
            "payload",
            Health::Red,
            format!(
                "{prefix}the claim-check store or the key service did not answer within {timeout:?}"
            ),
            Some("check the network path to S3 / KMS and the endpoint_url"),
        )];
    };
    results
        .into_iter()
        .map(|(part, result)| {
            let name = if part == "encryption" {
                "payload_encryption"
            } else {
                "payload_claim_check"
            };
            match result {
                Ok(found) => check(name, Health::Ok, format!("{prefix}{found}"), None),
                Err(e) => check(
                    name,
                    Health::Red,
                    format!("{prefix}{}", e.report()),
                    Some(if part == "encryption" {
                        "give the relay kms:GenerateDataKey on the key, or fix encryption.key (docs/payloads.md, \"Encryption\")"
                    } else {
                        "run `outbox migrate` (it sets the expiry rule), and give the relay s3:PutObject on the prefix (docs/payloads.md, \"Claim-check\")"
                    }),
                ),
            }
        })
        .collect()
}

/// Checks the broker as the relay's sink would reach it, changing nothing (no stream or file
/// is created: [`outbox_core::BuildSink::check`]), giving up after `timeout`.
async fn sink(
    sink: &outbox_runtime::SinkConfig,
    subscription: Option<&str>,
    timeout: Duration,
) -> DoctorCheck {
    let kind = match subscription {
        Some(name) => format!("`{name}`: {}", sink.kind()),
        None => sink.kind().to_owned(),
    };
    match tokio::time::timeout(timeout, sink.check()).await {
        Ok(Ok(found)) => check(
            "sink",
            Health::Ok,
            match subscription {
                Some(name) => format!("`{name}`: {found}"),
                None => found,
            },
            None,
        ),
        Ok(Err(e)) if e.kind() == SinkErrorKind::Unavailable => check(
            "sink",
            Health::Red,
            format!("{kind} sink unreachable: {}", e.report()),
            Some("check [sink] url and that the broker runs and accepts this client"),
        ),
        Ok(Err(e)) => check(
            "sink",
            Health::Red,
            format!("{kind} sink: {}", e.report()),
            Some("fix the [sink] section or the broker's setup named above"),
        ),
        Err(_) => check(
            "sink",
            Health::Red,
            format!(
                "{kind} sink: no answer within {timeout:?} (the broker accepts connections but does not respond, or the address is filtered)"
            ),
            Some(
                "check [sink] url and the network path to the broker; `--sink-timeout` waits longer",
            ),
        ),
    }
}
