//! [`SerialProxy`]: an HTTP proxy on 127.0.0.1 that forwards one request at a time to a test
//! server. moto's server handles requests in parallel without locking; a stream read that
//! runs while a canceled `TransactWriteItems` is being undone can see records that never
//! committed. Clients of a test that writes and reads concurrently go through this proxy, so
//! the server sees what a real service guarantees: each request atomic.

use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct SerialProxy {
    url: String,
    task: JoinHandle<()>,
}

#[derive(Clone)]
struct Upstream {
    base: String,
    client: reqwest::Client,
    one_at_a_time: Arc<Mutex<()>>,
}

impl SerialProxy {
    /// A proxy in front of `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let state = Upstream {
            base: upstream.trim_end_matches('/').to_owned(),
            client: reqwest::Client::builder()
                .build()
                .context("building the proxy's client")?,
            one_at_a_time: Arc::new(Mutex::new(())),
        };
        let app = Router::new().fallback(forward).with_state(state);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, task })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for SerialProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    State(up): State<Upstream>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let _one = up.one_at_a_time.lock().await;
    pass_through(&up.client, &up.base, method, &uri, &headers, body).await
}

/// Sends the request to `base` as it came (less `host` and `content-length`) and answers
/// what `base` answered; `502` when it could not be reached.
pub(crate) async fn pass_through(
    client: &reqwest::Client,
    base: &str,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut request = client.request(method, format!("{base}{path}"));
    for (name, value) in headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    let answer = match request.body(body).send().await {
        Ok(answer) => answer,
        Err(e) => {
            return Response::builder()
                .status(StatusCode::BAD_GATEWAY)
                .body(Body::from(e.to_string()))
                .unwrap_or_default();
        }
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if name != "content-length" && name != "transfer-encoding" {
            response = response.header(name, value);
        }
    }
    let body = answer.bytes().await.unwrap_or_default();
    response.body(Body::from(body)).unwrap_or_default()
}
