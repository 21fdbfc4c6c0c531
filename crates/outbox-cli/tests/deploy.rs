//! The deployment artifacts in `deploy/` are checked against the real thing:
//!
//! - the Prometheus alert rules pass `promtool check rules` and their unit tests
//!   (`promtool test rules`); every alert has a `for:`, a severity, a summary, a description and
//!   a runbook that is a section of docs/operations.md, and is tested firing and not firing;
//! - every `outbox_*` metric and every label the Grafana dashboard and the alert rules use is
//!   one a running relay exposes (scraped from a real `outbox relay`);
//! - the Kubernetes manifest probes `/readyz` and `/healthz` on the port its ConfigMap's
//!   `[metrics] listen` binds, on all interfaces, and that TOML passes `outbox check-config`;
//! - the systemd unit passes `systemd-analyze verify` (where it exists) and its `ExecStart`
//!   flags are ones `outbox relay` accepts.
//!
//! promtool comes from Debian's `prometheus` package; `scripts/test.sh` installs it
//! (`services_install_promtool` in scripts/services.sh). Without it the promtool test fails
//! and says so: it never passes silently.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use outbox_core::NewEvent;
use outbox_testkit::services::HttpReceiver;
use serde_norway::Value as Yaml;
use support::{BIN, Workdir, terminate};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn deploy(path: &str) -> PathBuf {
    repo().join("deploy").join(path)
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn load_yaml(path: &Path) -> anyhow::Result<Yaml> {
    serde_norway::from_str(&read(path)?).with_context(|| format!("parsing {}", path.display()))
}

/// `OUTBOX_TEST_PROMTOOL`, else `promtool` on PATH (or where the install step puts it).
fn promtool() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("OUTBOX_TEST_PROMTOOL") {
        return Ok(PathBuf::from(p));
    }
    which("promtool")
        .ok()
        .or_else(|| {
            ["/usr/local/bin/promtool", "/usr/bin/promtool"]
                .map(PathBuf::from)
                .into_iter()
                .find(|p| p.is_file())
        })
        .context(
            "promtool not found (OUTBOX_TEST_PROMTOOL unset, not on PATH): run scripts/test.sh, \
             which installs it (services_install_promtool in scripts/services.sh), or install \
             Debian's `prometheus` package",
        )
}

