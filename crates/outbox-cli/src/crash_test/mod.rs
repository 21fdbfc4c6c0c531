//! `outbox crash-test`: the kill -9 test, run against the user's own database and broker in
//! a scratch outbox table and a scratch destination that it creates and removes.
//!
//! Producers write events in transactions (some rolled back on purpose) while relay
//! subprocesses are killed with SIGKILL, paused past their claim with SIGSTOP, and started
//! again. Then the producers stop, the relays drain the table (the wait is on the table's
//! backlog reaching zero), stop, and `verify` reconciles the table with the destination;
//! the crash test also checks that no rolled-back event reached it.
//!
//! Exit codes: 0 PASS; 1 FAIL (an event lost, a phantom, a rolled-back event delivered, an
//! order break, or a backlog that never drained); 2 the test could not run (an unreachable
//! database or broker, a destination that cannot be read back, a database or broker that
//! looks like production without `--yes`: [`guard`]).

mod chaos;
mod guard;
mod producers;
mod report;
pub(crate) mod scratch;

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use outbox_core::Backend;
use outbox_core::verify::{NoProgress, Window};
use outbox_runtime::verify::Verdict;
use outbox_runtime::{Config, Origin};
use rand::Rng;
use time::OffsetDateTime;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use self::chaos::{Chaos, Relays};
use self::producers::Written;
use self::report::{Outcome, Progress};
use self::scratch::Created;

/// `outbox crash-test` arguments.
#[derive(Debug, Args)]
pub(crate) struct CrashTestArgs {
    /// How long the producers write while relays are killed and paused (`60s`, `5m`).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    duration: Duration,
    /// Relay processes running side by side.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=16))]
    relays: u16,
    /// Producer tasks writing concurrently (each to aggregates of its own).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    producers: u16,
    /// Run even when the database or the broker looks like production (docs/operations.md,
    /// "Crash test").
    #[arg(long)]
    yes: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// How this command was invoked, for the relays it starts (they load the same config).
#[derive(Debug, Clone, Default)]
pub(crate) struct Invocation {
    /// `--config`.
    pub(crate) config: Option<PathBuf>,
    /// `--database-url`, passed to the relays in their environment (never on a command line).
    pub(crate) database_url: Option<String>,
    /// `--subscription`.
    pub(crate) subscription: Option<String>,
}

/// `--duration`: a humantime duration of at least a second.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration < Duration::from_secs(1) {
        return Err("must be at least 1s".to_owned());
    }
    Ok(duration)
}

/// How long the drain may make no progress before the run gives up on it.
const DRAIN_STALL: Duration = Duration::from_secs(60);
/// Relays exiting by themselves this often mean they cannot run at all.
const MAX_RELAY_EXITS: u64 = 10;

