//! Running a server binary under a small watchdog shell, so that the server dies with the test
//! process even when nothing is ever dropped (statics) or the process is killed outright.
//!
//! The watchdog is `sh -c WATCHDOG`: it starts the server in the background, polls
//! `/proc/<test pid>` and, once the test process is gone, stops the server with its stop signal
//! and removes the server's directory. A `SIGTERM` to the watchdog stops the server the same way
//! but keeps the directory, which is how [`Supervised::stop`] works (data survives a restart).
//! The watchdog runs in its own process group, so a Ctrl-C in the terminal reaches the test
//! process only and the watchdog still cleans up behind it.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// `$1` test pid, `$2` stop signal, `$3` directory to remove once the test process is gone
/// (may be empty), then the server command line.
///
/// `sleep & wait` instead of a plain `sleep`: `wait` is interrupted by a trapped signal, so a
/// stop request is handled at once. `kill -0` notices a server that exited on its own (the
/// shell reaps it while waiting), and the watchdog then exits with the server's status.
const WATCHDOG: &str = r#"
parent=$1; sig=$2; cleanup=$3; shift 3
"$@" &
child=$!
halt() { kill -s "$sig" "$child" 2>/dev/null; wait "$child"; }
trap 'halt; exit 0' TERM
while [ -d "/proc/$parent" ]; do
  kill -0 "$child" 2>/dev/null || { wait "$child"; exit $?; }
  sleep 0.2 & wait $!
done
halt
if [ -n "$cleanup" ]; then rm -rf -- "$cleanup"; fi
exit 0
"#;

/// How long a server gets to stop after its stop signal before the watchdog is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What to run and how.
pub(crate) struct Launch<'a> {
    /// Short name for error messages (`postgres`, `nats-server`).
    pub(crate) name: &'static str,
    /// The server binary.
    pub(crate) program: &'a Path,
    /// Its arguments.
    pub(crate) args: Vec<OsString>,
    /// Run the server as this user (through `setpriv`), e.g. `postgres` when we are root.
    pub(crate) run_as: Option<&'a str>,
    /// Signal that asks the server to shut down quickly and cleanly (`INT`, `TERM`).
    pub(crate) stop_signal: &'static str,
    /// Directory the watchdog removes once the test process is gone.
    pub(crate) cleanup: Option<&'a Path>,
    /// File that receives the server's stdout and stderr.
    pub(crate) log: &'a Path,
    /// Working directory (one the server's user may enter).
    pub(crate) cwd: &'a Path,
}

/// A running server under its watchdog.
#[derive(Debug)]
pub(crate) struct Supervised {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts the server under a watchdog tied to this process.
    pub(crate) fn spawn(launch: Launch<'_>) -> anyhow::Result<Self> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(launch.log)
            .with_context(|| format!("opening log file `{}`", launch.log.display()))?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("outbox-testkit-watchdog")
            .arg(std::process::id().to_string())
            .arg(launch.stop_signal)
            .arg(launch.cleanup.map(Path::as_os_str).unwrap_or_default());
        if let Some(user) = launch.run_as {
            cmd.arg("setpriv")
                .arg(format!("--reuid={user}"))
                .arg(format!("--regid={user}"))
                .arg("--init-groups")
                .arg("--");
        }
        cmd.arg(launch.program)
            .args(&launch.args)
            .current_dir(launch.cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating log file handle")?)
            .stderr(log)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting `{}` under sh", launch.program.display()))?;
        Ok(Self {
            name: launch.name,
            child,
            log: launch.log.to_owned(),
        })
    }

    /// The exit status if the server (and so its watchdog) has already exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Asks the server to stop (its stop signal, through the watchdog) and waits until it has.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        if self.exited().is_some() {
            return Ok(());
        }
        self.signal_watchdog()?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        // Polling the exit status: a std child gives no notification, and a tokio child would
        // tie the server to the runtime that started it (shared servers outlive runtimes).
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = self.child.kill();
        anyhow::bail!(
            "{} did not stop within {STOP_TIMEOUT:?}\n{}",
            self.name,
            self.log_tail()
        )
    }

    /// Like [`Supervised::stop`], blocking (for `Drop`).
    pub(crate) fn stop_blocking(&mut self) {
        if self.exited().is_some() || self.signal_watchdog().is_err() {
            return;
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal_watchdog(&self) -> anyhow::Result<()> {
        // `kill` of the shell: std has no way to send SIGTERM without `unsafe`.
        let status = Command::new("sh")
            .args(["-c", r#"kill -s TERM "$1""#, "kill"])
            .arg(self.child.id().to_string())
            .stdin(Stdio::null())
            .status()
            .context("running `kill`")?;
        anyhow::ensure!(
            status.success(),
            "could not signal the {} watchdog",
            self.name
        );
        Ok(())
    }

    /// The last lines of the server's log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        log_tail(&self.log, 30)
    }
}

/// The last `lines` lines of `path` (at most 16 KiB), headed by the file name.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut f = std::fs::File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let tail = all[all.len().saturating_sub(lines)..].join("\n");
            format!("--- last lines of {} ---\n{tail}", path.display())
        }
        Err(e) => format!("(no log at {}: {e})", path.display()),
    }
}

/// A port that was free a moment ago on 127.0.0.1 (bind to port 0, read it, release it).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The process id on the first line of `file` (a server's pid file).
pub(crate) fn pid_in(file: &Path) -> anyhow::Result<u32> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .next()
        .unwrap_or_default()
        .trim()
        .parse()
        .with_context(|| format!("no process id in {}", file.display()))
}

/// Sends `signal` (`KILL`, `QUIT`, `STOP`) to `pids` with one `kill`.
pub(crate) fn signal(signal: &str, pids: &[u32]) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .stdin(Stdio::null())
        .status()
        .context("running `kill`")?;
    anyhow::ensure!(status.success(), "kill -{signal} {pids:?} failed");
    Ok(())
}

/// The processes whose parent is `pid` (read from `/proc/*/stat`).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid ...`: comm may hold spaces and parentheses.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// True when we run as root (some servers, PostgreSQL, refuse to).
pub(crate) fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Finds `name` in `PATH`, then in the usual system directories (`/usr/sbin` is not in a
/// normal user's `PATH`, and Debian puts `nats-server` there).
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
            .map(PathBuf::from),
        )
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// True when a server log says the port was taken between [`free_port`] and the bind.
pub(crate) fn port_was_taken(log: &Path) -> bool {
    log_tail(log, 50)
        .to_ascii_lowercase()
        .contains("address already in use")
}
