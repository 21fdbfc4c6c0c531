//! Test support for the `outbox` binary: config files, running the binary, reading what
//! reached NATS JetStream.

#![allow(dead_code, unreachable_pub, missing_docs)]

pub mod browser;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, ensure};
use futures::StreamExt;
use tokio::process::{Child, Command};

pub mod verify;

pub const BIN: &str = env!("CARGO_BIN_EXE_outbox");

/// Runs the Python consumer `tests/support/SCRIPT` with `args` (boto3 and cryptography come
/// with moto[server]); its stdout, or an error with its stderr.
pub async fn python_consumer(script: &str, args: &[&str]) -> anyhow::Result<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/support")
        .join(script);
    let out = Command::new("python3")
        .arg(path)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running python3 (boto3 comes with moto[server])")?;
    ensure!(
        out.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A scratch directory with a config file in it.
pub struct Workdir {
    pub dir: tempfile::TempDir,
}

impl Workdir {
    pub fn new() -> anyhow::Result<Self> {
        Ok(Self {
            dir: tempfile::tempdir()?,
        })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write_config(&self, name: &str, toml: &str) -> anyhow::Result<PathBuf> {
        let p = self.dir.path().join(name);
        std::fs::write(&p, toml)?;
        Ok(p)
    }

    /// Runs `outbox ARGS` to completion in this directory, with a clean environment.
    pub async fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        output(self.command(args)).await
    }

    /// Runs `outbox ARGS` as a user does: like [`run`](Self::run), but with the default log
    /// level (no `OUTBOX_LOG`), to check what stderr carries besides the verdict.
    pub async fn run_as_user(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = self.command(args);
        cmd.env_remove("OUTBOX_LOG");
        output(cmd).await
    }

    /// `outbox ARGS` as a command in this directory, with no OUTBOX_* from the test's env.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .current_dir(self.dir.path())
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("OUTBOX_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("OUTBOX_LOG", "info,outbox_core=debug");
        cmd
    }

    /// Runs `outbox ARGS`, which must exit 0; its stdout.
    pub async fn run_ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.run(args).await?;
        ensure!(
            out.code == Some(0),
            "`outbox {}`: {}{}",
            args.join(" "),
            out.stdout,
            out.stderr
        );
        Ok(out.stdout)
    }

    /// Starts `outbox relay --config CONFIG`, logging to `log_name` in this directory.
    pub fn spawn_relay(&self, config: &Path, log_name: &str) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(log_name))?;
        let child = self
            .command(&["relay", "--config", config.to_str().context("utf-8 path")?])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("spawning outbox relay")?;
        Ok(child)
    }

    /// Appends `text` to the log `log_name` in this directory (a marker between runs).
    pub fn append_log(&self, log_name: &str, text: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(log_name))?;
        f.write_all(text.as_bytes())?;
        Ok(())
    }

    pub fn read_log(&self, log_name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(log_name)).unwrap_or_default()
    }
}

#[derive(Debug)]
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// A user error: non-zero exit, one `error:` line on stderr mentioning `needle`, and no
    /// panic or backtrace.
    pub fn assert_clear_error(&self, needle: &str) -> anyhow::Result<()> {
        ensure!(
            self.code.is_some_and(|c| c != 0),
            "expected a non-zero exit: {self:?}"
        );
        ensure!(
            !self.stderr.contains("panicked") && !self.stderr.contains("RUST_BACKTRACE"),
            "panic: {}",
            self.stderr
        );
        let errors: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| l.starts_with("error:"))
            .collect();
        ensure!(
            errors.len() == 1,
            "expected exactly one `error:` line, got: {}",
            self.stderr
        );
        ensure!(
            errors[0].contains(needle),
            "error line does not mention `{needle}`: {}",
            errors[0]
        );
        Ok(())
    }
}

/// The marker a chaos test appends to a relay's log before it starts a replacement.
pub const RESTART_MARKER: &str = "=== restarted by the test ===\n";

/// Chaos: SIGKILLs a random relay of `relays` (`relays[i]` logs to `relay-{i}.log`) every
/// 150-400 ms and starts a replacement, until at least `min_kills` kills were made and
/// `done()` holds. Returns the number of kills.
pub async fn kill_relays_until(
    work: &Workdir,
    config: &Path,
    relays: &mut [Child],
    min_kills: usize,
    done: impl Fn() -> bool,
) -> anyhow::Result<usize> {
    use rand::Rng;
    let mut kills = 0;
    loop {
        let pause = rand::rng().random_range(150..400);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let victim = rand::rng().random_range(0..relays.len());
        relays[victim].start_kill()?;
        relays[victim].wait().await?;
        let log = format!("relay-{victim}.log");
        work.append_log(&log, RESTART_MARKER)?;
        relays[victim] = work.spawn_relay(config, &log)?;
        kills += 1;
        if kills >= min_kills && done() {
            return Ok(kills);
        }
    }
}

