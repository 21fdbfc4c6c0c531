//! The part every server launcher shares: [`ServerSpec`] describes one kind of server (how to
//! find and prepare it, its command line, its readiness probe, its environment variable and
//! its stop signal), and [`Server`] does the rest the same way for all of them.
//!
//! A [`Server`] is either an external server named by [`ServerSpec::URL_ENV`] (an address
//! only), or one this process started from the installed binaries, in a temporary directory of
//! its own, under the watchdog of [`process`](super::process). Starting picks a free port and
//! tries again on another one when a different process took it first; a started server is
//! polled until it is ready, watching that it does not exit meanwhile. A *private* server may
//! be stopped and restarted (same port, same directory) and is stopped, its directory removed,
//! when dropped; the *shared* one is never dropped and its watchdog cleans up at exit.

use std::ffi::OsString;
use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::OnceCell;

use super::process::{self, Launch, Supervised};
use crate::lock;

/// Attempts at finding a free port when another process takes ours first.
const PORT_ATTEMPTS: usize = 3;

/// How long an external server gets to answer its probe.
const EXTERNAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between two probes of an external server.
const EXTERNAL_POLL: Duration = Duration::from_millis(100);

/// How often a starting server is checked for having exited.
const EXIT_CHECK: Duration = Duration::from_millis(25);

/// Slack after [`ServerSpec::READY_TIMEOUT`] for a readiness check that enforces it itself
/// (`rabbitmqctl wait --timeout`) or takes a last bounded step after it (Kafka's metadata
/// request), before the wait is given up from outside.
const READY_GRACE: Duration = Duration::from_secs(10);

/// What is particular to one kind of server; [`Server`] does the rest.
pub(crate) trait ServerSpec: Debug + Send + Sync + Sized + 'static {
    /// The program's short name, for the watchdog's messages and the log file `NAME.log`.
    const NAME: &'static str;
    /// The server in error messages (`PostgreSQL`); by default its program's name.
    const LABEL: &'static str = Self::NAME;
    /// The shared server in the refusal to stop it (`the shared NATS server`).
    const SHARED: &'static str;
    /// The constructor of a private server, named by that refusal (`Nats::start()`).
    const START_PRIVATE: &'static str;
    /// Prefix of the temporary directory (`outbox-nats-`).
    const DIR_PREFIX: &'static str;
    /// Environment variable with the address of an external server for the shared instance.
    const URL_ENV: &'static str;
    /// Signal that asks the server to shut down quickly and cleanly.
    const STOP_SIGNAL: &'static str = "TERM";
    /// How long a started server gets to become ready.
    const READY_TIMEOUT: Duration = Duration::from_secs(30);
    /// Pause between two readiness probes of a started server.
    const POLL: Duration = Duration::from_millis(25);

    /// Finds the binaries and prepares the server's directory `root`; once per server.
    fn setup(root: &Path) -> anyhow::Result<Self>;

    /// The address clients use for a server this process started on `port`.
    fn url(port: u16) -> String;

    /// The port of an external server whose address names none (`None`: it must name one).
    const DEFAULT_PORT: Option<u16> = None;

    /// The port of an external server's address (the value of [`ServerSpec::URL_ENV`]): by
    /// default the number after the address's last `:` (up to a `/`: `redis://h:6380/0`,
    /// `amqp://user:pass@h:5673/%2f`), else [`ServerSpec::DEFAULT_PORT`].
    fn external_port(url: &str) -> anyhow::Result<u16> {
        url.rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .or(Self::DEFAULT_PORT)
            .with_context(|| format!("{}=`{url}` has no port", Self::URL_ENV))
    }

    /// One check that the server at `url` (port `port`) answers; errors say why not.
    fn probe(url: &str, port: u16) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Chooses the port (or ports) of the next start attempt; returns the one clients use.
    fn choose_port(&mut self) -> impl Future<Output = anyhow::Result<u16>> + Send {
        std::future::ready(process::free_port())
    }

    /// The server binary.
    fn program(&self) -> &Path;

    /// Its arguments for a start on `port`; called right before every start.
    fn args(&self, port: u16) -> Vec<OsString>;

    /// The user to run the server as, if not this process's.
    fn run_as(&self) -> Option<&'static str> {
        None
    }

    /// Waits until a server just started on `port` is ready: by default, [`ServerSpec::probe`]
    /// every [`ServerSpec::POLL`] for up to [`ServerSpec::READY_TIMEOUT`].
    fn ready(&self, url: &str, port: u16) -> impl Future<Output = anyhow::Result<()>> + Send {
        let probe = move || Self::probe(url, port);
        poll(Self::READY_TIMEOUT, Self::POLL, probe)
    }

    /// True when the server's log says its port was taken before it could bind it.
    fn port_was_taken(log: &Path) -> bool {
        process::port_was_taken(log)
    }
}

