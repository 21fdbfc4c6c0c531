//! [`Front`]: a TCP forwarder that clients reach instead of tansu, so that a test can cut
//! them off (an outage) and let them back while the broker keeps its data.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::lock;

/// A TCP forwarder on the advertised port in front of tansu's own port.
#[derive(Debug)]
pub(super) struct Front {
    port: u16,
    target: u16,
    serving: Mutex<Option<JoinHandle<()>>>,
}

impl Front {
    /// Binds a free port on 127.0.0.1 and starts forwarding it to `127.0.0.1:target`, on the
    /// Tokio runtime that calls this.
    pub(super) async fn bind(target: u16) -> anyhow::Result<Front> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the Kafka front on 127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(forward(listener, target));
        Ok(Front {
            port,
            target,
            serving: Mutex::new(Some(task)),
        })
    }

    /// The port clients connect to.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// Drops every connection and stops listening (connects are refused).
    pub(super) async fn cut(&self) {
        let serving = lock(&self.serving).take();
        if let Some(task) = serving {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens on the same port again (after [`Front::cut`]) and forwards it.
    pub(super) async fn restore(&self) -> anyhow::Result<()> {
        if lock(&self.serving).is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(listener) => break listener,
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| {
                        format!("binding the Kafka front on 127.0.0.1:{} again", self.port)
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        *lock(&self.serving) = Some(tokio::spawn(forward(listener, self.target)));
        Ok(())
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.serving).take() {
            task.abort();
        }
    }
}

/// Accepts connections and pipes each to `127.0.0.1:target`. Aborting the task drops the
/// listener and, with the `JoinSet`, every connection.
async fn forward(listener: TcpListener, target: u16) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((mut client, _)) = accepted else { continue };
                connections.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
