//! The web console at `/ui`, served by the `[metrics]` listener: backlog, oldest pending age,
//! throughput and p99 commit→ack latency over the last hour, the sink's state, dead letters
//! (browse, filter, show; retry and purge with `[ui] allow_actions = true`) and `why` for one
//! event; with actions on, a reload of the configuration (`POST /ui/api/reload`).
//!
//! Server-rendered HTML with a small vanilla script that polls `/ui/api/overview` and draws
//! the charts as inline SVG; the assets are compiled into the binary (no CDN, no build step,
//! works offline). Who may do what: `guard`. The charts' data: `history`. The JSON
//! endpoints: `api`. `docs/observability.md` is the operator's guide.

mod api;
mod guard;
mod history;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use outbox_core::backend::Backend;
use outbox_core::source::Backlog;
use time::OffsetDateTime;

use crate::config::Config;
use crate::readiness::Readiness;
use crate::registry::SinkConfig;
use history::{Counters, History};

pub use crate::config::UiConfig;

/// The last broker healthcheck, for the sinks table.
#[derive(Debug, Clone, Default)]
struct SinkCheck {
    /// The sink's own name (`http`, `nats`, ...), once built.
    name: Option<String>,
    /// When it was checked.
    at: Option<OffsetDateTime>,
    /// Its error, when it failed.
    error: Option<String>,
    /// Whether it passed.
    ok: Option<bool>,
}

/// The console's state, shared by its handlers and fed by the watchdog.
pub struct Console {
    ui: UiConfig,
    listen: SocketAddr,
    refresh: Duration,
    /// The running configuration's `[sink]` (a reload replaces it).
    sink: Mutex<SinkConfig>,
    prometheus: PrometheusHandle,
    readiness: Arc<Readiness>,
    keys: guard::Keys,
    backend: OnceLock<Arc<dyn Backend>>,
    history: Mutex<History>,
    sink_check: Mutex<SinkCheck>,
    /// The running configuration's canary, if `[canary]` is on (a reload replaces it).
    canary: Mutex<Option<crate::canary::SharedStatus>>,
    /// Asks the relay to reload (the `outbox relay` command; not an embedded relay).
    reloads: OnceLock<crate::reload::Reloads>,
    /// The running configuration's generation: 1 at start, +1 per applied reload.
    generation: AtomicU64,
    started: OffsetDateTime,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("listen", &self.listen)
            .field("allow_actions", &self.ui.allow_actions)
            .field("token", &self.ui.token.is_some())
            .field("backend", &self.backend.get().map(|b| b.label()))
            .finish_non_exhaustive()
    }
}

impl Console {
    /// The console of `config` on `listen`, if `/ui` is on.
    pub(crate) fn from_config(
        config: &Config,
        listen: SocketAddr,
        prometheus: PrometheusHandle,
        readiness: Arc<Readiness>,
    ) -> Option<Arc<Self>> {
        let mut metrics = config.metrics.clone();
        metrics.listen = Some(listen);
        if !config.ui.active(&metrics) {
            return None;
        }
        Some(Arc::new(Self {
            ui: config.ui.clone(),
            listen,
            refresh: config.metrics.refresh_interval,
            sink: Mutex::new(config.sink.clone()),
            prometheus,
            readiness,
            keys: guard::Keys::new(config.ui.token.clone()),
            backend: OnceLock::new(),
            history: Mutex::new(History::default()),
            sink_check: Mutex::new(SinkCheck::default()),
            canary: Mutex::new(None),
            reloads: OnceLock::new(),
            generation: AtomicU64::new(1),
            started: OffsetDateTime::now_utc(),
        }))
    }

    /// The database the dead-letter and `why` views read, once the relay opened it.
    pub(crate) fn attach_backend(&self, backend: Arc<dyn Backend>) {
        let _ = self.backend.set(backend);
    }

    /// The canary's status, for its tile (`[canary]` on).
    pub(crate) fn attach_canary(&self, status: crate::canary::SharedStatus) {
        *lock(&self.canary) = Some(status);
    }

    /// The reload switch, for `POST /ui/api/reload`.
    pub(crate) fn attach_reloads(&self, reloads: crate::reload::Reloads) {
        let _ = self.reloads.set(reloads);
    }

    /// A reload applied `config` as `generation`: the views follow its sink; the canary
    /// tile waits for the new pipelines' canary.
    pub(crate) fn follow(&self, config: &Config, generation: u64) {
        *lock(&self.sink) = config.sink.clone();
        *lock(&self.canary) = None;
        self.generation.store(generation, Ordering::Relaxed);
    }

    /// The running configuration's `[sink]`.
    pub(crate) fn sink(&self) -> SinkConfig {
        lock(&self.sink).clone()
    }

