//! The console's endpoints over real HTTP on 127.0.0.1, against a SQLite outbox with one dead
//! letter: the JSON answers, and every refusal (actions off, no or wrong CSRF token, another
//! site's Origin, another host name, no token) leaves the dead letter as it was.

use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusBuilder;
use outbox_core::backend::OpenOptions;
use outbox_core::source::Backlog;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Console;
use crate::readiness::Readiness;
use crate::{Config, SourceConfig};

/// One answer: status, headers (lowercase names), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
}

/// Sends one HTTP/1.1 request; `Host` is `127.0.0.1:PORT` unless `headers` names one.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream
        .write_all(request.as_bytes())
        .await
        .expect("write request");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A console over a SQLite outbox holding one delivered-to-be event and one dead letter.
struct Fixture {
    _dir: tempfile::TempDir,
    addr: SocketAddr,
    console: Arc<Console>,
    pool: sqlx::SqlitePool,
    dead_id: String,
    /// The console's own site, as a browser's `Origin`.
    origin: String,
    /// The CSRF cookie the page sets, and its token.
    cookie: String,
    csrf: String,
}

impl Fixture {
    async fn start(ui: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("outbox.db");
        let config = Config::from_toml(&format!(
            "[source]\nkind = \"sqlite\"\npath = \"{}\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n[ui]\n{ui}\n",
            db.display()
        ))
        .expect("valid config");
        let SourceConfig::Sqlite(sqlite) = &config.source else {
            panic!("sqlite")
        };
        let backend = config
            .source
            .open(OpenOptions { connections: 2 })
            .await
            .expect("open");
        backend.migrate().await.expect("migrate");
        let pool = outbox_sqlite::connect(sqlite).await.expect("pool");
        let dead_id = "019ab2a0-0000-7000-8000-000000000003".to_owned();
        sqlx::query("INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, state, attempts, last_error, dead_lettered_at) VALUES (?1, 'Invoice', 'i_17', 'invoice.issued', '{\"n\":17}', '{\"fatal\":\"1\"}', 'dead', 1, 'HTTP 422 Unprocessable Entity from http://127.0.0.1:1/in', 1700000000000000)")
            .bind(&dead_id)
            .execute(&pool)
            .await
            .expect("insert dead letter");
        sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('Order', 'o_1', 'order.placed', '{}')")
            .execute(&pool)
            .await
            .expect("insert pending");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let handle = PrometheusBuilder::new().build_recorder().handle();
        let console = Console::from_config(&config, addr, handle, Arc::new(Readiness::default()))
            .expect("the console is on for a loopback listener");
        console.attach_backend(backend);
        console.record(&Backlog {
            pending: 1,
            dead: 1,
            ..Backlog::default()
        });
        let app = console.routes();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let csrf = console.keys.csrf.clone();
        Self {
            _dir: dir,
            origin: format!("http://{addr}"),
            cookie: format!("{}={csrf}", super::guard::CSRF_COOKIE),
            csrf,
            addr,
            console,
            pool,
            dead_id,
        }
    }

    async fn state(&self) -> String {
        sqlx::query_scalar("SELECT state FROM outbox WHERE id = ?1")
            .bind(&self.dead_id)
            .fetch_one(&self.pool)
            .await
            .expect("state")
    }

    /// The headers of an action sent by the console's own page: its `Origin`, the CSRF
    /// cookie (`cookie`: the page's, maybe with a session's) and the matching token.
    fn page_headers<'a>(&'a self, cookie: &'a str) -> [(&'a str, &'a str); 3] {
        [
            ("Origin", &self.origin),
            ("Cookie", cookie),
            ("X-Outbox-Csrf", &self.csrf),
        ]
    }

    /// POSTs `body` to `path` as `content_type`, with `headers`.
    async fn post(
        &self,
        path: &str,
        content_type: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut all = vec![("Content-Type", content_type)];
        all.extend_from_slice(headers);
        send(self.addr, "POST", path, &all, body).await
    }

    /// Asks to retry the dead letter, as `content_type`, with `headers`.
    async fn retry_as(&self, content_type: &str, headers: &[(&str, &str)]) -> Answer {
        let body = format!("{{\"ids\":[\"{}\"]}}", self.dead_id);
        self.post("/ui/api/dead/retry", content_type, headers, &body)
            .await
    }

    async fn retry(&self, headers: &[(&str, &str)]) -> Answer {
        self.retry_as("application/json", headers).await
    }

    /// Asks to purge dead letters (`body`) as the console's page does.
    async fn purge(&self, body: &str) -> Answer {
        let headers = self.page_headers(&self.cookie);
        self.post("/ui/api/dead/purge", "application/json", &headers, body)
            .await
    }
}

