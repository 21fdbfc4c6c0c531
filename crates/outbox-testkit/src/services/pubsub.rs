//! [`PubSubEmulator`]: Google's Cloud Pub/Sub emulator for tests on 127.0.0.1, with a small
//! client of its REST API (create topics and subscriptions, pull and acknowledge).
//!
//! The emulator is the Cloud SDK's `cloud-pubsub-emulator` (a Java program; it needs Java 11
//! or later). It is found through [`PUBSUB_EMULATOR_ENV`], else in the usual Cloud SDK
//! locations, else under `gcloud info`'s SDK root; [`find_emulator`] says which, or why
//! none. Tests that need it and find none should say so and skip (the emulator is not a
//! Debian package).
//!
//! The emulator keeps everything in memory: a [`PubSubEmulator::restart`] comes back empty,
//! without topics, subscriptions or messages. Project ids must have at least 6 characters
//! (`proj-outbox`), topic and subscription ids at least 3.
//!
//! The emulator runs in a process group of its own (through `setsid`), and a stop signals the
//! whole group, so nothing the JVM started outlives it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::methods::launcher;
use super::process;
use super::server::ServerSpec;

/// Environment variable with the path of the `cloud-pubsub-emulator` launcher script (e.g.
/// `/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator`), when it
/// is not in one of the usual Cloud SDK locations.
pub const PUBSUB_EMULATOR_ENV: &str = "OUTBOX_TEST_PUBSUB_EMULATOR";

/// Environment variable with the address (`host:port`) of a running emulator that
/// [`PubSubEmulator::shared`] uses instead of starting its own.
pub const PUBSUB_HOST_ENV: &str = "OUTBOX_TEST_PUBSUB_HOST";

/// Where the emulator's launcher script lives inside a Cloud SDK.
const IN_SDK: &str = "platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// Cloud SDK roots of the usual installs: Debian/Ubuntu packages, the tarball in `/opt` or
/// the home directory, the snap.
const SDK_ROOTS: &[&str] = &[
    "/usr/lib/google-cloud-sdk",
    "/usr/share/google-cloud-sdk",
    "/opt/google-cloud-sdk",
    "/usr/local/google-cloud-sdk",
    "/snap/google-cloud-sdk/current",
];

/// Runs the emulator (`"$@"`, prefixed by `setsid` when it exists) as the leader of its own
/// process group and, on `TERM`, stops that whole group: the JVM first with `TERM` (a clean
/// shutdown), then anything left with `KILL`.
const GROUP_WRAPPER: &str = r#"
"$@" &
pid=$!
stop() {
  kill -s TERM -- "-$pid" 2>/dev/null || kill -s TERM "$pid" 2>/dev/null
  wait "$pid"
  kill -s KILL -- "-$pid" 2>/dev/null
  exit 0
}
trap stop TERM INT
wait "$pid"
status=$?
kill -s KILL -- "-$pid" 2>/dev/null
exit $status
"#;

launcher! {
    /// A Pub/Sub emulator: either one started by this process, or an existing one named by
    /// [`PUBSUB_HOST_ENV`].
    ///
    /// ```no_run
    /// # async fn example() -> anyhow::Result<()> {
    /// use outbox_testkit::services::PubSubEmulator;
    ///
    /// let emulator = PubSubEmulator::start().await?; // private: this test may stop it
    /// emulator.create_topic("proj-outbox", "orders").await?;
    /// emulator.create_subscription("proj-outbox", "orders-sub", "orders", true).await?;
    /// println!("{}", emulator.host());                // 127.0.0.1:PORT, for PUBSUB_EMULATOR_HOST
    /// let messages = emulator.pull("proj-outbox", "orders-sub", 100).await?;
    /// emulator.restart().await?;                      // same port, but empty
    /// # Ok(()) }
    /// ```
    pub struct PubSubEmulator(Server<EmulatorServer>), emulator named by PUBSUB_HOST_ENV;
    shared: "use unique topic names"; start: "stopped";
    host: "`127.0.0.1:PORT`: the value for `PUBSUB_EMULATOR_HOST` or the sink's `endpoint`.";
    stop: "Clients get connection refused; everything in it is lost."; restart: "empty",
        "it answers its REST API";
}

