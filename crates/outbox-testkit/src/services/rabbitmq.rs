//! [`RabbitMq`]: a RabbitMQ broker for tests on 127.0.0.1.
//!
//! RabbitMQ takes 3–8 s to boot, so tests share one broker per test run (`scripts/test.sh`
//! starts it and names it in [`AMQP_URL_ENV`]) and keep apart by unique exchange and queue
//! names. A test that simulates a broker outage starts its own with [`RabbitMq::start`].
//!
//! A broker this process starts is a node of its own: its own node name, AMQP port,
//! distribution port, `epmd` port, Mnesia and log directories, `HOME` (hence Erlang cookie),
//! config file and (empty) plugin list, all under one temporary directory, so it never meets
//! the system's RabbitMQ or another test's. It is launched from
//! `/usr/lib/rabbitmq/bin/rabbitmq-server` (the Debian `/usr/sbin` wrapper switches to the
//! `rabbitmq` user and its fixed directories), readiness is `rabbitmqctl wait PIDFILE`, and a
//! stop is a `SIGTERM` to the start script (which runs the same graceful shutdown as
//! `rabbitmqctl stop`) followed by `epmd -port P -kill`: the `epmd` daemon the node starts
//! would otherwise outlive it.
//!
//! The broker refuses messages over 1 MiB ([`RabbitMq::MAX_MESSAGE_SIZE`], RabbitMQ's
//! `max_message_size`), so size-limit tests stay small.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::OnceCell;

use super::process::{self, Launch, Supervised};
use crate::lock;

/// Environment variable with the URL of an existing broker
/// (`amqp://guest:guest@127.0.0.1:PORT/%2f`) that [`RabbitMq::shared`] uses instead of
/// starting its own. `scripts/test.sh` sets it so a whole test run shares one broker.
pub const AMQP_URL_ENV: &str = "OUTBOX_TEST_AMQP_URL";

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const PORT_ATTEMPTS: usize = 3;
/// Where Debian installs the broker's own scripts.
const RABBITMQ_BIN_DIR: &str = "/usr/lib/rabbitmq/bin";

/// Runs the broker's start script with the node's environment, forwards a `SIGTERM` to it,
/// and kills the node's `epmd` once the broker has exited. `$1` start script, `$2` epmd.
const WRAPPER: &str = r#"
"$1" &
pid=$!
trap 'kill -s TERM "$pid" 2>/dev/null' TERM
wait "$pid"; status=$?
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; status=$?; done
"$2" -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1
exit "$status"
"#;

static SHARED: OnceCell<RabbitMq> = OnceCell::const_new();

/// A RabbitMQ broker: either one started by this process, or an existing one named by
/// [`AMQP_URL_ENV`].
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use outbox_testkit::services::RabbitMq;
///
/// let shared = RabbitMq::shared().await?;   // most tests: unique exchange names
/// let private = RabbitMq::start().await?;   // outage tests: 3–8 s to boot
/// private.stop().await?;
/// private.restart().await?;                 // same port, same durable exchanges and queues
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RabbitMq {
    url: String,
    port: u16,
    local: Option<Local>,
}

#[derive(Debug)]
struct Local {
    private: bool,
    server_script: PathBuf,
    ctl: PathBuf,
    epmd: PathBuf,
    root: PathBuf,
    node: String,
    dist_port: u16,
    epmd_port: u16,
    _dir: Option<tempfile::TempDir>,
    server: Mutex<Option<Supervised>>,
}

impl RabbitMq {
    /// The largest message body (`max_message_size`) that brokers started by this module
    /// accept: 1 MiB. A larger one closes the publishing channel with `PRECONDITION_FAILED`.
    pub const MAX_MESSAGE_SIZE: usize = 1024 * 1024;

