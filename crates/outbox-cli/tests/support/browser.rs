//! A real browser for the console tests: node, Debian's Chromium and playwright-core in
//! `tests/console/node_modules` (installed by `scripts/test.sh`), and a plain HTTP/1.1 client.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The driver's folder: `console.mjs`, `package.json`, `package-lock.json`, `node_modules`.
pub fn driver_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console")
}

/// node, Chromium and playwright-core, or an error saying how to get them.
pub fn browser_tools() -> anyhow::Result<PathBuf> {
    let fix = "run scripts/test.sh, which installs them (services_install_browser in scripts/services.sh: Debian's chromium, and `npm ci` in crates/outbox-cli/tests/console)";
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        bail!("the console test needs node (Node.js 20+) on PATH: {fix}");
    }
    let chromium = std::env::var_os("OUTBOX_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.is_file() {
        bail!(
            "the console test needs Chromium at {} (or OUTBOX_CHROMIUM): {fix}",
            chromium.display()
        );
    }
    if !driver_dir()
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        bail!(
            "the console test needs playwright-core in {}/node_modules: {fix}",
            driver_dir().display()
        );
    }
    Ok(chromium)
}

/// One HTTP/1.1 request to 127.0.0.1; returns (status, body).
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no HTTP answer")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    Ok((status, body.to_owned()))
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
