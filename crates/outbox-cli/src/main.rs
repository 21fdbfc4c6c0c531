//! The `outbox` command: the relay and every operator command (`outbox --help` lists them).
//!
//! Thin on purpose: each command parses its flags, loads the config, and calls the runtime
//! (`outbox-runtime`) and the backend it opens; no command names a database. Errors reach
//! the user as one line (plus its causes), with a non-zero exit code.

mod admin;
mod backend;
mod backfill;
mod bench;
mod capture;
mod crash_test;
mod dead;
mod demo;
mod doctor;
mod replay;
mod retention;
mod subscription_cmd;
mod verify;
mod why;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Transactional outbox relay: publishes the events your transactions wrote, at least once,
/// in per-aggregate order.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, long_about = None)]
struct Cli {
    /// Config file (TOML). Default: ./outbox.toml if present, else the embedded default
    /// (SQLite `outbox.db` + stdout).
    #[arg(long, short = 'c', global = true, env = "OUTBOX_CONFIG")]
    config: Option<PathBuf>,
    /// Database URL; overrides `[source] url` (and picks the source kind when unset).
    #[arg(
        long,
        global = true,
        env = "OUTBOX_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
    /// Act on one subscription's own table (`[[subscription]] name`): its backlog, dead
    /// letters, `why`, replay and retention; with `relay`, run only its pipeline.
    #[arg(long, global = true, value_name = "NAME")]
    subscription: Option<String>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "OUTBOX_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// See the whole pattern work in seconds: SQLite + JSON lines, no services needed.
    Demo(demo::DemoArgs),
    /// Create or upgrade the outbox schema (idempotent, safe to run concurrently).
    Migrate(admin::MigrateArgs),
    /// Run the relay until SIGTERM/SIGINT, then finish the batch in flight and exit 0.
    Relay(RelayArgs),
    /// Show the backlog and what holds delivery back.
    Status {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check the configuration and print the effective one as TOML (secrets as ***).
    CheckConfig,
    /// Dead letters: list, show, retry, purge.
    #[command(subcommand)]
    Dead(dead::DeadCommand),
    /// Publish delivered events again (same ids), e.g. after a consumer lost data.
    Replay(replay::ReplayArgs),
    /// The subscription catalog every relay fans out by: list, pause, resume, remove.
    #[command(subcommand)]
    Subscription(subscription_cmd::SubscriptionCommand),
    /// Copy the retained events a subscription takes into its table, in commit order, while
    /// relays run (`--subscription NAME`, then `--since DURATION` or `--all`).
    Backfill(backfill::BackfillArgs),
    /// Tell the story of one event: attempts, errors, delivery, or what it waits for.
    Why(why::WhyArgs),
    /// Check the config, the database and the broker; exit non-zero when anything is red.
    Doctor(doctor::DoctorArgs),
    /// Built-in load generator: drain a backlog or hold a rate, report events/s, latency,
    /// CPU and memory.
    Bench(bench::BenchArgs),
    /// Delete delivered events older than a window (and rotate partitions).
    #[command(subcommand)]
    Retention(retention::RetentionCommand),
    /// Business tables as event sources: install, remove or list the triggers that turn their
    /// inserts (and updates) into outbox events in the same transaction (`[[capture]]`).
    #[command(subcommand)]
    Capture(capture::CaptureCommand),
    /// Prove delivery: reconcile the events the table says were delivered in a window with
    /// what the destination holds (lost, phantom, duplicates, order breaks). Exit 0 all
    /// good, 1 something lost, phantom or out of order, 2 cannot verify.
    Verify(verify::VerifyArgs),
    /// The kill -9 test on your own database and broker, in a scratch table and destination
    /// it creates and removes: producers with rollbacks, relays killed, paused and restarted,
    /// then verify. Exit 0 PASS, 1 FAIL, 2 cannot run (refuses what looks like production
    /// without --yes).
    CrashTest(crash_test::CrashTestArgs),
}

/// `outbox relay` arguments.
#[derive(Debug, clap::Args)]
struct RelayArgs {
    /// Relay the scratch outbox of `outbox crash-test` run TAG (set by the crash test for
    /// the relays it starts).
    #[arg(long, value_name = "TAG", hide = true)]
    crash_test_scratch: Option<String>,
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    // Long-running commands log their progress; the others print a report (or a story, for
    // the demo) on stdout, and info-level library chatter on stderr would only repeat or
    // drown it. OUTBOX_LOG=info brings it back.
    let default_level = match cli.command {
        Command::Relay(_)
        | Command::Bench(_)
        | Command::Retention(_)
        | Command::Replay(_)
        | Command::Backfill(_) => "info",
        // The NATS and RabbitMQ clients log a refused connection as ERROR lines of their own; the command's
        // verdict already says it, with the URL.
        _ => "warn,async_nats=off,lapin=off",
    };
    init_tracing(cli.log_format, default_level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let load = || {
        load_config(
            cli.config.as_deref(),
            cli.database_url.as_deref(),
            cli.subscription.as_deref(),
        )
    };
    let done = match cli.command {
        // Its own exit codes: 0 proven, 1 a finding, 2 cannot verify.
        Command::Verify(args) => return Ok(verify::run(load(), args).await),
        Command::Demo(args) => demo::run(args).await.map(|_| ()),
        Command::Migrate(args) => admin::migrate(&load()?.0, args).await,
        Command::CrashTest(args) => {
            let invocation = crash_test::Invocation {
                config: cli.config.clone(),
                database_url: cli.database_url.clone(),
                subscription: cli.subscription.clone(),
            };
            return Ok(crash_test::run(load(), invocation, args).await);
        }
        Command::Relay(args) => {
            // Signals first: SIGTERM during start-up still means "stop cleanly".
            let shutdown = outbox_runtime::relay::cancel_on_signal()?;
            let scratch = args
                .crash_test_scratch
                .as_deref()
                .map(crash_test::scratch::parse_tag)
                .transpose()?;
            // The relay reads its configuration again on SIGHUP exactly as here.
            let (path, url, subscription) = (
                cli.config.clone(),
                cli.database_url.clone(),
                cli.subscription.clone(),
            );
            let load_relay = move || -> anyhow::Result<(outbox_runtime::Config, _)> {
                let (config, origin) =
                    load_config(path.as_deref(), url.as_deref(), subscription.as_deref())?;
                let config = match &scratch {
                    Some(tag) => crash_test::scratch::scratch_config(&config, tag)?,
                    None => config,
                };
                Ok((config, origin))
            };
            let (config, origin) = load_relay()?;
            outbox_runtime::reload::apply_log_level(config.tracing.log_level.as_deref())
                .map_err(|e| anyhow::anyhow!("tracing.log_level: {e}"))?;
            let loader: outbox_runtime::reload::Loader = std::sync::Arc::new(move || {
                load_relay()
                    .map(|(config, _)| config)
                    .map_err(|e| chain(e.as_ref()))
            });
            outbox_runtime::relay::run_reloadable(config, &origin, shutdown, Some(loader))
                .await
                .map(drop)
                .map_err(|e| anyhow::anyhow!(chain(&e)))
        }
        Command::Status { json } => admin::status(&load()?.0, json).await,
        Command::Dead(command) => dead::run(&load()?.0, command).await,
        Command::Retention(command) => retention::run(&load()?.0, command).await,
        Command::Capture(command) => capture::run(&load()?.0, command).await,
        Command::Replay(args) => replay::run(&load()?.0, args).await,
        Command::Subscription(command) => subscription_cmd::run(&load()?.0, command).await,
        Command::Backfill(args) => {
            let invocation = backfill::Invocation {
                config: cli.config.as_deref(),
                database_url: cli.database_url.as_deref(),
                subscription: cli.subscription.as_deref(),
            };
            backfill::run(invocation, args).await
        }
        Command::Why(args) => why::run(&load()?.0, args).await,
        Command::Doctor(args) => doctor::run(load(), args).await,
        Command::Bench(args) => {
            let shutdown = outbox_runtime::relay::cancel_on_signal()?;
            bench::run(args, load()?.0, shutdown).await
        }
        Command::CheckConfig => {
            let (config, origin) = load()?;
            println!(
                "# The configuration from {origin} is valid. Effective values, defaults filled\n# in; secrets are shown as ***.\n\n{}",
                config.to_redacted_toml()?
            );
            Ok(())
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}

/// The configuration (`--config`, `--database-url`), narrowed to one subscription's own
/// pipeline with `--subscription`.
fn load_config(
    path: Option<&std::path::Path>,
    database_url: Option<&str>,
    subscription: Option<&str>,
) -> anyhow::Result<(outbox_runtime::Config, outbox_runtime::Origin)> {
    let (config, origin) = outbox_runtime::config::load(path, database_url)?;
    match subscription {
        Some(name) => Ok((
            outbox_runtime::subscription::for_subscription(&config, name)
                .map_err(|e| anyhow::anyhow!(e))?,
            origin,
        )),
        None => Ok((config, origin)),
    }
}

fn init_tracing(format: LogFormat, default_level: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, fmt, reload};
    // sqlx logs every server NOTICE ("schema already exists, skipping") at info; the
    // RabbitMQ client's certificate verifier logs each refused certificate at error,
    // which the sink's own error already reports with the reason.
    let startup = std::env::var("OUTBOX_LOG")
        .ok()
        .filter(|spec| EnvFilter::builder().parse(spec).is_ok())
        .unwrap_or_else(|| format!("{default_level},sqlx=warn,rustls_platform_verifier=off"));
    // Behind a reload handle: `[tracing] log_level` is applied after the config is read, and
    // again by each reload (SIGHUP, the console), without a restart.
    let (filter, handle) = reload::Layer::new(EnvFilter::new(&startup));
    outbox_runtime::reload::install_log_filter(Box::new(move |level| {
        let filter = EnvFilter::builder()
            .parse(level.unwrap_or(&startup))
            .map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    }));
    // Colours only on a terminal: log files and journald get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = fmt::layer()
        .with_ansi(ansi)
        // A closed stderr must not turn a log line into a panic (tracing-subscriber reports
        // write errors with eprintln!, which panics on a broken pipe).
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => registry.with(layer).init(),
        LogFormat::Json => registry.with(layer.json()).init(),
    }
}

/// An error and its causes on one line, skipping causes already contained in the message.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// `outbox status | head` closes the pipe before the report is printed: like any Unix tool,
/// stop quietly (exit 141, 128 + SIGPIPE) instead of panicking with a backtrace. Rust ignores
/// SIGPIPE, so a write to the closed pipe fails and `println!` panics with this message;
/// every other panic goes to the default hook.
fn quiet_on_closed_stdout() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default_hook(info);
    }));
}