#[tokio::test]
async fn the_json_endpoints_show_the_backlog_the_dead_letters_and_why() {
    let f = Fixture::start("").await;
    let overview = send(f.addr, "GET", "/ui/api/overview", &[], "").await;
    assert_eq!(overview.status, 200, "{overview:?}");
    let o = overview.json();
    assert_eq!(o["samples"].as_array().map(Vec::len), Some(1), "{o}");
    assert_eq!(o["latest"]["pending"], 1, "{o}");
    assert_eq!(o["latest"]["dead"], 1, "{o}");
    assert_eq!(o["sinks"][0]["kind"], "stdout", "{o}");
    assert_eq!(o["source"]["kind"], "sqlite", "{o}");
    assert_eq!(o["actions"], false, "{o}");
    assert_eq!(o["subscriptions"], serde_json::json!([]), "{o}");
    let after = o["latest"]["t"].as_i64().expect("t");
    let newer = send(
        f.addr,
        "GET",
        &format!("/ui/api/overview?after={after}"),
        &[],
        "",
    )
    .await
    .json();
    assert_eq!(newer["samples"], serde_json::json!([]), "only new samples");

    let list = send(f.addr, "GET", "/ui/api/dead", &[], "").await.json();
    let letters = list["dead_letters"].as_array().expect("list");
    assert_eq!(letters.len(), 1, "{list}");
    assert_eq!(letters[0]["id"], f.dead_id.as_str());
    assert!(
        letters[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("422"))
    );
    let filtered = send(f.addr, "GET", "/ui/api/dead?type=order.placed", &[], "")
        .await
        .json();
    assert_eq!(filtered["dead_letters"], serde_json::json!([]));
    let by_aggregate = send(f.addr, "GET", "/ui/api/dead?aggregate=i_17&type=", &[], "")
        .await
        .json();
    assert_eq!(
        by_aggregate["dead_letters"].as_array().map(Vec::len),
        Some(1)
    );

    let shown = send(
        f.addr,
        "GET",
        &format!("/ui/api/events/{}", f.dead_id),
        &[],
        "",
    )
    .await;
    assert_eq!(shown.status, 200, "{shown:?}");
    let shown = shown.json();
    let text = shown["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .map(|l| l.as_str().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(text.contains("payload      {\"n\":17}"), "{text}");
    assert!(text.contains("headers      {\"fatal\":\"1\"}"), "{text}");
    assert!(text.contains("last error   HTTP 422"), "{text}");
    assert_eq!(shown["event"]["state"], "dead");

    let why = send(
        f.addr,
        "GET",
        &format!("/ui/api/why/{}", f.dead_id),
        &[],
        "",
    )
    .await;
    assert_eq!(why.status, 200, "{why:?}");
    let why = why.json();
    let last = why["lines"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(Value::as_str)
        .unwrap_or("");
    assert!(last.starts_with("why          dead-lettered at"), "{why}");
    assert_eq!(why["story"]["verdict"]["verdict"], "dead");

    let unknown = send(
        f.addr,
        "GET",
        "/ui/api/why/019ab2a0-0000-7000-8000-00000000ffff",
        &[],
        "",
    )
    .await;
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_eq!(unknown.json()["found"], false);
    let bad = send(f.addr, "GET", "/ui/api/events/not-an-id", &[], "").await;
    assert_eq!(bad.status, 400, "{bad:?}");
}

#[tokio::test]
async fn the_page_carries_the_csrf_token_and_strict_headers() {
    let f = Fixture::start("allow_actions = true").await;
    let page = send(f.addr, "GET", "/ui", &[], "").await;
    assert_eq!(page.status, 200, "{page:?}");
    assert!(
        page.body
            .contains(&format!("content=\"{}\"", f.console.keys.csrf))
    );
    assert!(page.body.contains("data-actions=\"on\""));
    assert!(
        page.header("set-cookie")
            .is_some_and(|c| c.starts_with(&f.cookie)
                && c.contains("SameSite=Strict")
                && c.contains("HttpOnly")),
        "{page:?}"
    );
    assert!(
        page.header("content-security-policy").is_some_and(
            |c| c.contains("script-src 'self'") && c.contains("frame-ancestors 'none'")
        ),
        "{page:?}"
    );
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    for asset in ["/ui/console.js", "/ui/console.css"] {
        let a = send(f.addr, "GET", asset, &[], "").await;
        assert_eq!(a.status, 200, "{asset}");
        assert!(!a.body.is_empty());
    }
}

#[tokio::test]
async fn actions_are_refused_when_they_are_off() {
    let f = Fixture::start("allow_actions = false").await;
    let refused = f.retry(&f.page_headers(&f.cookie)).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(
        refused.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("allow_actions"))
    );
    let purge = f.purge("{\"older_than\":\"0s\"}").await;
    assert_eq!(purge.status, 403, "{purge:?}");
    assert_eq!(f.state().await, "dead", "a refused action changed nothing");
    let page = send(f.addr, "GET", "/ui", &[], "").await;
    assert!(page.body.contains("data-actions=\"off\""));
}

