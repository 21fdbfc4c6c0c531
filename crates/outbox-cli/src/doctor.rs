//! `outbox doctor`: checks the config, the database and the broker, and prints one verdict
//! per check (ok / warn / red) with the fix. Exits non-zero when anything is red.
//!
//! The database checks live in `outbox_postgres::doctor`; this module adds the config, the
//! sink (built exactly as the relay builds it, then its healthcheck) and the SQLite subset.

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use outbox_core::Sink;
use outbox_core::source::Inspect;
use outbox_postgres::{DoctorCheck, DoctorThresholds, Health};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Origin, SourceConfig};

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
            match config.source {
                SourceConfig::Postgres(_) => "postgres",
                SourceConfig::Sqlite(_) => "sqlite",
            },
            config.sink.kind()
        ),
        None,
    )];
    match &config.source {
        SourceConfig::Postgres(pg) => match outbox_postgres::connect(pg, 2).await {
            Ok(pool) => {
                let thresholds = DoctorThresholds {
                    stuck_after: config.metrics.stuck_after,
                    stale_transaction: args.stale_transaction,
                };
                out.extend(outbox_postgres::doctor(&pool, pg, thresholds).await);
            }
            Err(e) => out.push(check(
                "database",
                Health::Red,
                format!("cannot connect to {}: {e}", pg.url),
                Some("check source.url (host, port, user, password, database) and that PostgreSQL runs"),
            )),
        },
        SourceConfig::Sqlite(sq) => out.extend(sqlite(config, sq).await),
    }
    out.push(sink(config, args.sink_timeout).await);
    out
}

async fn sqlite(config: &Config, sq: &outbox_sqlite::SqliteConfig) -> Vec<DoctorCheck> {
    let pool = match outbox_sqlite::connect(sq).await {
        Ok(pool) => pool,
        Err(e) => {
            return vec![check(
                "database",
                Health::Red,
                format!("cannot open `{}`: {e}", sq.path.display()),
                Some("check source.path and the directory's permissions"),
            )];
        }
    };
    let mut out = Vec::new();
    match outbox_sqlite::schema_version(&pool, &sq.table).await {
        Ok(Some(v)) if v >= outbox_sqlite::SCHEMA_VERSION => {
            out.push(check("schema", Health::Ok, format!("version {v}"), None));
        }
        Ok(found) => {
            out.push(check(
                "schema",
                Health::Red,
                format!(
                    "outbox table {} has schema version {}, this build expects {}",
                    sq.table,
                    found.map_or("none".to_owned(), |v| v.to_string()),
                    outbox_sqlite::SCHEMA_VERSION
                ),
                Some("run `outbox migrate` (the relay also migrates SQLite when it starts)"),
            ));
            return out;
        }
        Err(e) => {
            out.push(check(
                "schema",
                Health::Red,
                format!("cannot read the schema version: {e}"),
                Some("check that source.path is an outbox database"),
            ));
            return out;
        }
    }
    let inspector = outbox_sqlite::SqliteInspector::new(pool, sq);
    match inspector.backlog().await {
        Ok(b) => {
            let stuck = config.metrics.stuck_after.as_secs_f64();
            out.push(if b.oldest_pending_age_seconds > stuck {
                check(
                    "oldest_pending",
                    Health::Red,
                    format!(
                        "the oldest ready event has waited {:.0}s (metrics.stuck_after = {stuck:.0}s; {} pending)",
                        b.oldest_pending_age_seconds, b.pending
                    ),
                    Some("is `outbox relay` running on this file? `outbox status` shows the relay lease"),
                )
            } else {
                check(
                    "oldest_pending",
                    Health::Ok,
                    format!("{:.1}s ({} pending)", b.oldest_pending_age_seconds, b.pending),
                    None,
                )
            });
            out.push(if b.dead > 0 {
                check(
                    "dead_letters",
                    Health::Warn,
                    format!("{} dead-lettered event(s)", b.dead),
                    Some(
                        "`outbox dead list` shows why; `outbox dead retry` puts them back in line",
                    ),
                )
            } else {
                check("dead_letters", Health::Ok, "none".to_owned(), None)
            });
        }
        Err(e) => out.push(check(
            "oldest_pending",
            Health::Red,
            format!("cannot read the backlog: {}", crate::chain(&e)),
            Some("run `outbox migrate`"),
        )),
    }
    out
}

/// Builds the sink as the relay does (`relay::build_sink`), giving up after `timeout`, and
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
    let built = crate::relay::build_sink(config.sink.clone(), &give_up).await;
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
            crate::chain(e.as_ref()),
            Some("fix the [sink] section"),
        ),
    };
    timer.abort();
    result
}