/// Runs a command, failing with its whole output unless it exits 0.
fn run_ok(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    Ok(text)
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() -> anyhow::Result<()> {
    let promtool = promtool()?;
    let rules = deploy("prometheus/outbox-alerts.yml");
    let tests = deploy("prometheus/outbox-alerts.test.yml");
    let out = run_ok(
        Command::new(&promtool)
            .arg("check")
            .arg("rules")
            .arg(&rules),
    )?;
    ensure!(out.contains("SUCCESS"), "promtool check rules:\n{out}");
    let out = run_ok(Command::new(&promtool).arg("test").arg("rules").arg(&tests))?;
    ensure!(out.contains("SUCCESS"), "promtool test rules:\n{out}");
    Ok(())
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn alert_rules(rules: &Yaml) -> anyhow::Result<Vec<&Yaml>> {
    let groups = rules["groups"].as_sequence().context("groups")?;
    let mut out = Vec::new();
    for g in groups {
        for r in g["rules"].as_sequence().context("group rules")? {
            if r.get("alert").is_some() {
                out.push(r);
            }
        }
    }
    Ok(out)
}

#[test]
fn every_alert_has_a_duration_severity_annotations_a_runbook_and_two_tests() -> anyhow::Result<()> {
    let rules = load_yaml(&deploy("prometheus/outbox-alerts.yml"))?;
    let tests = load_yaml(&deploy("prometheus/outbox-alerts.test.yml"))?;
    let operations = read(&repo().join("docs/operations.md"))?;
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect();

    // (alert, expected to fire) for every alert_rule_test.
    let mut tested: BTreeSet<(String, bool)> = BTreeSet::new();
    for t in tests["tests"].as_sequence().context("tests")? {
        for a in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = a["alertname"].as_str().context("alertname")?;
            let fires = a["exp_alerts"].as_sequence().is_some_and(|s| !s.is_empty());
            tested.insert((name.to_owned(), fires));
        }
    }

    let alerts = alert_rules(&rules)?;
    ensure!(alerts.len() >= 8, "only {} alerts", alerts.len());
    let mut names = BTreeSet::new();
    for r in alerts {
        let name = r["alert"].as_str().context("alert name")?;
        ensure!(names.insert(name.to_owned()), "{name}: defined twice");
        let for_ = r["for"].as_str().unwrap_or("");
        ensure!(!for_.is_empty(), "{name}: no `for:`");
        let severity = r["labels"]["severity"].as_str().unwrap_or("");
        ensure!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity `{severity}`"
        );
        for key in ["summary", "description"] {
            ensure!(
                r["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: no {key} annotation"
            );
        }
        let runbook = r["annotations"]["runbook_url"]
            .as_str()
            .with_context(|| format!("{name}: no runbook_url annotation"))?;
        let section = runbook
            .strip_prefix("docs/operations.md#")
            .with_context(|| format!("{name}: runbook {runbook} is not in docs/operations.md"))?;
        ensure!(
            anchors.contains(section),
            "{name}: docs/operations.md has no section #{section}"
        );
        for fires in [true, false] {
            ensure!(
                tested.contains(&(name.to_owned(), fires)),
                "{name}: outbox-alerts.test.yml has no test where it {}",
                if fires { "fires" } else { "must not fire" }
            );
        }
    }
    for (name, _) in &tested {
        ensure!(
            names.contains(name),
            "the tests name an unknown alert {name}"
        );
    }
    Ok(())
}

/// Every string under a key named `expr` (alert rules, Grafana targets) or `query` /
/// `definition` (Grafana template variables).
fn expressions(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => {
                        out.push(s.clone());
                    }
                    _ => expressions(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| expressions(v, out)),
        _ => {}
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The `outbox_*` metric names an expression mentions.
fn outbox_metrics(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("outbox_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail.find(|c| !is_ident(c)).unwrap_or(tail.len());
        if !before.is_some_and(is_ident) {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

/// The label names an expression uses: in `{name="..."}` selectors and in
/// `by / without / on / ignoring / group_left / group_right (...)` clauses.
fn labels_used(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '{' {
            // A selector: name op "value", ...
            let mut j = i + 1;
            loop {
                while j < chars.len() && (chars[j].is_whitespace() || chars[j] == ',') {
                    j += 1;
                }
                let start = j;
                while j < chars.len() && is_ident(chars[j]) {
                    j += 1;
                }
                if j > start {
                    out.insert(chars[start..j].iter().collect());
                }
                // Skip the operator and the quoted value.
                while j < chars.len() && chars[j] != '"' && chars[j] != '}' {
                    j += 1;
                }
                if j < chars.len() && chars[j] == '"' {
                    j += 1;
                    while j < chars.len() && chars[j] != '"' {
                        if chars[j] == '\\' {
                            j += 1;
                        }
                        j += 1;
                    }
                    j += 1;
                }
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                if j >= chars.len() || chars[j] == '}' {
                    break;
                }
            }
            i = j + 1;
            continue;
        }
        if chars[i].is_ascii_alphabetic() && (i == 0 || !is_ident(chars[i - 1])) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str())
            {
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                if j < chars.len() && chars[j] == '(' {
                    let close = chars[j..]
                        .iter()
                        .position(|&c| c == ')')
                        .map_or(chars.len(), |p| j + p);
                    let inside: String = chars[j + 1..close].iter().collect();
                    out.extend(
                        inside
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned),
                    );
                    i = close;
                }
            }
            continue;
        }
        i += 1;
    }
    out
}

#[test]
fn the_expression_scanners_find_metrics_and_labels() {
    let e = r#"histogram_quantile(0.99, sum by (le, sink) (rate(outbox_commit_to_ack_seconds_bucket{job=~"$job", instance=~"a,b}"}[5m]))) / on (job) group_left () xoutbox_no"#;
    assert_eq!(
        outbox_metrics(e),
        BTreeSet::from(["outbox_commit_to_ack_seconds_bucket".to_owned()])
    );
    assert_eq!(
        labels_used(e),
        ["le", "sink", "job", "instance"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    );
}

/// Sample names and label names of a Prometheus text exposition.
fn exposition(body: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut names = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        names.insert(line[..end].to_owned());
        if line[end..].starts_with('{') {
            labels.extend(labels_used(&line[end..]));
        }
    }
    (names, labels)
}

async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await?;
    let status = buf
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status")?;
    let (_, body) = buf.split_once("\r\n\r\n").context("no body")?;
    Ok((status, body.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_use_only_metrics_and_labels_a_running_relay_exposes()
-> anyhow::Result<()> {
    // What the artifacts use.
    let dashboard: serde_json::Value = serde_json::from_str(&read(&deploy("grafana/outbox.json"))?)
        .context("deploy/grafana/outbox.json is not JSON")?;
    check_dashboard_shape(&dashboard)?;
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    let dashboard_exprs = exprs.len();
    let rules = load_yaml(&deploy("prometheus/outbox-alerts.yml"))?;
    for r in alert_rules(&rules)? {
        exprs.push(r["expr"].as_str().context("expr")?.to_owned());
    }
    ensure!(
        dashboard_exprs >= 20,
        "only {dashboard_exprs} dashboard queries"
    );
    let mut used_metrics: BTreeMap<String, String> = BTreeMap::new();
    let mut used_labels: BTreeMap<String, String> = BTreeMap::new();
    for e in &exprs {
        for m in outbox_metrics(e) {
            used_metrics.entry(m).or_insert_with(|| e.clone());
        }
        for l in labels_used(e) {
            used_labels.entry(l).or_insert_with(|| e.clone());
        }
    }
    // Legends name labels too: `{{sink}}`.
    let mut legends = Vec::new();
    collect_strings(&dashboard, "legendFormat", &mut legends);
    for legend in &legends {
        let mut rest = legend.as_str();
        while let Some(i) = rest.find("{{") {
            let tail = &rest[i + 2..];
            let end = tail.find("}}").context("unclosed {{ in a legend")?;
            used_labels
                .entry(tail[..end].trim().to_owned())
                .or_insert_with(|| format!("legend {legend}"));
            rest = &tail[end..];
        }
    }

    // What a real relay exposes: SQLite, and an HTTP receiver that refuses some events, so
    // that the retry and dead-letter counters (with their labels) exist too.
    let hooks = HttpReceiver::start().await?;
    hooks.reject_when_header("outbox-poison", "1", 503);
    hooks.reject_when_header("outbox-fatal", "1", 422);
    let metrics_addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let work = Workdir::new()?;
    let config = work.write_config(
        "outbox.toml",
        &format!(
            r#"
[source]
kind = "sqlite"
path = "outbox.db"
[relay]
backoff = {{ initial = "1h", max = "2h", jitter = 0.0 }}
[sink]
kind = "http"
url = "{hook}"
[metrics]
listen = "{metrics_addr}"
refresh_interval = "100ms"
"#,
            hook = hooks.url_for("/in")
        ),
    )?;
    let cfg = config.to_str().context("utf-8 path")?;
    let migrated = work.run(&["migrate", "--config", cfg]).await?;
    ensure!(migrated.code == Some(0), "migrate: {migrated:?}");
    let pool = outbox_sqlite::connect(&outbox_sqlite::SqliteConfig::new(
        work.path().join("outbox.db"),
    ))
    .await?;
    for i in 0..3 {
        let e = NewEvent::new("Order", format!("o{i}"), "order.placed", b"{}".to_vec());
        outbox_sqlite::enqueue(&pool, &e).await?;
    }
    let poison =
        NewEvent::new("Order", "p1", "order.placed", b"{}".to_vec()).with_header("poison", "1");
    outbox_sqlite::enqueue(&pool, &poison).await?;
    let fatal =
        NewEvent::new("Invoice", "i1", "invoice.issued", b"{}".to_vec()).with_header("fatal", "1");
    outbox_sqlite::enqueue(&pool, &fatal).await?;

    let mut relay = work.spawn_relay(&config, "relay.log")?;
    let wanted = [
        "outbox_events_published_total{",
        "outbox_events_failed_total{",
        "outbox_events_dead_lettered_total{",
        "outbox_commit_to_ack_seconds_bucket{",
        "outbox_batch_size_count",
        "outbox_dead_events 1",
        "outbox_retrying_events 1",
        "outbox_sink_up 1",
        "outbox_retention_last_success_timestamp_seconds",
    ];
    let last = std::sync::Mutex::new(String::new());
    let scraped = outbox_testkit::wait::eventually(Duration::from_secs(60), || async {
        let body = http_get(metrics_addr, "/metrics")
            .await
            .map(|(_, b)| b)
            .unwrap_or_default();
        let ok = wanted.iter().all(|w| body.contains(w));
        *last.lock().expect("lock") = body;
        ok
    })
    .await;
    let body = last.into_inner().expect("lock");
    if scraped.is_err() {
        let _ = terminate(&mut relay, Duration::from_secs(20)).await;
        bail!(
            "the relay's /metrics never showed all of {wanted:?}:\n{body}\nrelay log:\n{}",
            work.read_log("relay.log")
        );
    }
    let (healthz, _) = http_get(metrics_addr, "/healthz").await?;
    let (readyz, _) = http_get(metrics_addr, "/readyz").await?;
    ensure!(
        terminate(&mut relay, Duration::from_secs(20)).await? == Some(0),
        "relay did not exit 0 on SIGTERM:\n{}",
        work.read_log("relay.log")
    );
    ensure!(
        healthz == 200 && readyz == 200,
        "/healthz {healthz}, /readyz {readyz}"
    );

    let (mut exposed, scraped_labels) = exposition(&body);
    // Emitted only by a PostgreSQL backend (the polling watchdog, the CDC slot check), only
    // when the database fails (source errors, unrecorded batches), or only with `[tracing]`
    // set (dropped spans; tests/tracing.rs scrapes it), or only with `[canary]` and a probe
    // lost or out of order (tests/canary.rs scrapes the lost counter): checked against the
    // names the relay registers them under instead of a scrape.
    exposed.extend(
        [
            outbox_core::metrics::TRACE_SPANS_DROPPED,
            outbox_core::metrics::STUCK_EVENTS,
            outbox_core::metrics::OLDEST_TRANSACTION_AGE_SECONDS,
            outbox_core::metrics::OLDEST_TRANSACTION_PID,
            outbox_core::metrics::REPLICATION_SLOT_RETAINED_WAL_BYTES,
            outbox_core::metrics::SOURCE_ERRORS,
            outbox_core::metrics::SETTLE_FAILURES,
            outbox_core::metrics::CANARY_LOST,
            outbox_core::metrics::CANARY_OUT_OF_ORDER,
        ]
        .map(str::to_owned),
    );
    let unknown: Vec<String> = used_metrics
        .iter()
        .filter(|(m, _)| !exposed.contains(*m))
        .map(|(m, e)| format!("{m} (in `{e}`)"))
        .collect();
    ensure!(
        unknown.is_empty(),
        "metrics the relay does not expose:\n  {}\nexposed: {exposed:?}",
        unknown.join("\n  ")
    );
    // Every scraped outbox metric family is on the dashboard (a new metric gets a panel).
    let families: BTreeSet<&str> = exposed
        .iter()
        .filter(|m| m.starts_with("outbox_"))
        .map(|m| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| m.strip_suffix(s))
                .unwrap_or(m)
        })
        .collect();
    let used_families: BTreeSet<&str> = used_metrics
        .keys()
        .map(|m| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| m.strip_suffix(s))
                .unwrap_or(m)
        })
        .collect();
    let missing: Vec<&&str> = families.difference(&used_families).collect();
    ensure!(
        missing.is_empty(),
        "metrics the relay exposes that neither the dashboard nor the alerts show: {missing:?}"
    );
    // Labels: the relay's own, plus the target labels Prometheus adds.
    let mut allowed = scraped_labels;
    allowed.extend(["job", "instance"].map(str::to_owned));
    let unknown: Vec<String> = used_labels
        .iter()
        .filter(|(l, _)| !allowed.contains(*l))
        .map(|(l, e)| format!("{l} (in `{e}`)"))
        .collect();
    ensure!(
        unknown.is_empty(),
        "labels the relay's metrics do not have:\n  {}\nknown: {allowed:?}",
        unknown.join("\n  ")
    );
    Ok(())
}

