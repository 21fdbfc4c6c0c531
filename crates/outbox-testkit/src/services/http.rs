//! [`HttpReceiver`]: a real HTTP server on 127.0.0.1 that records every request and answers
//! with a scripted status, for webhook sink tests (acks, retries, dead letters, outages).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::lock;

/// One request as the receiver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Arrival order, from 0.
    pub seq: usize,
    /// `POST`, `GET`, ...
    pub method: String,
    /// Path and query, e.g. `/hooks/orders?x=1`.
    pub path: String,
    /// Headers in arrival order, names in lower case; non-UTF-8 values are converted lossily.
    pub headers: Vec<(String, String)>,
    /// The body bytes exactly as received.
    pub body: Bytes,
    /// The status the receiver answered (or was about to answer when it was stopped). A
    /// [`HttpReceiver::respond_when`] rule sees 0 here: the status is not decided yet.
    pub status: u16,
}

impl Request {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).context("request body is not JSON")
    }

    /// True when the receiver answered 2xx (the sender counts the message as delivered).
    pub fn accepted(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

type Rule = Box<dyn Fn(&Request) -> Option<u16> + Send + Sync>;

struct Script {
    default_status: u16,
    /// Statuses for the next requests, one each, before the default applies again.
    next: VecDeque<u16>,
    rules: Vec<Rule>,
    delay: Duration,
}

struct Shared {
    script: Mutex<Script>,
    received: Mutex<Vec<Request>>,
    /// Bumped after each recorded request (never while holding a lock above).
    changed: watch::Sender<u64>,
    /// False while answers are held ([`HttpReceiver::hold_answers`]).
    answering: watch::Sender<bool>,
    /// Requests recorded but not answered yet, by a key unique for the receiver's life.
    unanswered: Mutex<BTreeMap<u64, Request>>,
    next_key: std::sync::atomic::AtomicU64,
}

struct Running {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A recording HTTP server with a scriptable answer.
///
/// Answers, in this order of precedence: the first [`respond_when`](Self::respond_when) /
/// [`reject_when_header`](Self::reject_when_header) rule that matches, then the statuses queued
/// by [`fail_next`](Self::fail_next), then the default ([`respond_with`](Self::respond_with),
/// 200 at first). Every request is recorded, whatever the answer.
///
/// ```no_run
/// # async fn example() -> anyhow::Result<()> {
/// use std::time::Duration;
/// use outbox_testkit::services::HttpReceiver;
///
/// let hooks = HttpReceiver::start().await?;
/// hooks.fail_next(2, 503);                      // two retries, then 200
/// // ... point the webhook sink at hooks.url() and publish ...
/// let got = hooks.wait_for_accepted(1, Duration::from_secs(5)).await?;
/// # Ok(()) }
/// ```
pub struct HttpReceiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: Mutex<Option<Running>>,
}

impl std::fmt::Debug for HttpReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpReceiver")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl HttpReceiver {
    /// Starts a receiver on a free port of 127.0.0.1.
    pub async fn start() -> anyhow::Result<HttpReceiver> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (changed, _) = watch::channel(0);
        let (answering, _) = watch::channel(true);
        let receiver = HttpReceiver {
            addr,
            shared: Arc::new(Shared {
                script: Mutex::new(Script {
                    default_status: 200,
                    next: VecDeque::new(),
                    rules: Vec::new(),
                    delay: Duration::ZERO,
                }),
                received: Mutex::new(Vec::new()),
                changed,
                answering,
                unanswered: Mutex::new(BTreeMap::new()),
                next_key: std::sync::atomic::AtomicU64::new(0),
            }),
            server: Mutex::new(None),
        };
        receiver.serve(listener);
        Ok(receiver)
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL of `path` on this receiver (`path` starts with `/`).
    pub fn url_for(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers every request with `status` from now on (unless a rule or a queued status
    /// applies).
    pub fn respond_with(&self, status: u16) {
        lock(&self.shared.script).default_status = valid(status);
    }

    /// Answers the next `n` requests with `status`, then the default again.
    pub fn fail_next(&self, n: usize, status: u16) {
        let status = valid(status);
        lock(&self.shared.script)
            .next
            .extend(std::iter::repeat_n(status, n));
    }

    /// Answers `status` to every request whose header `name` has the value `value`
    /// (e.g. the `outbox-aggregate_id` of a poison event).
    pub fn reject_when_header(&self, name: &str, value: &str, status: u16) {
        let (name, value, status) = (name.to_owned(), value.to_owned(), valid(status));
        self.respond_when(move |r| (r.header(&name) == Some(value.as_str())).then_some(status));
    }

    /// Adds a rule: when `rule` returns a status for a request, that is the answer. Rules are
    /// tried in the order they were added; the first that answers wins.
    pub fn respond_when(&self, rule: impl Fn(&Request) -> Option<u16> + Send + Sync + 'static) {
        lock(&self.shared.script).rules.push(Box::new(rule));
    }

    /// Removes every rule and queued status and answers 200 again.
    pub fn reset_script(&self) {
        let mut script = lock(&self.shared.script);
        script.rules.clear();
        script.next.clear();
        script.default_status = 200;
    }

    /// Waits this long before answering each request (after recording it), to simulate a slow
    /// endpoint. `Duration::ZERO` turns it off.
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.shared.script).delay = delay;
    }

    /// Holds every answer (requests are still received and recorded) until
    /// [`release_answers`](Self::release_answers): a sender is then known to be waiting for
    /// its acknowledgements, with everything it sent already here.
    pub fn hold_answers(&self) {
        self.shared.answering.send_replace(false);
    }

    /// Answers the held requests and stops holding.
    pub fn release_answers(&self) {
        self.shared.answering.send_replace(true);
    }

    /// The requests recorded and not answered yet (waiting out a delay or a hold, or gone
    /// with a sender that hung up mid-wait), in arrival order.
    pub fn unanswered(&self) -> Vec<Request> {
        lock(&self.shared.unanswered).values().cloned().collect()
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<Request> {
        lock(&self.shared.received).clone()
    }

    /// Forgets the requests received so far (sequence numbers keep counting from 0 again).
    pub fn clear_received(&self) {
        lock(&self.shared.received).clear();
    }

    /// Waits until at least `n` requests arrived; returns all of them. On timeout the error
    /// lists what did arrive.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> anyhow::Result<Vec<Request>> {
        self.wait_until(&format!("{n} requests"), timeout, |r| r.len() >= n)
            .await
    }

    /// Waits until at least `n` requests were answered 2xx; returns all requests.
    pub async fn wait_for_accepted(
        &self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Request>> {
        self.wait_until(&format!("{n} accepted (2xx) requests"), timeout, |r| {
            r.iter().filter(|r| r.accepted()).count() >= n
        })
        .await
    }

    /// Waits until `done` holds for the requests received so far (checked on every arrival,
    /// no polling); returns them. `what` names the condition in the timeout error.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[Request]) -> bool,
    ) -> anyhow::Result<Vec<Request>> {
        let mut changes = self.shared.changed.subscribe();
        let check = |_: &u64| done(&lock(&self.shared.received));
        let done = matches!(
            tokio::time::timeout(timeout, changes.wait_for(check)).await,
            Ok(Ok(_))
        );
        let got = self.received();
        if done {
            return Ok(got);
        }
        let summary: Vec<String> = got
            .iter()
            .map(|r| {
                let (seq, method, path, status) = (r.seq, &r.method, &r.path, r.status);
                format!(
                    "#{seq} {method} {path} -> {status} ({} bytes)",
                    r.body.len()
                )
            })
            .collect();
        anyhow::bail!(
            "waited {timeout:?} for {what} at {}; got {}:\n{}",
            self.url(),
            got.len(),
            summary.join("\n")
        )
    }

    /// Simulates an outage: closes the listening socket and drops every open connection
    /// (requests in flight get no answer). Clients see "connection refused" until
    /// [`restart`](Self::restart).
    pub async fn stop(&self) {
        let running = lock(&self.server).take();
        if let Some(running) = running {
            running.stop.cancel();
            let _ = running.task.await;
        }
    }

    /// Listens again on the same port (stopping first if running). The script and the recorded
    /// requests are kept.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.stop().await;
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket
            .bind(self.addr)
            .with_context(|| format!("binding {} again", self.addr))?;
        let listener = socket.listen(1024)?;
        self.serve(listener);
        Ok(())
    }

    /// True while the receiver is listening.
    pub fn is_running(&self) -> bool {
        lock(&self.server).is_some()
    }

    fn serve(&self, listener: TcpListener) {
        let router = Router::new()
            .fallback(record)
            .with_state(self.shared.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(accept_loop(listener, router, stop.clone()));
        *lock(&self.server) = Some(Running { stop, task });
    }
}