/// A `cloud-pubsub-emulator` this process starts.
#[derive(Debug)]
struct EmulatorServer {
    script: PathBuf,
    /// `setsid`, to give the emulator a process group of its own.
    setsid: Option<PathBuf>,
}

/// One message as a subscriber pulled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledMessage {
    /// The id Pub/Sub gave the message when it was published.
    pub message_id: String,
    /// The data bytes exactly.
    pub data: Bytes,
    /// The attributes.
    pub attributes: BTreeMap<String, String>,
    /// The ordering key, if the message has one.
    pub ordering_key: Option<String>,
}

/// The emulator's launcher script: [`PUBSUB_EMULATOR_ENV`], else the usual Cloud SDK
/// locations, else the SDK root `gcloud info` reports; and a Java to run it. The error says
/// what is missing and what was tried (tests print it when they skip).
pub fn find_emulator() -> anyhow::Result<PathBuf> {
    let script = find_script()?;
    let java = std::env::var_os("JAVA_HOME")
        .map(|home| Path::new(&home).join("bin/java"))
        .filter(|p| p.is_file())
        .or_else(|| process::find_program("java"));
    ensure!(
        java.is_some(),
        "the Pub/Sub emulator ({}) needs Java 11 or later, and there is no `java` in PATH or \
         JAVA_HOME (`apt-get install -y default-jre-headless`)",
        script.display()
    );
    Ok(script)
}

