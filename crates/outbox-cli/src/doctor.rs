//! `outbox doctor`: checks the config, the database and the broker, and prints one verdict
//! per check (ok / warn / red) with the fix. Exits non-zero when anything is red.
//!
//! The database checks come from the backend ([`outbox_core::Backend::doctor`]); this module
//! adds the config and the sink (built exactly as the relay builds it, then its healthcheck).

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use outbox_core::Sink;
use outbox_core::admin::{DoctorCheck, DoctorThresholds, Health};
use outbox_core::backend::OpenOptions;
use outbox_runtime::{Config, Origin};
use tokio_util::sync::CancellationToken;

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
    let mut out = vec![check(
        "config",
        Health::Ok,
        format!(
            "valid: {} source, {} sink",
            config.source.kind(),
            config.sink.kind()
        ),
        None,
    )];
    match config.source.open(OpenOptions { connections: 2 }).await {
        Ok(backend) => {
            let thresholds = DoctorThresholds {
                stuck_after: config.metrics.stuck_after,
                stale_transaction: args.stale_transaction,
            };
            out.extend(backend.doctor(thresholds).await);
        }
        Err(e) => out.push(check(
            "database",
            Health::Red,
            crate::chain(&e),
            Some(e.fix),
        )),
    }
    out.push(sink(config, args.sink_timeout).await);
    out
}

/// Builds the sink as the relay does (`outbox_runtime::relay::build_sink`), giving up after `timeout`, and
/// runs its healthcheck.
async fn sink(config: &Config, timeout: Duration) -> DoctorCheck {
    let kind = config.sink.kind();
    let give_up = CancellationToken::new();
    let timer = {
        let give_up = give_up.clone();
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            give_up.cancel();
        })
    };
    let built = outbox_runtime::relay::build_sink(&config.sink, &give_up).await;
    let unreachable = |why: String| {
        check(
            "sink",
            Health::Red,
            format!("{kind} sink unreachable: {why}"),
            Some("check [sink] url and that the broker runs and accepts this client"),
        )
    };
    let result = match built {
        Ok(Some(sink)) => match tokio::time::timeout(timeout, sink.healthcheck()).await {
            Ok(Ok(())) => check("sink", Health::Ok, format!("{kind} sink reachable"), None),
            Ok(Err(e)) => unreachable(e.report()),
            Err(_) => unreachable(format!("no answer within {timeout:?}")),
        },
        Ok(None) => unreachable(format!("could not connect within {timeout:?}")),
        Err(e) => check(
            "sink",
            Health::Red,
            crate::chain(&e),
            Some("fix the [sink] section"),
        ),
    };
    timer.abort();
    result
}