    /// Adds a chart sample: `backlog` just read, and the counters the relay recorded.
    pub(crate) fn record(&self, backlog: &Backlog) {
        let counters = Counters::parse(&self.prometheus.render());
        let t = unix_ms(OffsetDateTime::now_utc());
        self.history
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(t, backlog, counters);
    }

    /// Records the sink `name`'s healthcheck.
    pub(crate) fn record_sink_check(&self, name: &str, result: Result<(), String>) {
        let mut check = self
            .sink_check
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        check.name = Some(name.to_owned());
        check.at = Some(OffsetDateTime::now_utc());
        check.ok = Some(result.is_ok());
        check.error = result.err();
    }

    /// The routes under `/ui`.
    pub(crate) fn routes(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/ui", get(page))
            .route("/ui/", get(|| async { Redirect::permanent("/ui") }))
            .route("/ui/login", get(login_form).post(login))
            .route("/ui/console.js", get(script))
            .route("/ui/console.css", get(stylesheet))
            .route("/ui/api/overview", get(api::overview))
            .route("/ui/api/dead", get(api::dead_list))
            .route("/ui/api/events/{id}", get(api::event))
            .route("/ui/api/why/{id}", get(api::why))
            .route("/ui/api/dead/retry", post(api::retry))
            .route("/ui/api/dead/purge", post(api::purge))
            .route("/ui/api/reload", post(api::reload))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                guard::guard,
            ))
            .with_state(self.clone())
    }
}

/// The value behind `mutex`, also after a panic elsewhere (plain data, always whole).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Unix time in milliseconds.
fn unix_ms(t: OffsetDateTime) -> i64 {
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// The page, the script and the stylesheet, compiled in.
const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/console.js");
const STYLESHEET: &str = include_str!("assets/console.css");

/// Text for HTML (element content and quoted attribute values).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Headers every console response carries (added by [`guard::guard`]): no framing, no inline
/// script, no sniffing, no caching.
fn page_headers() -> [(header::HeaderName, &'static str); 5] {
    [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ]
}

/// `GET /ui`: the page, with what it needs to know rendered in (the CSRF token in a meta tag
/// and a `SameSite=Strict` cookie).
async fn page(State(console): State<Arc<Console>>) -> Response {
    let (source, table) = match console.backend.get() {
        Some(b) => (b.label(), b.table()),
        None => ("starting".to_owned(), String::new()),
    };
    let html = PAGE
        .replace("{{csrf}}", &escape(&console.keys.csrf))
        .replace(
            "{{actions}}",
            if console.ui.allow_actions {
                "on"
            } else {
                "off"
            },
        )
        .replace(
            "{{refresh_ms}}",
            &console.refresh.as_millis().max(1).to_string(),
        )
        .replace("{{source}}", &escape(&source))
        .replace("{{table}}", &escape(&table))
        .replace("{{sink}}", &escape(console.sink().kind()));
    let csrf_cookie = format!(
        "{}={}; Path=/ui; HttpOnly; SameSite=Strict",
        guard::CSRF_COOKIE,
        console.keys.csrf
    );
    ([(header::SET_COOKIE, csrf_cookie)], Html(html)).into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        STYLESHEET,
    )
        .into_response()
}

/// The login form (only reached when `[ui] token` is set).
fn login_page(status: StatusCode, note: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>outbox console: log in</title><link rel=\"stylesheet\" href=\"/ui/console.css\"></head><body><main class=\"login\"><h1>outbox console</h1><p>{}</p><form method=\"post\" action=\"/ui/login\"><label>token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus></label> <button type=\"submit\">log in</button></form></main></body></html>",
        escape(note)
    );
    (status, Html(html)).into_response()
}

async fn login_form() -> Response {
    login_page(
        StatusCode::OK,
        "This console needs the token set in [ui] token.",
    )
}

/// The login form's fields.
#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

/// `POST /ui/login`: the right token sets the session cookie.
async fn login(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LoginForm>,
) -> Response {
    let Some(token) = &console.keys.token else {
        return Redirect::to("/ui").into_response();
    };
    if headers.contains_key(header::ORIGIN) && !guard::same_origin(&headers) {
        return guard::refuse(StatusCode::FORBIDDEN, "refused: cross-site login");
    }
    if !guard::same_secret(form.token.trim(), token.expose()) {
        tracing::warn!("console login with a wrong token");
        return login_page(StatusCode::UNAUTHORIZED, "Wrong token.");
    }
    let cookie = format!(
        "{}={}; Path=/ui; HttpOnly; SameSite=Strict",
        guard::SESSION_COOKIE,
        console.keys.session
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui")).into_response()
}