fn find_script() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(PUBSUB_EMULATOR_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        ensure!(
            path.is_file(),
            "{PUBSUB_EMULATOR_ENV}={} is not a file",
            path.display()
        );
        return Ok(path);
    }
    let mut roots: Vec<PathBuf> = SDK_ROOTS.iter().map(PathBuf::from).collect();
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join("google-cloud-sdk"));
    }
    if let Some(found) = roots.iter().map(|r| r.join(IN_SDK)).find(|p| p.is_file()) {
        return Ok(found);
    }
    if let Some(gcloud) = process::find_program("gcloud") {
        let output = std::process::Command::new(gcloud)
            .args(["info", "--format=value(installation.sdk_root)"])
            .stdin(std::process::Stdio::null())
            .output();
        if let Ok(output) = output {
            let root = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            let candidate = Path::new(&root).join(IN_SDK);
            if !root.is_empty() && candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    let looked: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    bail!(
        "the Cloud Pub/Sub emulator is not installed (looked under {} and `gcloud info`); \
         install it (`apt-get install google-cloud-cli-pubsub-emulator` from Google's apt \
         repository, or `gcloud components install pubsub-emulator`), or set \
         {PUBSUB_EMULATOR_ENV} to its `cloud-pubsub-emulator` script",
        looked.join(", ")
    )
}

impl PubSubEmulator {
    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.host())
    }

    /// Creates topic `projects/<project>/topics/<topic>` (an existing one is fine).
    pub async fn create_topic(&self, project: &str, topic: &str) -> anyhow::Result<()> {
        let path = format!("/v1/projects/{project}/topics/{}", escape(topic));
        let (status, body) = self.call("PUT", &path, Some(&json!({}))).await?;
        ensure!(
            status == 200 || status == 409,
            "creating topic {project}/{topic}: HTTP {status} {}",
            String::from_utf8_lossy(&body)
        );
        Ok(())
    }

    /// Creates subscription `projects/<project>/subscriptions/<subscription>` to `topic` (an
    /// existing one is fine), with message ordering when `ordered`.
    pub async fn create_subscription(
        &self,
        project: &str,
        subscription: &str,
        topic: &str,
        ordered: bool,
    ) -> anyhow::Result<()> {
        let path = format!(
            "/v1/projects/{project}/subscriptions/{}",
            escape(subscription)
        );
        let body = json!({
            "topic": format!("projects/{project}/topics/{topic}"),
            "enableMessageOrdering": ordered,
            "ackDeadlineSeconds": 60,
        });
        let (status, answer) = self.call("PUT", &path, Some(&body)).await?;
        ensure!(
            status == 200 || status == 409,
            "creating subscription {project}/{subscription}: HTTP {status} {}",
            String::from_utf8_lossy(&answer)
        );
        Ok(())
    }

    /// Pulls at most `max` messages available now (none is fine) and acknowledges them.
    /// With ordering on, the next message of an ordering key comes only after the previous
    /// one was acknowledged, so pulling in a loop gets them all, in order.
    pub async fn pull(
        &self,
        project: &str,
        subscription: &str,
        max: usize,
    ) -> anyhow::Result<Vec<PulledMessage>> {
        let base = format!(
            "/v1/projects/{project}/subscriptions/{}",
            escape(subscription)
        );
        let request = json!({ "maxMessages": max, "returnImmediately": true });
        let (status, body) = self
            .call("POST", &format!("{base}:pull"), Some(&request))
            .await?;
        ensure!(
            status == 200,
            "pulling {project}/{subscription}: HTTP {status} {}",
            String::from_utf8_lossy(&body)
        );
        let answer: Value = serde_json::from_slice(&body).context("pull answer is not JSON")?;
        let mut messages = Vec::new();
        let mut ack_ids = Vec::new();
        for received in answer["receivedMessages"].as_array().into_iter().flatten() {
            let message = &received["message"];
            let data = match message["data"].as_str() {
                Some(text) => base64_decode(text).context("message data is not base64")?,
                None => Vec::new(),
            };
            let attributes = message["attributes"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            messages.push(PulledMessage {
                message_id: message["messageId"].as_str().unwrap_or_default().to_owned(),
                data: Bytes::from(data),
                attributes,
                ordering_key: message["orderingKey"]
                    .as_str()
                    .filter(|k| !k.is_empty())
                    .map(str::to_owned),
            });
            if let Some(id) = received["ackId"].as_str() {
                ack_ids.push(id.to_owned());
            }
        }
        if !ack_ids.is_empty() {
            let (status, body) = self
                .call(
                    "POST",
                    &format!("{base}:acknowledge"),
                    Some(&json!({ "ackIds": ack_ids })),
                )
                .await?;
            ensure!(
                status == 200,
                "acknowledging on {project}/{subscription}: HTTP {status} {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(messages)
    }

    /// One HTTP/1.1 request to the emulator's REST API: the status and the body.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        tokio::time::timeout(
            Duration::from_secs(30),
            http(self.host(), method, path, body),
        )
        .await
        .with_context(|| format!("{method} {path}: no answer within 30s"))?
    }
}

impl ServerSpec for EmulatorServer {
    const NAME: &'static str = "cloud-pubsub-emulator";
    const LABEL: &'static str = "the Pub/Sub emulator";
    const SHARED: &'static str = "the shared Pub/Sub emulator";
    const START_PRIVATE: &'static str = "PubSubEmulator::start()";
    const DIR_PREFIX: &'static str = "outbox-pubsub-";
    const URL_ENV: &'static str = PUBSUB_HOST_ENV;
    // A JVM on two busy cores: a few seconds usually, much more while cargo builds.
    const READY_TIMEOUT: Duration = Duration::from_secs(120);
    const POLL: Duration = Duration::from_millis(100);

    fn setup(_root: &Path) -> anyhow::Result<Self> {
        let script = find_emulator()?;
        Ok(EmulatorServer {
            script,
            setsid: process::find_program("setsid"),
        })
    }

    fn url(port: u16) -> String {
        format!("127.0.0.1:{port}")
    }

    fn external_port(url: &str) -> anyhow::Result<u16> {
        url.trim()
            .trim_start_matches("http://")
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .with_context(|| format!("{PUBSUB_HOST_ENV}={url}: expected host:port"))
    }