/// A server of kind `S`: an external one, or one this process started.
#[derive(Debug)]
pub(crate) struct Server<S> {
    url: String,
    port: u16,
    local: Option<Local<S>>,
}

/// A server this process started.
#[derive(Debug)]
struct Local<S> {
    /// Owned by one test: may be stopped and restarted, removed on drop.
    private: bool,
    /// The temporary directory with the server's data and its log.
    root: PathBuf,
    /// Removes `root` on drop (private servers); the shared server's watchdog removes it.
    _dir: Option<tempfile::TempDir>,
    spec: S,
    server: Mutex<Option<Supervised>>,
}

impl<S: ServerSpec> Server<S> {
    /// The shared server, kept in `cell` as `wrap` makes it: the external one named by
    /// [`ServerSpec::URL_ENV`] when that is set, otherwise one started on first use.
    pub(crate) async fn shared<T: Send + Sync>(
        cell: &'static OnceCell<T>,
        wrap: fn(Self) -> T,
    ) -> anyhow::Result<&'static T> {
        cell.get_or_try_init(|| async {
            let server = match std::env::var(S::URL_ENV) {
                Ok(url) if !url.trim().is_empty() => Self::external(url.trim().to_owned()).await?,
                _ => Self::launch(false, S::setup).await?,
            };
            Ok(wrap(server))
        })
        .await
    }

    /// A private server (see [`Server::launch`]).
    pub(crate) async fn start() -> anyhow::Result<Self> {
        Self::launch(true, S::setup).await
    }

    /// Starts a server in a new temporary directory prepared by `setup`, on a free port, and
    /// waits until it is ready.
    pub(crate) async fn launch(
        private: bool,
        setup: impl FnOnce(&Path) -> anyhow::Result<S>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(S::DIR_PREFIX)
            .tempdir()
            .with_context(|| format!("creating a temporary directory for {}", S::LABEL))?;
        let mut local = Local {
            private,
            root: dir.path().to_owned(),
            _dir: None,
            spec: setup(dir.path())?,
            server: Mutex::new(None),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = local.spec.choose_port().await?;
            let url = S::url(port);
            match local.start(&url, port).await {
                Ok(()) => {
                    if private {
                        local._dir = Some(dir);
                    } else {
                        // The shared server is never dropped: its watchdog removes the
                        // directory when the process exits. (On failure `dir` removes it.)
                        let _ = dir.keep();
                    }
                    return Ok(Server {
                        url,
                        port,
                        local: Some(local),
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && S::port_was_taken(&local.log()) => {
                    tracing::debug!(port, error = %e, "port taken; retrying {} on another", S::LABEL);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The address clients use.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The port clients use on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// What `setup` made of a server this process started (`None` for an external one): the
    /// Kafka front, RabbitMQ's node for `rabbitmqctl`.
    pub(crate) fn spec(&self) -> Option<&S> {
        self.local.as_ref().map(|l| &l.spec)
    }

    /// The log file of a server this process started (`None` for an external one).
    pub(crate) fn log_path(&self) -> Option<PathBuf> {
        self.local.as_ref().map(Local::log)
    }

    /// Stops a private server with its stop signal and waits until it has; the directory is
    /// kept. Refused for the shared server and for an external one.
    pub(crate) async fn stop(&self) -> anyhow::Result<()> {
        let local = self.private_local("stop")?;
        let server = lock(&local.server).take();
        match server {
            Some(server) => server.stop().await,
            None => Ok(()),
        }
    }

    /// Starts a private server again on the same port in the same directory, stopping it first
    /// if it is running, and waits until it is ready.
    pub(crate) async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await?;
        self.private_local("restart")?
            .start(&self.url, self.port)
            .await
    }

    /// The data directory root of a private server (refused for the shared and external ones).
    pub(crate) fn private_root(&self, what: &str) -> anyhow::Result<&Path> {
        Ok(&self.private_local(what)?.root)
    }

    /// True while a server this process started is running (always true for an external one).
    pub(crate) fn is_running(&self) -> bool {
        match &self.local {
            Some(local) => lock(&local.server)
                .as_mut()
                .is_some_and(|s| s.exited().is_none()),
            None => true,
        }
    }

    /// Waits until a server this process started has exited (after a signal sent by the
    /// launcher: `after` names it for the error).
    pub(crate) async fn wait_exited(&self, after: &str) -> anyhow::Result<()> {
        crate::wait::eventually(Duration::from_secs(30), || async { !self.is_running() })
            .await
            .with_context(|| format!("{} did not exit after {after}", S::LABEL))
    }

    fn private_local(&self, what: &str) -> anyhow::Result<&Local<S>> {
        match &self.local {
            Some(local) if local.private => Ok(local),
            _ => anyhow::bail!(
                "cannot {what} {} (other tests use it); use {}",
                S::SHARED,
                S::START_PRIVATE
            ),
        }
    }

    /// An external server, once it answers its probe.
    async fn external(url: String) -> anyhow::Result<Self> {
        let port = S::external_port(&url)?;
        poll(EXTERNAL_TIMEOUT, EXTERNAL_POLL, || S::probe(&url, port))
            .await
            .with_context(|| {
                format!(
                    "{}={url}: server not reachable (unset it to let the tests start their own)",
                    S::URL_ENV
                )
            })?;
        Ok(Server {
            url,
            port,
            local: None,
        })
    }
}

impl<S: ServerSpec> Local<S> {
    fn log(&self) -> PathBuf {
        self.root.join(format!("{}.log", S::NAME))
    }

    /// Starts the server on `port` under its watchdog and waits until it is ready.
    async fn start(&self, url: &str, port: u16) -> anyhow::Result<()> {
        let mut server = Supervised::spawn(Launch {
            name: S::NAME,
            program: self.spec.program(),
            args: self.spec.args(port),
            run_as: self.spec.run_as(),
            stop_signal: S::STOP_SIGNAL,
            cleanup: Some(&self.root),
            log: &self.log(),
            cwd: &self.root,
        })?;
        let ready =
            tokio::time::timeout(S::READY_TIMEOUT + READY_GRACE, self.spec.ready(url, port));
        tokio::pin!(ready);
        let outcome = loop {
            tokio::select! {
                outcome = &mut ready => break outcome.unwrap_or_else(|_| {
                    Err(anyhow::anyhow!("no answer within {:?}", S::READY_TIMEOUT))
                }),
                () = tokio::time::sleep(EXIT_CHECK) => if server.exited().is_some() {
                    break Err(anyhow::anyhow!("exited"));
                }
            }
        };
        if let Err(e) = outcome {
            let tail = server.log_tail();
            if let Some(status) = server.exited() {
                anyhow::bail!(
                    "{} exited ({status}) before accepting connections on {url}\n{tail}",
                    S::LABEL
                );
            }
            server.stop().await.ok();
            anyhow::bail!("{} not ready on {url}: {e:#}\n{tail}", S::LABEL);
        }
        *lock(&self.server) = Some(server);
        Ok(())
    }
}

impl<S> Drop for Local<S> {
    fn drop(&mut self) {
        if let Some(mut server) = lock(&self.server).take() {
            server.stop_blocking();
        }
    }
}

/// Calls `probe` every `interval` until it succeeds; after `timeout`, fails with its last error.
pub(crate) async fn poll<F, Fut>(
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match probe().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("no answer within {timeout:?}")));
            }
            Err(_) => tokio::time::sleep(interval).await,
        }
    }
}