impl Drop for HttpReceiver {
    fn drop(&mut self) {
        if let Some(running) = lock(&self.server).take() {
            running.stop.cancel();
            running.task.abort();
        }
    }
}

/// Accepts connections until `stop`, then drops the listener and every connection.
/// (`axum::serve` would leave accepted connections running after shutdown, which is not an
/// outage.)
async fn accept_loop(listener: TcpListener, router: Router, stop: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let service = TowerToHyperService::new(router.clone());
                    connections.spawn(async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Err(e) => {
                    // Out of file descriptors or similar: wait a moment instead of spinning.
                    tracing::warn!(error = %e, "HttpReceiver accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}

async fn record(
    AxumState(shared): AxumState<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let mut request = Request {
        seq: 0,
        method: method.to_string(),
        path: uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), |p| p.to_string()),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body,
        status: 0,
    };
    let delay = {
        // One lock for deciding and recording, so answers follow arrival order.
        let mut script = lock(&shared.script);
        let status = script
            .rules
            .iter()
            .find_map(|rule| rule(&request))
            .or_else(|| script.next.pop_front())
            .unwrap_or(script.default_status);
        request.status = status;
        let mut received = lock(&shared.received);
        request.seq = received.len();
        received.push(request.clone());
        script.delay
    };
    shared.changed.send_modify(|n| *n += 1);
    // Listed as unanswered until this handler ends (answered, or dropped with its connection).
    let key = shared
        .next_key
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    lock(&shared.unanswered).insert(key, request.clone());
    let _answered = Unlist(&shared, key);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut answering = shared.answering.subscribe();
    // The sender is gone only if the receiver is: then answer at once.
    let _ = answering.wait_for(|open| *open).await;
    StatusCode::from_u16(request.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

struct Unlist<'a>(&'a Shared, u64);

impl Drop for Unlist<'_> {
    fn drop(&mut self) {
        lock(&self.0.unanswered).remove(&self.1);
    }
}

fn valid(status: u16) -> u16 {
    assert!(
        (100..=999).contains(&status),
        "invalid HTTP status {status}"
    );
    status
}
