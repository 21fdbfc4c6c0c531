//! [`Redis`]: a Redis server for tests on 127.0.0.1.
//!
//! Tests share one server and keep apart by using unique stream names; a test that simulates a
//! broker outage starts its own with [`Redis::start`] and stops and restarts it. The server
//! keeps an append-only file in its directory, so streams survive a restart like they would on
//! a production Redis with persistence on.
//!
//! Servers this process starts accept at most 1 MiB per argument (`proto-max-bulk-len 1mb`,
//! the smallest value Redis allows) so that size-limit tests need only a 1 MiB payload; see
//! [`Redis::MAX_BULK_LEN`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::methods::launcher;
use super::process;
use super::server::ServerSpec;

/// Environment variable with the URL of an existing Redis server (`redis://127.0.0.1:PORT`)
/// that [`Redis::shared`] uses instead of starting its own. `scripts/test.sh` sets it so a
/// whole test run shares one server.
pub const REDIS_URL_ENV: &str = "OUTBOX_TEST_REDIS_URL";

launcher! {
    /// A Redis server: either one started by this process from the installed `redis-server`, or
    /// an existing one named by [`REDIS_URL_ENV`].
    ///
    /// ```no_run
    /// # async fn example() -> anyhow::Result<()> {
    /// use outbox_testkit::services::Redis;
    ///
    /// let redis = Redis::start().await?;   // private: this test may stop it
    /// println!("{}", redis.url());          // redis://127.0.0.1:PORT
    /// redis.stop().await?;                  // broker outage
    /// redis.restart().await?;               // same port, same data
    /// # Ok(()) }
    /// ```
    pub struct Redis(Server<RedisServer>), server named by REDIS_URL_ENV;
    shared: "use unique stream names"; start: "stopped and its directory removed";
    url: "`redis://127.0.0.1:PORT`."; stop: "Clients see the connection drop; the data is kept.";
    restart: "with the same data", "it answers `PING`";
}

/// A `redis-server` this process starts.
#[derive(Debug)]
struct RedisServer {
    bin: PathBuf,
    /// Where the append-only file lives (the server's directory).
    dir: PathBuf,
}

impl Redis {
    /// The largest argument (`proto-max-bulk-len`) that servers started by this module accept:
    /// 1 MiB. An external server ([`REDIS_URL_ENV`]) has its own limit (Redis' default is
    /// 512 MiB); ask it with `CONFIG GET proto-max-bulk-len`.
    pub const MAX_BULK_LEN: usize = 1024 * 1024;
}

impl ServerSpec for RedisServer {
    const NAME: &'static str = "redis-server";
    const SHARED: &'static str = "the shared Redis server";
    const START_PRIVATE: &'static str = "Redis::start()";
    const DIR_PREFIX: &'static str = "outbox-redis-";
    const URL_ENV: &'static str = REDIS_URL_ENV;
    const DEFAULT_PORT: Option<u16> = Some(6379);
    const POLL: Duration = Duration::from_millis(10);

    fn setup(root: &Path) -> anyhow::Result<Self> {
        let bin = process::find_program("redis-server").context(
            "`redis-server` not found in PATH: install it (`apt-get install -y redis-server`, \
             or run scripts/test.sh), or set OUTBOX_TEST_REDIS_URL to an existing server",
        )?;
        Ok(RedisServer {
            bin,
            dir: root.to_owned(),
        })
    }

    fn url(port: u16) -> String {
        format!("redis://127.0.0.1:{port}")
    }

    /// Sends `PING` over a raw connection to 127.0.0.1 and expects `+PONG` (a server still
    /// loading its data answers `-LOADING`, which is not ready).
    async fn probe(_url: &str, port: u16) -> anyhow::Result<()> {
        let probe = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            stream.write_all(b"PING\r\n").await?;
            let mut answer = [0u8; 64];
            let n = stream.read(&mut answer).await?;
            anyhow::ensure!(
                answer[..n].starts_with(b"+PONG"),
                "Redis answered {:?}",
                String::from_utf8_lossy(&answer[..n]).trim_end()
            );
            Ok(())
        };
        tokio::time::timeout(Duration::from_secs(2), probe)
            .await
            .context("Redis did not answer PING in time")?
    }

    fn program(&self) -> &Path {
        &self.bin
    }

    fn args(&self, port: u16) -> Vec<OsString> {
        [
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--daemonize",
            "no",
            "--save",
            "",
            // An append-only file (flushed on the graceful shutdown a stop is) keeps streams
            // across a restart, as a production Redis with persistence would.
            "--appendonly",
            "yes",
            "--appendfsync",
            "no",
            "--dir",
            &self.dir.to_string_lossy(),
            "--proto-max-bulk-len",
            "1mb",
        ]
        .map(Into::into)
        .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_port_is_the_url_port_or_6379() {
        let port = RedisServer::external_port;
        assert_eq!(port("redis://127.0.0.1:6380/0").ok(), Some(6380));
        assert_eq!(port("redis://:secret@127.0.0.1:6381").ok(), Some(6381));
        assert_eq!(port("redis://127.0.0.1").ok(), Some(6379));
    }
}