    /// The broker shared by every test of this process: the one named by [`AMQP_URL_ENV`]
    /// when it is set, otherwise one started on first use that stops when the process exits.
    /// Never stop it; use unique exchange and queue names.
    pub async fn shared() -> anyhow::Result<&'static RabbitMq> {
        SHARED
            .get_or_try_init(|| async {
                match std::env::var(AMQP_URL_ENV) {
                    Ok(url) if !url.trim().is_empty() => {
                        Self::external(url.trim().to_owned()).await
                    }
                    _ => Self::launch(false).await,
                }
            })
            .await
    }

    /// A private broker owned by the returned value (stopped and its directory removed on
    /// drop). Takes 3–8 s: prefer [`RabbitMq::shared`] unless the test stops the broker.
    pub async fn start() -> anyhow::Result<RabbitMq> {
        Self::launch(true).await
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f` (the default vhost).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The AMQP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops a private broker gracefully (clients get `connection.close` 320
    /// `CONNECTION_FORCED`; durable exchanges, queues and persistent messages are kept).
    /// Refused for the shared broker.
    pub async fn stop(&self) -> anyhow::Result<()> {
        let local = self.private_local("stop")?;
        let server = lock(&local.server).take();
        match server {
            Some(server) => server.stop().await,
            None => Ok(()),
        }
    }

    /// Starts a private broker again on the same ports with the same data, stopping it first
    /// if it is running, and waits until it is booted.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await?;
        let local = self.private_local("restart")?;
        let server = local.spawn(self.port)?;
        let server = local.wait_ready(self.port, server).await?;
        *lock(&local.server) = Some(server);
        Ok(())
    }

    /// True while a broker this process started is running (always true for an external one).
    pub fn is_running(&self) -> bool {
        match &self.local {
            Some(local) => lock(&local.server)
                .as_mut()
                .is_some_and(|s| s.exited().is_none()),
            None => true,
        }
    }

    fn private_local(&self, what: &str) -> anyhow::Result<&Local> {
        match &self.local {
            Some(local) if local.private => Ok(local),
            _ => anyhow::bail!(
                "cannot {what} the shared RabbitMQ broker (other tests use it); use \
                 RabbitMq::start()"
            ),
        }
    }

    async fn external(url: String) -> anyhow::Result<RabbitMq> {
        let port = url
            .split('@')
            .next_back()
            .and_then(|host| host.split('/').next())
            .and_then(|host| host.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or(5672);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match amqp_greeting(port).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!(
                        "{AMQP_URL_ENV}: broker not reachable on 127.0.0.1:{port} (unset it to \
                         let the tests start their own)"
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(RabbitMq {
            url,
            port,
            local: None,
        })
    }

    async fn launch(private: bool) -> anyhow::Result<RabbitMq> {
        let bin_dir = Path::new(RABBITMQ_BIN_DIR);
        let server_script = bin_dir.join("rabbitmq-server");
        let ctl = bin_dir.join("rabbitmqctl");
        anyhow::ensure!(
            server_script.is_file() && ctl.is_file(),
            "`{}` not found: install RabbitMQ (`apt-get install -y rabbitmq-server`, or run \
             scripts/test.sh), or set {AMQP_URL_ENV} to an existing broker",
            server_script.display()
        );
        let epmd = process::find_program("epmd")
            .context("`epmd` (Erlang) not found: reinstall rabbitmq-server")?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-rabbitmq-")
            .tempdir()
            .context("creating a temporary directory for rabbitmq-server")?;
        let root = dir.path().to_owned();
        std::fs::create_dir_all(root.join("home"))?;
        std::fs::write(root.join("enabled_plugins"), "[].\n")?;
        std::fs::write(
            root.join("rabbitmq.conf"),
            format!(
                "max_message_size = {}\n# No disk alarm on a nearly full CI disk.\n\
                 disk_free_limit.absolute = 1MB\n",
                Self::MAX_MESSAGE_SIZE
            ),
        )?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let [port, dist_port, epmd_port] = distinct_free_ports()?;
            let mut local = Local {
                private,
                server_script: server_script.clone(),
                ctl: ctl.clone(),
                epmd: epmd.clone(),
                root: root.clone(),
                node: format!("outbox-{port}@localhost"),
                dist_port,
                epmd_port,
                _dir: None,
                server: Mutex::new(None),
            };
            let server = local.spawn(port)?;
            match local.wait_ready(port, server).await {
                Ok(server) => {
                    *lock(&local.server) = Some(server);
                    if private {
                        local._dir = Some(dir);
                    } else {
                        // The shared broker is never dropped: its watchdog removes the
                        // directory when the process exits. (On failure `dir` removes it.)
                        let _ = dir.keep();
                    }
                    return Ok(RabbitMq {
                        url: format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
                        port,
                        local: Some(local),
                    });
                }
                Err(e) if attempt < PORT_ATTEMPTS && local.port_was_taken() => {
                    tracing::debug!(port, error = %e, "port taken; retrying rabbitmq-server on another");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Local {
    fn log(&self) -> PathBuf {
        self.root.join("rabbitmq-server.log")
    }

    fn pid_file(&self) -> PathBuf {
        self.root.join("rabbitmq.pid")
    }

    fn port_was_taken(&self) -> bool {
        process::port_was_taken(&self.log())
            || process::log_tail(&self.log(), 80).contains("eaddrinuse")
    }

    /// The node's environment: everything RabbitMQ and its CLI read to find their node.
    fn env(&self, port: u16) -> Vec<(&'static str, OsString)> {
        let root = |name: &str| self.root.join(name).into_os_string();
        vec![
            ("RABBITMQ_NODENAME", self.node.clone().into()),
            ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".into()),
            ("RABBITMQ_NODE_PORT", port.to_string().into()),
            ("RABBITMQ_DIST_PORT", self.dist_port.to_string().into()),
            ("ERL_EPMD_PORT", self.epmd_port.to_string().into()),
            ("RABBITMQ_MNESIA_BASE", root("mnesia")),
            ("RABBITMQ_LOG_BASE", root("log")),
            ("RABBITMQ_PID_FILE", self.pid_file().into_os_string()),
            ("RABBITMQ_ENABLED_PLUGINS_FILE", root("enabled_plugins")),
            ("RABBITMQ_CONFIG_FILE", root("rabbitmq")),
            ("RABBITMQ_ADVANCED_CONFIG_FILE", root("advanced.config")),
            ("RABBITMQ_CONF_ENV_FILE", root("rabbitmq-env.conf")),
            ("HOME", root("home")),
        ]
    }

    fn spawn(&self, port: u16) -> anyhow::Result<Supervised> {
        let _ = std::fs::remove_file(self.pid_file());
        // `env` sets the node's environment, then `sh -c WRAPPER` runs the broker (process.rs
        // launches a program with arguments; it has no environment of its own).
        let mut args: Vec<OsString> = self
            .env(port)
            .into_iter()
            .map(|(name, value)| {
                let mut pair = OsString::from(format!("{name}="));
                pair.push(value);
                pair
            })
            .collect();
        args.extend([
            "sh".into(),
            "-c".into(),
            WRAPPER.into(),
            "rabbitmq-wrapper".into(),
            self.server_script.clone().into_os_string(),
            self.epmd.clone().into_os_string(),
        ]);
        Supervised::spawn(Launch {
            name: "rabbitmq-server",
            program: Path::new("/usr/bin/env"),
            args,
            run_as: None,
            stop_signal: "TERM",
            cleanup: Some(&self.root),
            log: &self.log(),
            cwd: &self.root,
        })
    }

    /// Waits with `rabbitmqctl wait PIDFILE` (the broker's own readiness check: the pid file
    /// appears, the node answers, the `rabbit` application has started), watching that the
    /// broker does not exit meanwhile, then checks the AMQP port greets.
    async fn wait_ready(&self, port: u16, mut server: Supervised) -> anyhow::Result<Supervised> {
        let mut ctl = tokio::process::Command::new(&self.ctl);
        ctl.args(["-n", &self.node, "wait"])
            .arg(self.pid_file())
            .args(["--timeout", &READY_TIMEOUT.as_secs().to_string()])
            .envs(self.env(port))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let waiting = ctl.output();
        tokio::pin!(waiting);
        let deadline = Instant::now() + READY_TIMEOUT + Duration::from_secs(5);
        let output = loop {
            tokio::select! {
                output = &mut waiting => break output.context("running `rabbitmqctl wait`")?,
                () = tokio::time::sleep(Duration::from_millis(100)) => {
                    if let Some(status) = server.exited() {
                        anyhow::bail!(
                            "rabbitmq-server exited ({status}) while booting on port {port}\n{}",
                            server.log_tail()
                        );
                    }
                    if Instant::now() >= deadline {
                        let tail = server.log_tail();
                        server.stop().await.ok();
                        anyhow::bail!("rabbitmq-server did not boot within {READY_TIMEOUT:?}\n{tail}");
                    }
                }
            }
        };
        if !output.status.success() {
            let tail = server.log_tail();
            server.stop().await.ok();
            anyhow::bail!(
                "`rabbitmqctl wait` failed ({}): {}{}\n{tail}",
                output.status,
                String::from_utf8_lossy(&output.stdout).trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        if let Err(e) = amqp_greeting(port).await {
            let tail = server.log_tail();
            server.stop().await.ok();
            return Err(e.context(format!(
                "rabbitmq-server booted but port {port} does not greet\n{tail}"
            )));
        }
        Ok(server)
    }
}

impl Drop for RabbitMq {
    fn drop(&mut self) {
        if let Some(local) = &self.local
            && let Some(mut server) = lock(&local.server).take()
        {
            server.stop_blocking();
        }
    }
}

/// Three ports that were free a moment ago, all different (held at once while choosing).
fn distinct_free_ports() -> anyhow::Result<[u16; 3]> {
    let bind = || std::net::TcpListener::bind(("127.0.0.1", 0)).context("binding 127.0.0.1:0");
    let listeners = [bind()?, bind()?, bind()?];
    let mut ports = [0; 3];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// Opens a TCP connection, sends the AMQP 0-9-1 protocol header and expects a method frame
/// (`connection.start`) back: the broker accepts AMQP clients.
async fn amqp_greeting(port: u16) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(b"AMQP\x00\x00\x09\x01").await?;
        let mut frame_type = [0u8; 1];
        stream.read_exact(&mut frame_type).await?;
        anyhow::ensure!(
            frame_type[0] == 1,
            "port {port} answered the AMQP header with frame type {}",
            frame_type[0]
        );
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(5), probe)
        .await
        .context("the AMQP port did not greet in time")?
}
