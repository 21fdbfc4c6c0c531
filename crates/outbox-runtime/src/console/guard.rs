//! Who may use `/ui`, and which requests may change anything.
//!
//! - **Host.** While the listener is on loopback (the default, and then no token is needed),
//!   a request must name a loopback host (`localhost`, `127.0.0.1`, `[::1]`): a web page that
//!   rebinds its own DNS name to 127.0.0.1 cannot read the console through the operator's
//!   browser.
//! - **Token.** With `[ui] token` set (mandatory beyond loopback), every page and endpoint but
//!   the login form and the static assets needs `Authorization: Bearer TOKEN` or the session
//!   cookie the login form sets (`HttpOnly`, `SameSite=Strict`, a per-process random value:
//!   a restart logs everyone out).
//! - **Actions** (retry, purge) need `[ui] allow_actions = true`, an `Origin` equal to the
//!   request's own host, the per-process CSRF token twice (in the `x-outbox-csrf` header and
//!   in the `SameSite=Strict` cookie the page set), and a JSON body. Anything else is refused
//!   (403; 415 for another content type) before the database is touched.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use outbox_sinks::Secret;

use super::Console;

/// The session cookie the login form sets.
pub(crate) const SESSION_COOKIE: &str = "outbox_ui_session";
/// The CSRF cookie the page sets.
pub(crate) const CSRF_COOKIE: &str = "outbox_csrf";
/// The header actions carry the CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-outbox-csrf";

/// The per-process secrets.
#[derive(Debug)]
pub(crate) struct Keys {
    /// `[ui] token`, when set.
    pub(crate) token: Option<Secret>,
    /// The value of the session cookie.
    pub(crate) session: String,
    /// The CSRF token.
    pub(crate) csrf: String,
}

impl Keys {
    pub(crate) fn new(token: Option<Secret>) -> Self {
        Self {
            token,
            session: random_hex(32),
            csrf: random_hex(32),
        }
    }
}

/// `n` random bytes as hex, from rand's thread generator (a CSPRNG seeded by the operating
/// system).
fn random_hex(n: usize) -> String {
    use rand::RngCore;
    let mut bytes = vec![0u8; n];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name`, if the request carries it.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// Whether `host` (a `Host` header: `name[:port]`) names this machine's loopback.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.split(':').next().unwrap_or("")
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A refusal or failure, answered as `{"error": MESSAGE}` with its status.
#[derive(Debug)]
pub(crate) struct Refusal(pub(crate) StatusCode, pub(crate) String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, axum::Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

/// A refusal as a response.
pub(crate) fn refuse(status: StatusCode, message: &str) -> Response {
    Refusal(status, message.to_owned()).into_response()
}

/// Whether the request is authenticated (always, when no token is configured).
pub(crate) fn authenticated(keys: &Keys, headers: &HeaderMap) -> bool {
    let Some(token) = &keys.token else {
        return true;
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| same_secret(t.trim(), token.expose()));
    bearer || cookie(headers, SESSION_COOKIE).is_some_and(|s| same_secret(s, &keys.session))
}

/// The `Origin` check: present, and naming the host the request was sent to.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    match (host, origin) {
        (Some(host), Some(origin)) => {
            origin == format!("http://{host}") || origin == format!("https://{host}")
        }
        _ => false,
    }
}

/// Every check an action (retry, purge) passes before it runs; `Err` is the 403 to send.
pub(crate) fn check_action(console: &Console, headers: &HeaderMap) -> Result<(), Refusal> {
    if !console.ui.allow_actions {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "actions are off: set [ui] allow_actions = true to retry, purge and reload from the console"
                .to_owned(),
        ));
    }
    if !same_origin(headers) {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "refused: the Origin header is missing or names another site".to_owned(),
        ));
    }
    let keys = &console.keys;
    let header_ok = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| same_secret(t, &keys.csrf));
    let cookie_ok = cookie(headers, CSRF_COOKIE).is_some_and(|t| same_secret(t, &keys.csrf));
    if !(header_ok && cookie_ok) {
        return Err(Refusal(
            StatusCode::FORBIDDEN,
            "refused: missing or wrong CSRF token (reload the page)".to_owned(),
        ));
    }
    // A cross-site form can post text/plain without a preflight; JSON it cannot.
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json {
        return Err(Refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type: application/json".to_owned(),
        ));
    }
    Ok(())
}

/// Middleware for every `/ui` route: the host check, then the token (except for the login
/// form and the static assets).
pub(crate) async fn guard(
    State(console): State<Arc<Console>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    if console.listen.ip().is_loopback() {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !is_loopback_host(host) {
            return refuse(
                StatusCode::FORBIDDEN,
                "refused: the console listens on loopback and answers only requests for localhost, 127.0.0.1 or [::1]",
            );
        }
    }
    let path = request.uri().path();
    let public = matches!(
        path,
        "/ui/login" | "/ui/console.css" | "/ui/console.js" | "/ui/favicon.svg"
    );
    let mut response = if !public && !authenticated(&console.keys, headers) {
        if path.starts_with("/ui/api/") {
            refuse(
                StatusCode::UNAUTHORIZED,
                "the console needs [ui] token: send Authorization: Bearer TOKEN or log in at /ui/login",
            )
        } else {
            Redirect::to("/ui/login").into_response()
        }
    } else {
        next.run(request).await
    };
    for (name, value) in super::page_headers() {
        response
            .headers_mut()
            .entry(name)
            .or_insert(header::HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_recognised_and_others_are_not() {
        for host in [
            "localhost:9187",
            "127.0.0.1:9187",
            "127.0.0.1",
            "[::1]:9187",
            "LOCALHOST",
            "app.localhost:1",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example:9187",
            "10.0.0.1:9187",
            "",
            "[::2]:1",
            "localhost.evil",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn cookies_are_found_by_name_among_several() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; outbox_csrf=xyz; b=2".parse().expect("valid"),
        );
        assert_eq!(cookie(&h, CSRF_COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, SESSION_COOKIE), None);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        let k = Keys::new(None);
        assert_eq!(k.csrf.len(), 64);
        assert_ne!(k.csrf, k.session);
    }

    #[test]
    fn the_origin_must_be_the_requests_own_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:9187".parse().expect("valid"));
        assert!(!same_origin(&h), "no Origin");
        h.insert(
            header::ORIGIN,
            "http://evil.example".parse().expect("valid"),
        );
        assert!(!same_origin(&h));
        h.insert(
            header::ORIGIN,
            "http://127.0.0.1:9187".parse().expect("valid"),
        );
        assert!(same_origin(&h));
    }
}