fn collect_strings(v: &serde_json::Value, key: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if let (true, serde_json::Value::String(s)) = (k == key, v) {
                    out.push(s.clone());
                } else {
                    collect_strings(v, key, out);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_strings(v, key, out)),
        _ => {}
    }
}

/// Importable: a `DS_PROMETHEUS` input that every panel and query uses, unique panel ids.
fn check_dashboard_shape(d: &serde_json::Value) -> anyhow::Result<()> {
    let inputs = d["__inputs"].as_array().context("no __inputs")?;
    ensure!(
        inputs
            .iter()
            .any(|i| i["name"] == "DS_PROMETHEUS" && i["pluginId"] == "prometheus"),
        "no DS_PROMETHEUS datasource input"
    );
    ensure!(d["title"].is_string() && d["uid"].is_string(), "title, uid");
    let panels = d["panels"].as_array().context("panels")?;
    let mut ids = BTreeSet::new();
    for p in panels {
        let id = p["id"].as_u64().context("panel id")?;
        ensure!(ids.insert(id), "panel id {id} twice");
        if p["type"] == "row" {
            continue;
        }
        ensure!(
            p["datasource"]["uid"] == "${DS_PROMETHEUS}",
            "panel {} does not use ${{DS_PROMETHEUS}}",
            p["title"]
        );
        let targets = p["targets"].as_array().context("targets")?;
        ensure!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            ensure!(
                t["datasource"]["uid"] == "${DS_PROMETHEUS}" && t["expr"].is_string(),
                "panel {}: a query without expr or ${{DS_PROMETHEUS}}",
                p["title"]
            );
        }
    }
    Ok(())
}

