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
use std::time::Duration;

use anyhow::Context;

use super::methods::launcher;
use super::process;
use super::server::ServerSpec;

/// Environment variable with the URL of an existing broker
/// (`amqp://guest:guest@127.0.0.1:PORT/%2f`) that [`RabbitMq::shared`] uses instead of
/// starting its own. `scripts/test.sh` sets it so a whole test run shares one broker.
pub const AMQP_URL_ENV: &str = "OUTBOX_TEST_AMQP_URL";

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

launcher! {
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
    pub struct RabbitMq(Server<RabbitMqNode>), broker named by AMQP_URL_ENV;
    shared: "use unique exchange and queue names"; start: "stopped and its directory removed",
        "Takes 3–8 s: prefer [`RabbitMq::shared`] unless the test stops the broker.";
    url: "`amqp://guest:guest@127.0.0.1:PORT/%2f` (the default vhost)."; stop: "It shuts down \
        gracefully: clients get `connection.close` 320 `CONNECTION_FORCED`; durable exchanges, \
        queues and persistent messages are kept."; restart: "on all the same ports, with the same \
        data", "it is booted";
}

/// A RabbitMQ node this process starts: its scripts, directory, name and other ports.
#[derive(Debug)]
struct RabbitMqNode {
    server_script: PathBuf,
    ctl: PathBuf,
    epmd: PathBuf,
    root: PathBuf,
    node: String,
    dist_port: u16,
    epmd_port: u16,
}

impl RabbitMq {
    /// The largest message body (`max_message_size`) that brokers started by this module
    /// accept: 1 MiB. A larger one closes the publishing channel with `PRECONDITION_FAILED`.
    pub const MAX_MESSAGE_SIZE: usize = 1024 * 1024;

    /// Adds a TLS listener to a private broker (certificates of `ca`; clients must present a
    /// certificate `ca` signed), restarts it, and returns the `amqps://` URL of the default
    /// vhost once the TLS port accepts connections.
    pub async fn enable_tls(&self, ca: &crate::tls::TestCa) -> anyhow::Result<String> {
        self.tls_listener(ca, false).await
    }

    /// [`enable_tls`](Self::enable_tls), and authentication by client certificate too: the
    /// `rabbitmq_auth_mechanism_ssl` plugin enabled, `EXTERNAL` offered besides `PLAIN` and
    /// `AMQPLAIN`, the user name taken from the certificate's common name
    /// (`ssl_cert_login_from = common_name`). Create that user with
    /// [`add_certificate_user`](Self::add_certificate_user). Returns the `amqps://` URL of the
    /// default vhost with `guest`'s password (drop it and add `?auth_mechanism=external` to log
    /// in by certificate).
    pub async fn enable_tls_and_external_auth(
        &self,
        ca: &crate::tls::TestCa,
    ) -> anyhow::Result<String> {
        self.tls_listener(ca, true).await
    }

    /// Adds a user `name` without a password (it can log in only by certificate, `EXTERNAL`)
    /// with every permission on the default vhost, with `rabbitmqctl`.
    pub async fn add_certificate_user(&self, name: &str) -> anyhow::Result<()> {
        self.ctl(&["add_user", name, &uuid::Uuid::new_v4().simple().to_string()])
            .await?;
        self.ctl(&["clear_password", name]).await?;
        self.ctl(&["set_permissions", "-p", "/", name, ".*", ".*", ".*"])
            .await?;
        Ok(())
    }

    /// The broker's users, one a line, as `rabbitmqctl list_users` prints them.
    pub async fn list_users(&self) -> anyhow::Result<String> {
        self.ctl(&["list_users", "--quiet"]).await
    }