#[tokio::test]
async fn actions_need_the_sites_origin_and_the_csrf_token_twice() {
    let f = Fixture::start("allow_actions = true").await;
    let (origin, cookie, csrf) = (f.origin.as_str(), f.cookie.as_str(), f.csrf.as_str());
    let wrong_cookie = format!("{}=0000", super::guard::CSRF_COOKIE);
    let attempts: [(&str, Vec<(&str, &str)>); 6] = [
        (
            "no CSRF token",
            vec![("Origin", origin), ("Cookie", cookie)],
        ),
        (
            "a wrong CSRF token",
            vec![
                ("Origin", origin),
                ("Cookie", cookie),
                ("X-Outbox-Csrf", "0000"),
            ],
        ),
        (
            "no CSRF cookie",
            vec![("Origin", origin), ("X-Outbox-Csrf", csrf)],
        ),
        (
            "a wrong CSRF cookie",
            vec![
                ("Origin", origin),
                ("Cookie", &wrong_cookie),
                ("X-Outbox-Csrf", csrf),
            ],
        ),
        (
            "another site's Origin",
            vec![
                ("Origin", "http://evil.example"),
                ("Cookie", cookie),
                ("X-Outbox-Csrf", csrf),
            ],
        ),
        (
            "no Origin",
            vec![("Cookie", cookie), ("X-Outbox-Csrf", csrf)],
        ),
    ];
    for (what, headers) in &attempts {
        let refused = f.retry(headers).await;
        assert_eq!(refused.status, 403, "{what}: {refused:?}");
        assert_eq!(f.state().await, "dead", "{what} changed the dead letter");
    }
    let plain = f.retry_as("text/plain", &f.page_headers(cookie)).await;
    assert_eq!(plain.status, 415, "a form-encodable body: {plain:?}");
    assert_eq!(f.state().await, "dead");
    let done = f.retry(&f.page_headers(cookie)).await;
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.json()["retried"][0], f.dead_id.as_str());
    assert_eq!(f.state().await, "pending", "put back in line");

    // Purge: dead-letter it again, then delete it.
    sqlx::query(
        "UPDATE outbox SET state = 'dead', dead_lettered_at = 1700000000000000 WHERE id = ?1",
    )
    .bind(&f.dead_id)
    .execute(&f.pool)
    .await
    .expect("dead again");
    let purged = f
        .purge("{\"older_than\":\"1h\",\"event_type\":\"invoice.issued\"}")
        .await;
    assert_eq!(purged.status, 200, "{purged:?}");
    assert_eq!(purged.json()["purged"], 1);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE state = 'dead'")
        .fetch_one(&f.pool)
        .await
        .expect("count");
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_loopback_console_answers_only_for_loopback_host_names() {
    let f = Fixture::start("").await;
    for host in ["evil.example", "evil.example:9187", "10.1.2.3:9187"] {
        let refused = send(f.addr, "GET", "/ui/api/dead", &[("Host", host)], "").await;
        assert_eq!(refused.status, 403, "{host}: {refused:?}");
    }
    let port = f.addr.port().to_string();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let ok = send(f.addr, "GET", "/ui/api/dead", &[("Host", &host)], "").await;
        assert_eq!(ok.status, 200, "{host}: {ok:?}");
    }
}

#[tokio::test]
async fn with_a_token_every_page_and_endpoint_needs_it() {
    let token = "a-long-console-token-1234";
    let f = Fixture::start(&format!("token = \"{token}\"\nallow_actions = true")).await;
    let api = send(f.addr, "GET", "/ui/api/overview", &[], "").await;
    assert_eq!(api.status, 401, "{api:?}");
    let wrong = send(
        f.addr,
        "GET",
        "/ui/api/overview",
        &[("Authorization", "Bearer nope-nope-nope-nope")],
        "",
    )
    .await;
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let bearer = format!("Bearer {token}");
    let ok = send(
        f.addr,
        "GET",
        "/ui/api/overview",
        &[("Authorization", &bearer)],
        "",
    )
    .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let page = send(f.addr, "GET", "/ui", &[], "").await;
    assert_eq!(page.status, 303, "{page:?}");
    assert_eq!(page.header("location"), Some("/ui/login"));
    assert_eq!(send(f.addr, "GET", "/ui/login", &[], "").await.status, 200);
    assert_eq!(
        send(f.addr, "GET", "/ui/console.css", &[], "").await.status,
        200
    );
    // An action with a right CSRF token but no credentials stops at the token.
    let refused = f.retry(&f.page_headers(&f.cookie)).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(f.state().await, "dead");

    let form = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Origin", f.origin.as_str()),
    ];
    let bad_login = send(f.addr, "POST", "/ui/login", &form, "token=wrong").await;
    assert_eq!(bad_login.status, 401, "{bad_login:?}");
    assert!(bad_login.header("set-cookie").is_none());
    let login = send(
        f.addr,
        "POST",
        "/ui/login",
        &form,
        &format!("token={token}"),
    )
    .await;
    assert_eq!(login.status, 303, "{login:?}");
    let session = login
        .header("set-cookie")
        .and_then(|c| c.split(';').next())
        .expect("session cookie")
        .to_owned();
    assert!(session.starts_with(super::guard::SESSION_COOKIE));
    let page = send(f.addr, "GET", "/ui", &[("Cookie", &session)], "").await;
    assert_eq!(page.status, 200, "{page:?}");
    let both = format!("{session}; {}", f.cookie);
    let done = f.retry(&f.page_headers(&both)).await;
    assert_eq!(done.status, 200, "{done:?}");
}

mod config;