/// Runs the crash test and prints its result; returns the exit code (0, 1 or 2).
pub(crate) async fn run(
    loaded: anyhow::Result<(Config, Origin)>,
    invocation: Invocation,
    args: CrashTestArgs,
) -> ExitCode {
    let progress = Progress::new(!args.json);
    let config = match loaded {
        Ok((config, _)) => config,
        Err(e) => return report::cannot_run(&crate::chain(e.as_ref()), args.json, &[]),
    };
    let tag = scratch::new_tag();
    let scratch = match scratch::scratch_config(&config, &tag) {
        Ok(scratch) => scratch,
        Err(e) => return report::cannot_run(&crate::chain(e.as_ref()), args.json, &[]),
    };
    if !args.yes {
        progress.stage("checking that the database and the broker do not look like production");
        let signs = guard::production_signs(&config).await;
        if !signs.is_empty() {
            progress.finish();
            let reason = format!(
                "refusing to run: this looks like production ({}); run it against a test database and broker, or pass --yes (docs/operations.md, \"Crash test\")",
                signs.join("; ")
            );
            return report::cannot_run(&reason, args.json, &[]);
        }
    }
    let mut created = Created::default();
    // SIGINT / SIGTERM end the run early, but not the clean-up: the run (with its relays,
    // killed as they are dropped) is abandoned, and the scratch is removed as after any run.
    let interrupted = outbox_runtime::relay::cancel_on_signal().ok();
    let result = tokio::select! {
        result = run_in_scratch(&scratch, &tag, &invocation, &args, &mut created, &progress) => result,
        () = async {
            match &interrupted {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        } => Err(anyhow!("interrupted by a signal before the verdict")),
    };
    progress.stage("removing the scratch table and destination");
    let removals = scratch::remove(&scratch, &created).await;
    progress.finish();
    match result {
        Ok(outcome) => report::print(&outcome, &removals, args.json),
        Err(e) => report::cannot_run(&crate::chain(e.as_ref()), args.json, &removals),
    }
}

/// Creates the scratch outbox, runs producers and relays under chaos, drains, verifies.
/// `Err`: the test could not run. Relays are stopped before it returns, whatever happened.
async fn run_in_scratch(
    scratch: &Config,
    tag: &outbox_core::Identifier,
    invocation: &Invocation,
    args: &CrashTestArgs,
    created: &mut Created,
    progress: &Progress,
) -> anyhow::Result<Outcome> {
    progress.stage(&format!("opening {}", scratch.source.describe()));
    let (backend, table) = scratch::create_table(scratch).await?;
    created.table = Some(table.clone());
    progress.line(&format!("created {table}"));
    progress.stage(&format!("connecting to the {} broker", scratch.sink.kind()));
    let destination = scratch::create_destination(scratch).await?;
    created.destination = Some(destination.clone());
    progress.line(&format!("created scratch destination {destination}"));
    // Probe the writes the run needs before starting anything.
    backend.producer().map_err(|e| anyhow!(e))?;
    backend.scratch().map_err(|e| anyhow!(e))?;

    let logs = std::env::temp_dir().join(tag.as_str());
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let program = std::env::current_exe().context("finding the outbox binary")?;
    let mut relay_args: Vec<OsString> = vec![
        "relay".into(),
        "--crash-test-scratch".into(),
        tag.as_str().into(),
    ];
    if let Some(path) = &invocation.config {
        relay_args.extend(["--config".into(), path.clone().into_os_string()]);
    }
    if let Some(name) = &invocation.subscription {
        relay_args.extend(["--subscription".into(), name.into()]);
    }
    let envs: Vec<(String, String)> = invocation
        .database_url
        .iter()
        .map(|url| ("OUTBOX_DATABASE_URL".to_owned(), url.clone()))
        .collect();
    let started_at = OffsetDateTime::now_utc();
    let mut relays = Relays::start(program, relay_args, envs, &logs, usize::from(args.relays))?;
    let chaos = Chaos::default();
    let written = Arc::new(Written::default());
    let run = drive(
        &backend,
        &mut relays,
        &chaos,
        &written,
        args,
        started_at,
        progress,
    )
    .await;
    // Verify while the relays still run (idle: the table is drained): a change stream (CDC)
    // confirms the server's latest position only while a relay streams, and verify waits
    // for that confirmation.
    let checked = match run {
        Ok((rolled_back, drain)) => verify(scratch, started_at, progress)
            .await
            .map(|verified| (rolled_back, drain, verified)),
        Err(e) => Err(e),
    };
    progress.stage("stopping the relays");
    relays.stop().await;
    let (rolled_back, drain, verified) = checked?;
    // A run that committed nothing tested nothing: never a PASS.
    anyhow::ensure!(
        written.committed.load(Ordering::Relaxed) > 0,
        "no event was committed during the run, so nothing was tested ({} write(s) failed); try a longer --duration",
        written.failed.load(Ordering::Relaxed)
    );
    let since = verified.window.since;
    progress.stage("looking for rolled-back events at the destination");
    let rolled_back_seen = rolled_back_at_destination(scratch, since, &rolled_back).await?;
    let failed = verified.verdict == Verdict::Failed
        || !rolled_back_seen.is_empty()
        || drain.undelivered > 0;
    let log_tails = failed.then(|| relays.log_tails(15));
    if !failed {
        let _ = std::fs::remove_dir_all(&logs);
    }
    Ok(Outcome {
        duration: args.duration,
        relays: args.relays,
        producers: args.producers,
        database: scratch.source.describe(),
        table,
        committed: written.committed.load(Ordering::Relaxed),
        rolled_back: rolled_back.len() as u64,
        failed_writes: written.failed.load(Ordering::Relaxed),
        kills: chaos.kills.load(Ordering::Relaxed),
        pauses: chaos.pauses.load(Ordering::Relaxed),
        relay_exits: chaos.exits.load(Ordering::Relaxed),
        pause_seconds: chaos::PAUSE.as_secs(),
        drain_seconds: drain.seconds,
        undelivered: drain.undelivered,
        rolled_back_seen,
        verified,
        logs: failed.then_some(logs),
        log_tails,
    })
}

/// `outbox verify` over the scratch config, from just before the run; `Err` when it cannot
/// verify.
async fn verify(
    scratch: &Config,
    started_at: OffsetDateTime,
    progress: &Progress,
) -> anyhow::Result<outbox_runtime::verify::Report> {
    progress.stage("verifying the scratch destination against the scratch table");
    let options = outbox_runtime::verify::Options {
        since: started_at - time::Duration::seconds(5),
        max_ids: 10,
    };
    let verified = outbox_runtime::verify::verify(scratch, &options, progress)
        .await
        .map_err(|e| anyhow!("{}", e.0))?;
    if verified.verdict == Verdict::CannotVerify {
        return Err(anyhow!(
            "{}",
            verified
                .cannot_verify
                .clone()
                .unwrap_or_else(|| "verify could not check the destination".to_owned())
        ));
    }
    Ok(verified)
}

/// How the drain ended.
struct Drain {
    /// Seconds from the producers' stop to an empty backlog (or to giving up).
    seconds: f64,
    /// Events still undelivered when the drain ended (0: drained).
    undelivered: u64,
}

/// Producers and chaos for `--duration`, then the drain with every relay running.
async fn drive(
    backend: &Arc<dyn Backend>,
    relays: &mut Relays,
    chaos: &Chaos,
    written: &Arc<Written>,
    args: &CrashTestArgs,
    started_at: OffsetDateTime,
    progress: &Progress,
) -> anyhow::Result<(Vec<Uuid>, Drain)> {
    let stop = CancellationToken::new();
    let producers = tokio::spawn(producers::run(
        backend.clone(),
        usize::from(args.producers),
        written.clone(),
        stop.clone(),
    ));
    let start = Instant::now();
    let deadline = start + args.duration;
    let mut next_strike = start + strike_gap();
    while Instant::now() < deadline && !stop.is_cancelled() {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = stop.cancelled() => break,
        }
        for line in relays.tend(chaos, false).await? {
            progress.line(&line);
        }
        if chaos.exits.load(Ordering::Relaxed) > MAX_RELAY_EXITS {
            stop.cancel();
            let _ = producers.await;
            return Err(anyhow!(
                "the relays keep exiting by themselves, so the test cannot run:\n{}",
                relays.log_tails(10)
            ));
        }
        if Instant::now() >= next_strike {
            let line = relays.strike(chaos).await?;
            progress.line(&line);
            next_strike = Instant::now() + strike_gap();
        }
        progress.running(start.elapsed(), args.duration, written, chaos);
    }
    stop.cancel();
    let rolled_back = producers
        .await
        .map_err(|e| anyhow!("the producers failed: {e}"))??;

    progress.stage("stopped the producers; waiting for the relays to drain the scratch table");
    for line in relays.tend(chaos, true).await? {
        progress.line(&line);
    }
    let drain_started = Instant::now();
    let mut best = u64::MAX;
    let mut progressed_at = Instant::now();
    let window_since = started_at - time::Duration::minutes(1);
    loop {
        let undelivered = undelivered(backend.as_ref(), window_since).await?;
        if undelivered == Some(0) {
            break;
        }
        if let Some(n) = undelivered
            && n < best
        {
            best = n;
            progressed_at = Instant::now();
        } else if progressed_at.elapsed() > DRAIN_STALL {
            return Ok((
                rolled_back,
                Drain {
                    seconds: drain_started.elapsed().as_secs_f64(),
                    undelivered: undelivered.unwrap_or(best.min(u64::from(u32::MAX))).max(1),
                },
            ));
        }
        progress.stage(&match undelivered {
            Some(n) => format!("draining: {n} event(s) not delivered yet"),
            None => "draining: waiting for the change stream to confirm".to_owned(),
        });
        for line in relays.tend(chaos, true).await? {
            progress.line(&line);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok((
        rolled_back,
        Drain {
            seconds: drain_started.elapsed().as_secs_f64(),
            undelivered: 0,
        },
    ))
}

/// Time to the next kill or pause: 0.4 to 1.2 s.
fn strike_gap() -> Duration {
    Duration::from_millis(rand::rng().random_range(400..1_200))
}

/// Events of the scratch table not delivered yet: its pending rows, or for a change stream
/// (CDC), what the stream has not confirmed (`None`: the stream could not confirm up to now
/// yet, which counts as no progress).
async fn undelivered(backend: &dyn Backend, since: OffsetDateTime) -> anyhow::Result<Option<u64>> {
    if let Some(pending) = backend
        .pending()
        .await
        .map_err(|e| anyhow!("{}", crate::chain(&e)))
        .context("reading the scratch table's backlog")?
    {
        return Ok(Some(pending));
    }
    let ledger = backend.delivery_ledger().map_err(|e| anyhow!(e))?;
    let window = Window {
        since,
        until: OffsetDateTime::now_utc(),
    };
    Ok(ledger
        .delivered(window)
        .await
        .ok()
        .map(|read| read.undelivered))
}

/// The rolled-back ids found at the scratch destination (each once).
async fn rolled_back_at_destination(
    scratch: &Config,
    since: OffsetDateTime,
    rolled_back: &[Uuid],
) -> anyhow::Result<Vec<Uuid>> {
    let rolled_back: HashSet<Uuid> = rolled_back.iter().copied().collect();
    let reader = scratch
        .sink
        .read_back()
        .await
        .map_err(|e| anyhow!("reading the scratch destination back: {e}"))?;
    let read = reader
        .read(
            since - outbox_runtime::verify::READ_MARGIN,
            &[],
            &NoProgress,
        )
        .await
        .map_err(|e| anyhow!("reading the scratch destination back: {e}"))?;
    let mut seen = HashSet::new();
    Ok(read
        .messages
        .iter()
        .filter_map(|m| m.identity.id)
        .filter(|id| rolled_back.contains(id) && seen.insert(*id))
        .collect())
}
