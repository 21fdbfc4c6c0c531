//! [`Forwarder`]: a switchable TCP forwarder on 127.0.0.1, the stable address (a virtual IP, a
//! DNS name) that clients of a replicated database use. A failover test points it at the
//! primary, then moves it to the promoted standby with [`Forwarder::switch_to`].
//!
//! On a switch, the connections made through the old target either close at once
//! ([`OnSwitch::Close`]: the old server's machine answers with a reset, or a proxy drops them)
//! or hang silently ([`OnSwitch::Hang`]: a dead machine that sends neither FIN nor RST; the
//! client's reads wait and its writes fill the socket buffer until its own timeouts fire).
//! New connections go to the current target; one that target refuses is reset at once. For a
//! machine that vanished, [`Forwarder::blackhole`] holds new connections silently too (the
//! client's own connect timeout ends them), until the next switch sends them somewhere.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::lock;

/// How long a new connection waits for the target to accept it before it is closed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What becomes of the connections to the old target when the forwarder switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnSwitch {
    /// Both sides are closed: clients see the connection end (EOF or a reset) at once.
    Close,
    /// Forwarding stops and both sockets stay open: the client hears nothing more, as from a
    /// machine that died, until [`Forwarder::release_hung`] or the forwarder is dropped.
    /// Switch before the old server goes down: a close it sent first has reached the client.
    Hang,
}

/// A running forwarder; stops, closing every connection, when dropped.
///
/// ```no_run
/// # async fn example(primary: std::net::SocketAddr, standby: std::net::SocketAddr) -> anyhow::Result<()> {
/// use outbox_testkit::forwarder::{Forwarder, OnSwitch};
///
/// let vip = Forwarder::start(primary).await?;
/// let url = format!("postgres://postgres@{}/app", vip.addr()); // what every client uses
/// // ... the primary dies, the standby is promoted ...
/// vip.switch_to(standby, OnSwitch::Close);
/// # let _ = url; Ok(()) }
/// ```
#[derive(Debug)]
pub struct Forwarder {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Sockets held silently: connections a switch left hanging (both sides), new ones while
    /// blackholed (the client side).
    hung: Mutex<Vec<TcpStream>>,
    /// Cancelled when the forwarder is dropped: every connection ends.
    closed: CancellationToken,
}

#[derive(Debug)]
struct State {
    /// `None`: blackholed.
    target: Option<SocketAddr>,
    /// The connections made to `target`; ended by the next switch.
    generation: Arc<Generation>,
    accepted: u64,
    refused: u64,
}

/// The connections made to one target.
#[derive(Debug, Default)]
struct Generation {
    /// Cancelled by the switch away from the target.
    ended: CancellationToken,
    /// What the connections do then, set before `ended` is cancelled.
    how: OnceLock<OnSwitch>,
}

impl Forwarder {
    /// Starts forwarding a free port of 127.0.0.1 to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Forwarder> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding 127.0.0.1:0 for the forwarder")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                target: Some(target),
                generation: Arc::default(),
                accepted: 0,
                refused: 0,
            }),
            hung: Mutex::new(Vec::new()),
            closed: CancellationToken::new(),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Forwarder {
            addr,
            shared,
            accept,
        })
    }

    /// `127.0.0.1:PORT`: the address clients use.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients use on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Where new connections go now (`None` while blackholed).
    pub fn target(&self) -> Option<SocketAddr> {
        lock(&self.shared.state).target
    }

    /// Sends new connections to `target` from now on; the connections made before are
    /// closed or left hanging, as `existing` says. Returns at once (a closed connection's
    /// task finishes in the background).
    pub fn switch_to(&self, target: SocketAddr, existing: OnSwitch) {
        self.switch(Some(target), existing);
    }

    /// The address leads nowhere, as when its machine vanished: new connections are accepted
    /// and then hear nothing (their client's connect or read timeout ends them); the
    /// connections made before are closed or left hanging, as `existing` says.
    pub fn blackhole(&self, existing: OnSwitch) {
        self.switch(None, existing);
    }

    fn switch(&self, target: Option<SocketAddr>, existing: OnSwitch) {
        let mut state = lock(&self.shared.state);
        let _ = state.generation.how.set(existing);
        state.generation.ended.cancel();
        state.generation = Arc::default();
        state.target = target;
        tracing::info!(?target, ?existing, forwarder = %self.addr, "forwarder switched");
    }

    /// Closes the connections a switch (or the blackhole) left hanging.
    pub fn release_hung(&self) {
        lock(&self.shared.hung).clear();
    }

    /// How many sockets a switch (or the blackhole) left hanging and are still held.
    pub fn hung(&self) -> usize {
        lock(&self.shared.hung).len()
    }

    /// Connections accepted so far, and how many of them the target refused.
    pub fn accepted(&self) -> (u64, u64) {
        let state = lock(&self.shared.state);
        (state.accepted, state.refused)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.closed.cancel();
        self.release_hung();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                // Out of file descriptors, say: try again shortly rather than stop forwarding.
                tracing::warn!(error = %e, "forwarder: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (target, generation) = {
            let mut state = lock(&shared.state);
            state.accepted += 1;
            (state.target, state.generation.clone())
        };
        tokio::spawn(forward(client, target, generation, shared.clone()));
    }
}

/// Pipes one client connection to `target` until either side closes, the forwarder is
/// dropped, or a switch ends `generation`.
async fn forward(
    mut client: TcpStream,
    target: Option<SocketAddr>,
    generation: Arc<Generation>,
    shared: Arc<Shared>,
) {
    let Some(target) = target else {
        lock(&shared.hung).push(client);
        return;
    };
    let upstream = tokio::select! {
        connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)) => {
            connected.ok().and_then(Result::ok)
        }
        () = generation.ended.cancelled() => None,
        () = shared.closed.cancelled() => None,
    };
    let Some(mut upstream) = upstream else {
        lock(&shared.state).refused += 1;
        // A reset, as close as a forwarder gets to the refused connection a client would get
        // from the target itself. (Deprecated because a lingering close blocks; a zero linger
        // sends the reset at once.)
        #[allow(deprecated)]
        let _ = client.set_linger(Some(Duration::ZERO));
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let switched = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => false,
        () = generation.ended.cancelled() => true,
        () = shared.closed.cancelled() => false,
    };
    if switched && generation.how.get() == Some(&OnSwitch::Hang) && !shared.closed.is_cancelled() {
        lock(&shared.hung).extend([client, upstream]);
    }
}