/// Stops the relays a chaos test kept restarting (`relays[i]` logs to `relay-{i}.log`): waits
/// until each current one reached its start line (signal handlers are installed before it, so
/// SIGTERM means "drain"), then sends SIGTERM and expects exit code 0.
pub async fn stop_restarted_relays(work: &Workdir, relays: &mut [Child]) -> anyhow::Result<()> {
    for (i, r) in relays.iter_mut().enumerate() {
        let log = format!("relay-{i}.log");
        crate::support::eventually_started(work, &log).await?;
        let code = terminate(r, Duration::from_secs(30)).await?;
        ensure!(
            code == Some(0),
            "relay {i} exited with {code:?} after SIGTERM:\n{}",
            work.read_log(&log)
        );
    }
    Ok(())
}

async fn eventually_started(work: &Workdir, log: &str) -> anyhow::Result<()> {
    outbox_testkit::wait::eventually(Duration::from_secs(90), || async {
        work.read_log(log)
            .rsplit(RESTART_MARKER.trim_end())
            .next()
            .unwrap_or("")
            .contains("starting relay")
    })
    .await
    .with_context(|| format!("{log}: the relay never started:\n{}", work.read_log(log)))
}

/// Sends SIGTERM to a child and waits for it, returning its exit code.
pub async fn terminate(child: &mut Child, within: Duration) -> anyhow::Result<Option<i32>> {
    let pid = child.id().context("child already gone")?;
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM failed");
    let status = tokio::time::timeout(within, child.wait())
        .await
        .context("relay did not exit after SIGTERM")??;
    Ok(status.code())
}

/// One message read back from JetStream.
#[derive(Debug, Clone)]
pub struct Received {
    pub subject: String,
    pub id: String,
    pub aggregate_id: String,
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

/// Reads every message of `stream` in stream order.
pub async fn read_stream(
    client: &async_nats::Client,
    stream: &str,
) -> anyhow::Result<Vec<Received>> {
    let js = async_nats::jetstream::new(client.clone());
    let mut stream = js.get_stream(stream).await.context("stream missing")?;
    let count = stream.info().await?.state.messages as usize;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            ..Default::default()
        })
        .await?;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let mut batch = consumer
            .fetch()
            .max_messages((count - out.len()).min(500))
            .expires(Duration::from_secs(2))
            .messages()
            .await?;
        let before = out.len();
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
            let headers: Vec<(String, String)> = m
                .headers
                .as_ref()
                .map(|h| {
                    h.iter()
                        .flat_map(|(k, vs)| vs.iter().map(move |v| (k.to_string(), v.to_string())))
                        .collect()
                })
                .unwrap_or_default();
            let get = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            out.push(Received {
                subject: m.subject.to_string(),
                id: get("id"),
                aggregate_id: get("aggregate_id"),
                payload: m.payload.to_vec(),
                headers: headers.clone(),
            });
        }
        ensure!(
            out.len() > before,
            "stream read stalled at {} of {count}",
            out.len()
        );
    }
    Ok(out)
}

pub async fn output(mut cmd: Command) -> anyhow::Result<Output> {
    let out = cmd.output().await.context("running outbox")?;
    Ok(Output {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Waits until no event is pending in the outbox (PostgreSQL). Fails only when the backlog
/// stops shrinking for `stall` (a busy machine drains slower, not never).
pub async fn wait_drained(pool: &sqlx::PgPool, stall: Duration) -> anyhow::Result<()> {
    let pending = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE state = 'pending'")
            .fetch_one(pool)
            .await
            .ok()
    };
    let mut lowest = i64::MAX;
    let mut progress_at = tokio::time::Instant::now();
    loop {
        match pending().await {
            Some(0) => return Ok(()),
            Some(n) if n < lowest => {
                lowest = n;
                progress_at = tokio::time::Instant::now();
            }
            _ => {}
        }
        ensure!(
            progress_at.elapsed() < stall,
            "events still pending: {lowest} left, none delivered for {stall:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
