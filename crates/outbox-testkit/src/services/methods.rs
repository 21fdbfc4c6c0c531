//! [`launcher_methods!`]: the public methods every launcher has, written once.
//!
//! A launcher is a newtype over a [`Server`](super::server::Server), e.g.
//! `pub struct Nats(Server<NatsServer>)`. Its shared instance, its private constructor, its
//! address and port, `stop`, `restart` and `is_running` all hand over to that `Server`; the
//! macro writes them, each with the docs the launcher gives, so that every launcher still
//! documents them in its own words (a server or a broker, what survives a restart).

/// Writes the common methods of launcher `$ty`: `shared`, the private constructor and the
/// address accessor (named by the launcher), `port`, `stop`, `restart` and `is_running`.
/// Each takes the attributes (docs) written before its name, in this order.
macro_rules! launcher_methods {
    (
        impl $ty:ident {
            $(#[$shared_doc:meta])* fn shared;
            $(#[$start_doc:meta])* fn $start:ident;
            $(#[$url_doc:meta])* fn $url:ident;
            $(#[$port_doc:meta])* fn port;
            $(#[$stop_doc:meta])* fn stop;
            $(#[$restart_doc:meta])* fn restart;
            $(#[$running_doc:meta])* fn is_running;
        }
    ) => {
        impl $ty {
            $(#[$shared_doc])*
            pub async fn shared() -> anyhow::Result<&'static $ty> {
                static SHARED: tokio::sync::OnceCell<$ty> = tokio::sync::OnceCell::const_new();
                $crate::services::server::Server::shared(&SHARED, $ty).await
            }

            $(#[$start_doc])*
            pub async fn $start() -> anyhow::Result<$ty> {
                $crate::services::server::Server::start().await.map($ty)
            }

            $(#[$url_doc])*
            pub fn $url(&self) -> &str {
                self.0.url()
            }

            $(#[$port_doc])*
            pub fn port(&self) -> u16 {
                self.0.port()
            }

            $(#[$stop_doc])*
            pub async fn stop(&self) -> anyhow::Result<()> {
                self.0.stop().await
            }

            $(#[$restart_doc])*
            pub async fn restart(&self) -> anyhow::Result<()> {
                self.0.restart().await
            }

            $(#[$running_doc])*
            pub fn is_running(&self) -> bool {
                self.0.is_running()
            }
        }
    };
}

pub(crate) use launcher_methods;