/// The documents of the manifest, by kind.
fn manifest() -> anyhow::Result<BTreeMap<String, Yaml>> {
    use serde::Deserialize;
    let text = read(&deploy("kubernetes/outbox-relay.yaml"))?;
    let mut docs = BTreeMap::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v = Yaml::deserialize(doc).context("deploy/kubernetes/outbox-relay.yaml")?;
        if v.is_null() {
            continue;
        }
        let kind = v["kind"]
            .as_str()
            .context("a document without kind")?
            .to_owned();
        ensure!(
            docs.insert(kind.clone(), v).is_none(),
            "two documents of kind {kind}"
        );
    }
    Ok(docs)
}

/// An `httpGet` probe's port: a number or the name of a container port.
fn probe_port(container: &Yaml, port: &Yaml) -> anyhow::Result<u64> {
    if let Some(n) = port.as_u64() {
        return Ok(n);
    }
    let name = port.as_str().context("probe port")?;
    container["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|p| p["name"].as_str() == Some(name))
        .and_then(|p| p["containerPort"].as_u64())
        .with_context(|| format!("no container port named {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_probes_hit_the_metrics_listener_and_its_config_is_valid() -> anyhow::Result<()>
{
    let docs = manifest()?;
    let config_map = docs.get("ConfigMap").context("no ConfigMap")?;
    let toml_text = config_map["data"]["outbox.toml"]
        .as_str()
        .context("ConfigMap data outbox.toml")?;
    let toml: toml::Table = toml_text.parse().context("the ConfigMap's outbox.toml")?;
    let listen: SocketAddr = toml
        .get("metrics")
        .and_then(|m| m.get("listen"))
        .and_then(|l| l.as_str())
        .context("the ConfigMap's TOML has no [metrics] listen")?
        .parse()
        .context("[metrics] listen")?;
    ensure!(
        listen.ip().is_unspecified(),
        "[metrics] listen = {listen}: probes and Prometheus come from outside the pod; bind 0.0.0.0"
    );
    let port = u64::from(listen.port());

    let deployment = docs.get("Deployment").context("no Deployment")?;
    let spec = &deployment["spec"]["template"]["spec"];
    ensure!(
        deployment["spec"]["replicas"].as_u64() >= Some(2),
        "replicas"
    );
    let containers = spec["containers"].as_sequence().context("containers")?;
    ensure!(containers.len() == 1, "one container");
    let c = &containers[0];
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        ensure!(
            get["path"].as_str() == Some(path),
            "{probe} path {:?}, want {path}",
            get["path"]
        );
        let p = probe_port(c, &get["port"])?;
        ensure!(
            p == port,
            "{probe} on port {p}, but [metrics] listen is {listen}"
        );
    }
    // Scraping: the PodMonitor's port and the annotations name the same port.
    let monitor = docs.get("PodMonitor").context("no PodMonitor")?;
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    ensure!(probe_port(c, &endpoint["port"])? == port, "PodMonitor port");
    ensure!(
        endpoint["path"].as_str() == Some("/metrics"),
        "PodMonitor path"
    );
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    ensure!(
        annotations["prometheus.io/port"].as_str() == Some(&port.to_string()),
        "prometheus.io/port annotation"
    );

    // Hardening and shutdown.
    let sc = &c["securityContext"];
    ensure!(
        sc["readOnlyRootFilesystem"].as_bool() == Some(true),
        "readOnlyRootFilesystem"
    );
    ensure!(
        sc["allowPrivilegeEscalation"].as_bool() == Some(false),
        "allowPrivilegeEscalation"
    );
    ensure!(
        sc["runAsNonRoot"].as_bool() == Some(true)
            || spec["securityContext"]["runAsNonRoot"].as_bool() == Some(true),
        "runAsNonRoot"
    );
    ensure!(
        c["resources"]["requests"]["memory"].is_string(),
        "resource requests"
    );
    let grace = spec["terminationGracePeriodSeconds"]
        .as_u64()
        .context("terminationGracePeriodSeconds")?;
    let publish_timeout = toml
        .get("relay")
        .and_then(|r| r.get("publish_timeout"))
        .and_then(|v| v.as_str())
        .unwrap_or("30s");
    let publish_timeout = humantime::parse_duration(publish_timeout)?;
    ensure!(
        Duration::from_secs(grace) > publish_timeout,
        "terminationGracePeriodSeconds {grace} does not let the relay drain (publish_timeout {publish_timeout:?})"
    );

    // The container runs `outbox relay --config F` with F the ConfigMap's file.
    let volumes = spec["volumes"].as_sequence().context("volumes")?;
    let mounts = c["volumeMounts"].as_sequence().context("volumeMounts")?;
    let mount_of = |pred: &dyn Fn(&Yaml) -> bool| -> anyhow::Result<String> {
        let volume = volumes
            .iter()
            .find(|v| pred(v))
            .and_then(|v| v["name"].as_str())
            .context("volume")?;
        mounts
            .iter()
            .find(|m| m["name"].as_str() == Some(volume))
            .and_then(|m| m["mountPath"].as_str())
            .map(str::to_owned)
            .with_context(|| format!("volume {volume} is not mounted"))
    };
    let config_dir =
        mount_of(&|v| v["configMap"]["name"].as_str() == config_map["metadata"]["name"].as_str())?;
    let secret_dir = mount_of(&|v| v["secret"]["secretName"].is_string())?;
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .context("args")?
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let config_path = format!("{}/outbox.toml", config_dir.trim_end_matches('/'));
    ensure!(
        args == ["relay", "--config", config_path.as_str()],
        "args {args:?}, want relay --config {config_path}"
    );

    // The TOML passes `outbox check-config`, with its secret files (under the Secret's mount)
    // replaced by placeholders in a scratch directory.
    let work = Workdir::new()?;
    let secrets = work.path().join("secrets");
    std::fs::create_dir(&secrets)?;
    let mut rewritten = toml_text.to_owned();
    let mut files = 0;
    for section in ["source", "sink"] {
        for (key, value) in toml
            .get(section)
            .and_then(|s| s.as_table())
            .into_iter()
            .flatten()
        {
            let Some(path) = key.ends_with("_file").then(|| value.as_str()).flatten() else {
                continue;
            };
            let name = path
                .strip_prefix(&format!("{}/", secret_dir.trim_end_matches('/')))
                .with_context(|| {
                    format!("{section}.{key} = {path} is not in the Secret's mount {secret_dir}")
                })?;
            let placeholder = match name {
                "database-url" => "postgres://outbox:placeholder-password@127.0.0.1:5432/app",
                "sink-url" => "nats://127.0.0.1:4222",
                other => bail!("no placeholder for the secret file {other}: add one here"),
            };
            std::fs::write(secrets.join(name), placeholder)?;
            rewritten = rewritten.replace(path, secrets.join(name).to_str().context("utf-8")?);
            files += 1;
        }
    }
    ensure!(files >= 1, "the ConfigMap reads no secret from the Secret");
    let cfg = work.write_config("outbox.toml", &rewritten)?;
    let out = work
        .run(&["check-config", "--config", cfg.to_str().context("utf-8")?])
        .await?;
    ensure!(out.code == Some(0), "outbox check-config: {out:?}");
    ensure!(
        out.stdout.contains(&format!("listen = \"{listen}\"")),
        "check-config: {}",
        out.stdout
    );
    ensure!(
        !out.stdout.contains("placeholder-password"),
        "check-config printed the database password: {}",
        out.stdout
    );
    Ok(())
}

/// `Key=value` lines of the unit (comments and sections dropped), in order.
fn unit_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_unit_is_valid_hardened_and_runs_the_relay() -> anyhow::Result<()> {
    let unit_path = deploy("systemd/outbox-relay.service");
    let text = read(&unit_path)?;
    let entries = unit_entries(&text);
    let get = |key: &str| -> Vec<&str> {
        entries
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    for (key, want) in [
        ("KillSignal", "SIGTERM"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("Restart", "on-failure"),
    ] {
        ensure!(get(key) == [want], "{key}: {:?}, want {want}", get(key));
    }
    ensure!(
        get("DynamicUser") == ["yes"] || !get("User").is_empty(),
        "neither DynamicUser=yes nor User="
    );
    let stop = get("TimeoutStopSec");
    let stop = humantime::parse_duration(stop.first().context("TimeoutStopSec")?)?;
    ensure!(
        stop > Duration::from_secs(30),
        "TimeoutStopSec {stop:?} does not let the relay drain (relay.publish_timeout is 30s)"
    );
    // The URL comes from a credential the service loads, not from the unit or the config.
    let credentials: Vec<&str> = get("LoadCredential")
        .iter()
        .filter_map(|v| v.split_once(':').map(|(name, _)| name))
        .collect();
    ensure!(!credentials.is_empty(), "no LoadCredential=");
    for env in get("Environment") {
        if let Some((_, file)) = env.split_once("=%d/") {
            ensure!(
                credentials.contains(&file),
                "{env} names a credential the unit does not load"
            );
        }
    }

    // ExecStart: our binary with flags `outbox relay` accepts.
    let exec = get("ExecStart");
    let exec = exec.first().context("ExecStart")?;
    let mut words = exec.split_whitespace();
    let binary = words.next().context("ExecStart binary")?;
    ensure!(binary.ends_with("/outbox"), "ExecStart runs {binary}");
    let args: Vec<&str> = words.collect();
    ensure!(args.first() == Some(&"relay"), "ExecStart {exec}");
    let work = Workdir::new()?;
    let mut with_help = args.clone();
    with_help.push("--help");
    let help = work.run(&with_help).await?;
    ensure!(
        help.code == Some(0) && help.stdout.contains("Usage: outbox relay"),
        "`outbox {}` refused the unit's flags: {help:?}",
        with_help.join(" ")
    );

    // systemd's own verdict, where systemd is installed (it wants ExecStart to exist: the
    // binary under test stands in for /usr/local/bin/outbox).
    let Ok(analyze) = which("systemd-analyze") else {
        eprintln!("systemd-analyze not installed: only the ExecStart flags were checked");
        return Ok(());
    };
    let copy = work.path().join("outbox-relay.service");
    std::fs::write(&copy, text.replace(binary, BIN))?;
    let out = Command::new(analyze).arg("verify").arg(&copy).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("outbox-relay.service"))
        .collect();
    ensure!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify ({}):\n{stderr}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

fn which(name: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} not on PATH"))
}