    /// Runs `rabbitmqctl ARGS` against a private broker; its standard output.
    async fn ctl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.0.private_root("run rabbitmqctl")?;
        let node = self.0.spec().context("a private broker")?;
        let output = tokio::process::Command::new(&node.ctl)
            .args(["-n", &node.node])
            .args(args)
            .envs(node.env(self.port()))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .context("running rabbitmqctl")?;
        anyhow::ensure!(
            output.status.success(),
            "`rabbitmqctl {}` failed ({}): {}{}",
            args.first().copied().unwrap_or_default(),
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    async fn tls_listener(
        &self,
        ca: &crate::tls::TestCa,
        external: bool,
    ) -> anyhow::Result<String> {
        let root = self.0.private_root("enable TLS")?.to_owned();
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut conf = std::fs::read_to_string(root.join("rabbitmq.conf"))?;
        conf.push_str(&format!(
            "listeners.ssl.1 = 127.0.0.1:{port}\n\
             ssl_options.cacertfile = {}\n\
             ssl_options.certfile = {}\n\
             ssl_options.keyfile = {}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = true\n",
            ca.ca_cert.display(),
            ca.server_cert.display(),
            ca.server_key.display()
        ));
        if external {
            conf.push_str(
                "auth_mechanisms.1 = PLAIN\n\
                 auth_mechanisms.2 = AMQPLAIN\n\
                 auth_mechanisms.3 = EXTERNAL\n\
                 ssl_cert_login_from = common_name\n",
            );
            std::fs::write(
                root.join("enabled_plugins"),
                "[rabbitmq_auth_mechanism_ssl].\n",
            )?;
        }
        std::fs::write(root.join("rabbitmq.conf"), conf)?;
        self.restart().await?;
        crate::wait::eventually(Self::READY, || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await
        .with_context(|| format!("the TLS listener on {port} never accepted"))?;
        Ok(format!("amqps://guest:guest@127.0.0.1:{port}/%2f"))
    }

    const READY: Duration = Duration::from_secs(60);
}

impl ServerSpec for RabbitMqNode {
    const NAME: &'static str = "rabbitmq-server";
    const SHARED: &'static str = "the shared RabbitMQ broker";
    const START_PRIVATE: &'static str = "RabbitMq::start()";
    const DIR_PREFIX: &'static str = "outbox-rabbitmq-";
    const URL_ENV: &'static str = AMQP_URL_ENV;
    const DEFAULT_PORT: Option<u16> = Some(5672);
    const READY_TIMEOUT: Duration = Duration::from_secs(60);

    /// Finds the scripts and writes the node's config files and (empty) plugin list.
    fn setup(root: &Path) -> anyhow::Result<Self> {
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
        std::fs::create_dir_all(root.join("home"))?;
        std::fs::write(root.join("enabled_plugins"), "[].\n")?;
        std::fs::write(
            root.join("rabbitmq.conf"),
            format!(
                "max_message_size = {}\n# No disk alarm on a nearly full CI disk.\n\
                 disk_free_limit.absolute = 1MB\n",
                RabbitMq::MAX_MESSAGE_SIZE
            ),
        )?;
        Ok(RabbitMqNode {
            server_script,
            ctl,
            epmd,
            root: root.to_owned(),
            node: String::new(),
            dist_port: 0,
            epmd_port: 0,
        })
    }

    /// The AMQP port, plus the distribution and `epmd` ports and the node name (after the
    /// AMQP port) of a node of its own.
    async fn choose_port(&mut self) -> anyhow::Result<u16> {
        let [port, dist_port, epmd_port] = distinct_free_ports()?;
        self.node = format!("outbox-{port}@localhost");
        self.dist_port = dist_port;
        self.epmd_port = epmd_port;
        Ok(port)
    }

    fn url(port: u16) -> String {
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
    }

    async fn probe(_url: &str, port: u16) -> anyhow::Result<()> {
        amqp_greeting(port).await
    }

    /// `/usr/bin/env`: it sets the node's environment, then `sh -c WRAPPER` runs the broker
    /// (process.rs launches a program with arguments; it has no environment of its own).
    fn program(&self) -> &Path {
        Path::new("/usr/bin/env")
    }

    fn args(&self, port: u16) -> Vec<OsString> {
        // A pid file left by the previous run would satisfy `rabbitmqctl wait` too early.
        let _ = std::fs::remove_file(self.pid_file());
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
        args
    }

    /// Waits with `rabbitmqctl wait PIDFILE` (the broker's own readiness check: the pid file
    /// appears, the node answers, the `rabbit` application has started), then checks the AMQP
    /// port greets.
    async fn ready(&self, _url: &str, port: u16) -> anyhow::Result<()> {
        let output = tokio::process::Command::new(&self.ctl)
            .args(["-n", &self.node, "wait"])
            .arg(self.pid_file())
            .args(["--timeout", &Self::READY_TIMEOUT.as_secs().to_string()])
            .envs(self.env(port))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .context("running `rabbitmqctl wait`")?;
        anyhow::ensure!(
            output.status.success(),
            "`rabbitmqctl wait` failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        amqp_greeting(port)
            .await
            .with_context(|| format!("booted, but port {port} does not greet"))
    }

    fn port_was_taken(log: &Path) -> bool {
        process::port_was_taken(log) || process::log_tail(log, 80).contains("eaddrinuse")
    }
}

impl RabbitMqNode {
    fn pid_file(&self) -> PathBuf {
        self.root.join("rabbitmq.pid")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_port_is_the_authority_port_or_5672() {
        let port = RabbitMqNode::external_port;
        assert_eq!(
            port("amqp://guest:guest@127.0.0.1:5673/%2f").ok(),
            Some(5673)
        );
        assert_eq!(port("amqp://guest:guest@127.0.0.1/%2f").ok(), Some(5672));
        assert_eq!(port("amqp://127.0.0.1").ok(), Some(5672));
    }
}
