//! [`Moto`]: moto's server on 127.0.0.1, the local stand-in for the AWS APIs (SQS, SNS,
//! Kinesis, DynamoDB and DynamoDB Streams all on one port).
//!
//! `moto_server` comes from PyPI (`moto[server]`); `scripts/services.sh` installs it on a fresh
//! machine. It keeps everything in memory: a restart starts empty, so a test that simulates an
//! outage must create its queues, topics and streams again after [`Moto::restart`], as an
//! operator would recreate them.
//!
//! Clients need some credentials and a region even though moto checks none:
//! [`Moto::AWS_ENV`] lists what to set (the tests set them for the process).
//!
//! What moto does not emulate (moto 5.2): throttling, partial batch failures, SQS FIFO
//! deduplication beyond the messages still in the queue, SNS FIFO deduplication at all, body
//! and attribute validation. The sinks check AWS's rules themselves and the partial-failure
//! paths are tested with a fault-injecting wrapper.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::methods::launcher;
use super::process;
use super::server::ServerSpec;

/// Environment variable with the URL of an existing moto server (`http://127.0.0.1:PORT`)
/// that [`Moto::shared`] uses instead of starting its own.
pub const MOTO_URL_ENV: &str = "OUTBOX_TEST_MOTO_URL";

/// Environment variable naming the `moto_server` program (else it is looked up in `PATH`).
pub const MOTO_BIN_ENV: &str = "OUTBOX_TEST_MOTO_SERVER";

launcher! {
    /// A moto server: one started by this process from `moto_server`, or an existing one named by
    /// [`MOTO_URL_ENV`].
    ///
    /// ```no_run
    /// # async fn example() -> anyhow::Result<()> {
    /// use outbox_testkit::services::Moto;
    ///
    /// Moto::set_aws_env();                 // dummy credentials and region for the SDK
    /// let moto = Moto::start().await?;     // private: this test may stop it
    /// println!("{}", moto.url());          // http://127.0.0.1:PORT, the endpoint_url
    /// # Ok(()) }
    /// ```
    pub struct Moto(Server<MotoServer>), server named by MOTO_URL_ENV;
    shared: "use unique queue, topic and stream names"; start: "stopped";
    url: "`http://127.0.0.1:PORT`: the `endpoint_url` for every AWS client."; stop: "Clients see \
        connections refused; everything it held is lost."; restart: "empty: create queues, topics \
        and streams again", "it answers";
}

/// A `moto_server` this process starts: through `moto_atomic.py` (DynamoDB transactions made
/// all-or-nothing, as on AWS) when `python3` can import moto, else the program as installed.
#[derive(Debug)]
struct MotoServer {
    bin: PathBuf,
    /// Arguments before moto_server's own (the launcher script).
    prefix: Vec<OsString>,
}

/// The launcher that makes moto's `TransactWriteItems` all-or-nothing (see the file).
const ATOMIC_LAUNCHER: &str = include_str!("moto_atomic.py");

impl Moto {
    /// The region the tests use.
    pub const REGION: &'static str = "us-east-1";
    /// The account moto uses in ARNs and queue URLs.
    pub const ACCOUNT: &'static str = "123456789012";
    /// What the AWS SDK needs in the environment to talk to moto: dummy credentials (moto
    /// checks none) and the region.
    pub const AWS_ENV: [(&'static str, &'static str); 5] = [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", Self::REGION),
        // boto3 reads only this one.
        ("AWS_DEFAULT_REGION", Self::REGION),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];

    /// Sets [`Moto::AWS_ENV`] for this process, once. Call it before building any client.
    pub fn set_aws_env() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            for (name, value) in Self::AWS_ENV {
                if std::env::var_os(name).is_none() {
                    set_env(name, value);
                }
            }
        });
    }
}

#[allow(unsafe_code)]
fn set_env(name: &str, value: &str) {
    // SAFETY: called once, from `Moto::set_aws_env`, which tests call first thing; the
    // SDK reads these variables only when a client is built afterwards.
    unsafe { std::env::set_var(name, value) }
}

impl ServerSpec for MotoServer {
    const NAME: &'static str = "moto_server";
    const LABEL: &'static str = "moto";
    const SHARED: &'static str = "the shared moto server";
    const START_PRIVATE: &'static str = "Moto::start()";
    const DIR_PREFIX: &'static str = "outbox-moto-";
    const URL_ENV: &'static str = MOTO_URL_ENV;
    const POLL: Duration = Duration::from_millis(50);

    fn setup(root: &Path) -> anyhow::Result<Self> {
        if std::env::var_os(MOTO_BIN_ENV).is_none_or(|p| p.is_empty())
            && let Some(python) = process::find_program("python3")
            && std::process::Command::new(&python)
                .args(["-c", "import moto.server, moto.dynamodb.models"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        {
            let launcher = root.join("moto_atomic.py");
            std::fs::write(&launcher, ATOMIC_LAUNCHER)?;
            return Ok(MotoServer {
                bin: python,
                prefix: vec![launcher.into_os_string()],
            });
        }
        let bin = match std::env::var_os(MOTO_BIN_ENV) {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => process::find_program("moto_server").context(
                "`moto_server` not found in PATH: install it (`pip install 'moto[server]'`, or \
                 run scripts/test.sh), set OUTBOX_TEST_MOTO_SERVER to the program, or set \
                 OUTBOX_TEST_MOTO_URL to a running server",
            )?,
        };
        Ok(MotoServer {
            bin,
            prefix: Vec::new(),
        })
    }

    fn url(port: u16) -> String {
        format!("http://127.0.0.1:{port}")
    }

    /// Asks moto's own API for its state over a raw HTTP request; any HTTP answer means the
    /// server is serving.
    async fn probe(_url: &str, port: u16) -> anyhow::Result<()> {
        let probe = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            stream
                .write_all(
                    b"GET /moto-api/data.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                      Connection: close\r\n\r\n",
                )
                .await?;
            let mut answer = [0u8; 16];
            let n = stream.read(&mut answer).await?;
            anyhow::ensure!(
                answer[..n].starts_with(b"HTTP/1."),
                "moto answered {:?}",
                String::from_utf8_lossy(&answer[..n])
            );
            Ok(())
        };
        tokio::time::timeout(Duration::from_secs(5), probe)
            .await
            .context("moto did not answer in time")?
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn args(&self, port: u16) -> Vec<OsString> {
        let mut args = self.prefix.clone();
        args.extend(["-H", "127.0.0.1", "-p", &port.to_string()].map(OsString::from));
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_port_must_be_named() {
        assert_eq!(
            MotoServer::external_port("http://127.0.0.1:5000/").ok(),
            Some(5000)
        );
        let err = MotoServer::external_port("http://127.0.0.1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "OUTBOX_TEST_MOTO_URL=`http://127.0.0.1` has no port"
        );
    }
}