    /// Lists the topics of a project: the REST API answers only once the emulator is ready.
    async fn probe(url: &str, _port: u16) -> anyhow::Result<()> {
        let (status, body) = tokio::time::timeout(
            Duration::from_secs(5),
            http(url, "GET", "/v1/projects/outbox-probe/topics", None),
        )
        .await
        .context("no answer in time")??;
        ensure!(
            status == 200,
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(())
    }

    fn program(&self) -> &Path {
        Path::new("/bin/sh")
    }

    fn args(&self, port: u16) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "-c".into(),
            GROUP_WRAPPER.into(),
            "pubsub-emulator-group".into(),
        ];
        if let Some(setsid) = &self.setsid {
            args.push(setsid.into());
        }
        args.push(self.script.clone().into());
        args.push("--host=127.0.0.1".into());
        args.push(format!("--port={port}").into());
        args
    }
}

/// `%`-escapes what may not appear raw in a URL path segment (topic ids may hold `%`).
fn escape(segment: &str) -> String {
    segment.replace('%', "%25")
}

/// A minimal HTTP/1.1 client (the emulator speaks plain HTTP): one request per connection.
async fn http(
    host: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let body = match body {
        Some(value) => serde_json::to_vec(value)?,
        None => Vec::new(),
    };
    let mut stream = tokio::net::TcpStream::connect(host)
        .await
        .with_context(|| format!("connecting to {host}"))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    // The emulator keeps the connection open despite `Connection: close`: read until the
    // answer is complete rather than until the end of the stream.
    let mut answer = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return parse_response(&answer, true)?.context("HTTP answer cut short");
        }
        answer.extend_from_slice(&chunk[..n]);
        if let Some(done) = parse_response(&answer, false)? {
            return Ok(done);
        }
    }
}

/// The status and the body of an HTTP/1.1 answer (length-delimited, chunked, or ended by the
/// connection closing: `closed`), or `None` while it is incomplete.
fn parse_response(answer: &[u8], closed: bool) -> anyhow::Result<Option<(u16, Vec<u8>)>> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP answer: {head}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding") && value.contains("chunked") {
                chunked = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            }
        }
    }
    let rest = &answer[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(length) = length {
        (rest.len() >= length).then(|| rest[..length].to_vec())
    } else {
        closed.then(|| rest.to_vec())
    };
    Ok(body.map(|body| (status, body)))
}

/// The body of a `Transfer-Encoding: chunked` answer, `None` while incomplete.
fn dechunk(mut rest: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("chunk size `{size_text}`"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(Some(body));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// Standard base64 (with or without padding), as the REST API writes message data.
fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut buffer = 0u32;
    let mut bits = 0;
    for c in text.bytes() {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' | b'\r' | b'\n' => continue,
            other => bail!("`{}` is not a base64 character", char::from(other)),
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_what_the_api_writes() {
        assert_eq!(base64_decode("").expect("empty"), b"");
        assert_eq!(base64_decode("aGVsbG8=").expect("padded"), b"hello");
        assert_eq!(base64_decode("AP8=").expect("binary"), [0u8, 255]);
        assert_eq!(base64_decode("YWJj").expect("exact"), b"abc");
        assert!(base64_decode("a b").is_err());
    }

    #[test]
    fn answers_parse_with_any_framing() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nOk\n";
        assert_eq!(
            parse_response(plain, false).expect("plain"),
            Some((200, b"Ok\n".to_vec()))
        );
        assert_eq!(
            parse_response(&plain[..plain.len() - 1], false).expect("short"),
            None
        );
        let chunked =
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked, false).expect("chunked"),
            Some((404, b"abcde".to_vec()))
        );
        assert_eq!(
            parse_response(&chunked[..60], false).expect("partial"),
            None
        );
        let unframed = b"HTTP/1.1 200 OK\r\n\r\nall";
        assert_eq!(parse_response(unframed, false).expect("open"), None);
        assert_eq!(
            parse_response(unframed, true).expect("closed"),
            Some((200, b"all".to_vec()))
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\n", true).expect("head"),
            None
        );
    }
}
