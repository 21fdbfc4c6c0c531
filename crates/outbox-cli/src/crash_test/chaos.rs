//! The relays of a crash test: `outbox relay` subprocesses on the scratch outbox, killed with
//! SIGKILL at random and started again, and paused with SIGSTOP for longer than a claim lasts,
//! then resumed with SIGCONT (another relay must take the claim over, and the paused one must
//! not publish what it no longer owns).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow};
use outbox_core::backend::SCRATCH_CLAIM_TIMEOUT;
use rand::Rng;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long a relay stays paused: past its claim.
pub(crate) const PAUSE: Duration = SCRATCH_CLAIM_TIMEOUT.saturating_add(Duration::from_secs(1));
/// How long a stopping relay has to finish its batch after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What the chaos did so far.
#[derive(Debug, Default)]
pub(crate) struct Chaos {
    /// SIGKILLs (each followed by a restart).
    pub(crate) kills: AtomicU64,
    /// SIGSTOP pauses past the claim.
    pub(crate) pauses: AtomicU64,
    /// Relays that exited by themselves and were started again.
    pub(crate) exits: AtomicU64,
}

/// One relay slot: its process, and until when it is paused.
struct Slot {
    child: Child,
    paused_until: Option<Instant>,
}

/// The relay subprocesses.
pub(crate) struct Relays {
    program: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(String, String)>,
    logs: PathBuf,
    slots: Vec<Slot>,
}

impl Relays {
    /// Starts `count` relays of `program` with `args` (`relay --crash-test-scratch TAG ...`)
    /// and `envs` added to the environment, each logging to `<logs>/relay-<i>.log`.
    pub(crate) fn start(
        program: PathBuf,
        args: Vec<OsString>,
        envs: Vec<(String, String)>,
        logs: &Path,
        count: usize,
    ) -> anyhow::Result<Self> {
        let mut relays = Self {
            program,
            args,
            envs,
            logs: logs.to_owned(),
            slots: Vec::with_capacity(count),
        };
        for i in 0..count {
            let child = relays.spawn(i)?;
            relays.slots.push(Slot {
                child,
                paused_until: None,
            });
        }
        Ok(relays)
    }

    /// The log file of relay `i`.
    pub(crate) fn log_path(&self, i: usize) -> PathBuf {
        self.logs.join(format!("relay-{i}.log"))
    }

    fn spawn(&self, i: usize) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(i))
            .with_context(|| format!("opening {}", self.log_path(i).display()))?;
        let err = log.try_clone()?;
        Command::new(&self.program)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting `{} relay`", self.program.display()))
    }

    /// One random act: SIGKILL a relay and start it again, or (when none is paused) pause one
    /// past its claim.
    pub(crate) async fn strike(&mut self, chaos: &Chaos) -> anyhow::Result<String> {
        let (victim, pause) = {
            let mut rng = rand::rng();
            let victim = rng.random_range(0..self.slots.len());
            let none_paused = self.slots.iter().all(|s| s.paused_until.is_none());
            (victim, none_paused && rng.random_ratio(1, 3))
        };
        if pause && self.slots[victim].paused_until.is_none() {
            signal(&self.slots[victim].child, "-STOP")?;
            self.slots[victim].paused_until = Some(Instant::now() + PAUSE);
            chaos.pauses.fetch_add(1, Ordering::Relaxed);
            return Ok(format!(
                "paused relay {victim} (SIGSTOP) for {}s",
                PAUSE.as_secs()
            ));
        }
        let slot = &mut self.slots[victim];
        slot.child.start_kill().context("SIGKILL")?;
        slot.child.wait().await?;
        slot.paused_until = None;
        let child = self.spawn(victim)?;
        self.slots[victim].child = child;
        chaos.kills.fetch_add(1, Ordering::Relaxed);
        Ok(format!(
            "killed relay {victim} (SIGKILL) and started it again"
        ))
    }

    /// Resumes relays whose pause is over (all of them with `all`), and starts again any relay
    /// that exited by itself; returns a line per such event.
    pub(crate) async fn tend(&mut self, chaos: &Chaos, all: bool) -> anyhow::Result<Vec<String>> {
        let now = Instant::now();
        let mut lines = Vec::new();
        for i in 0..self.slots.len() {
            if let Some(until) = self.slots[i].paused_until
                && (all || until <= now)
            {
                signal(&self.slots[i].child, "-CONT")?;
                self.slots[i].paused_until = None;
                lines.push(format!("resumed relay {i} (SIGCONT)"));
            }
            if let Some(status) = self.slots[i].child.try_wait()? {
                chaos.exits.fetch_add(1, Ordering::Relaxed);
                lines.push(format!(
                    "relay {i} exited by itself ({status}); started it again (log: {})",
                    self.log_path(i).display()
                ));
                let child = self.spawn(i)?;
                self.slots[i].child = child;
            }
        }
        Ok(lines)
    }

    /// Stops every relay: SIGCONT, SIGTERM (each finishes its batch), SIGKILL after a grace.
    pub(crate) async fn stop(&mut self) {
        for slot in &mut self.slots {
            if slot.paused_until.take().is_some() {
                let _ = signal(&slot.child, "-CONT");
            }
            let _ = signal(&slot.child, "-TERM");
        }
        for slot in &mut self.slots {
            if tokio::time::timeout(STOP_GRACE, slot.child.wait())
                .await
                .is_err()
            {
                let _ = slot.child.start_kill();
                let _ = slot.child.wait().await;
            }
        }
    }

    /// The last `lines` lines of every relay's log, for a failure report.
    pub(crate) fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for i in 0..self.slots.len() {
            let text = std::fs::read_to_string(self.log_path(i)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- relay {i} ({}) ---\n",
                self.log_path(i).display()
            ));
            for line in &all[all.len().saturating_sub(lines)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// Sends `sig` (`-STOP`, `-CONT`, `-TERM`) with kill(1): the crate forbids `unsafe`, and this
/// runs a few times a second at most.
fn signal(child: &Child, sig: &str) -> anyhow::Result<()> {
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("the relay has already exited"))?;
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .context("running kill(1)")?;
    anyhow::ensure!(status.success(), "kill {sig} {pid} failed");
    Ok(())
}
