//! [`launcher!`]: the type and the public methods every launcher has, written once.
//!
//! A launcher is a newtype over a [`Server`](super::server::Server), e.g.
//! `pub struct Nats(Server<NatsServer>)`. Its shared instance, its private constructor, its
//! address and port, `stop`, `restart` and `is_running` all hand over to that `Server`. The
//! macro declares the type and writes those methods with docs from one template, filled in
//! with the launcher's own words: what it is (a server, a broker, an emulator), how its
//! address looks, what a stop does to clients and data, what a restart waits for.

/// Declares launcher `$ty`, a newtype over `Server<$spec>` with the attributes (docs) given
/// before it, and writes its common methods: `shared`, the private constructor and the address
/// accessor (named by the launcher), `port`, `stop`, `restart` and `is_running`.
///
/// The words after the type fill in the methods' docs, in this order:
/// - `$noun named by $env`: `server`, `broker` or `emulator`, and the environment variable
///   naming an external one for `shared`;
/// - `shared:` how tests share it (`use unique stream names`), after "Never stop it; ";
/// - `$start:` what happens to a private one on drop (`stopped and its directory removed`),
///   then optionally a sentence more;
/// - `$url:` the whole doc of the address accessor;
/// - `stop:` the sentence(s) on what clients see and what is kept or lost;
/// - `restart:` how it comes back (`with the same data`, `empty`), after "It comes back ",
///   then what the restart waits for (`it answers PING`), after "waits until ".
macro_rules! launcher {
    (
        $(#[$attr:meta])*
        pub struct $ty:ident(Server<$spec:ident>), $noun:ident named by $env:ident;
        shared: $shared:literal; $start:ident: $on_drop:literal $(, $start_more:literal)?;
        $url:ident: $url_doc:literal; stop: $stop:literal;
        restart: $back:literal, $ready:literal;
    ) => {
        $(#[$attr])*
        #[derive(Debug)]
        pub struct $ty($crate::services::server::Server<$spec>);

        impl $ty {
            #[doc = concat!(
                "The ", stringify!($noun), " shared by every test of this process: the one ",
                "named by [`", stringify!($env), "`] when it is set, otherwise one started on ",
                "first use that stops when the process exits (also when it is killed). Never ",
                "stop it; ", $shared, "."
            )]
            pub async fn shared() -> anyhow::Result<&'static $ty> {
                static SHARED: tokio::sync::OnceCell<$ty> = tokio::sync::OnceCell::const_new();
                $crate::services::server::Server::shared(&SHARED, $ty).await
            }

            #[doc = concat!(
                "A private ", stringify!($noun), " owned by the returned value, which may stop ",
                "and restart it (", $on_drop, " on drop).", $(" ", $start_more)?
            )]
            pub async fn $start() -> anyhow::Result<$ty> {
                $crate::services::server::Server::start().await.map($ty)
            }

            #[doc = $url_doc]
            pub fn $url(&self) -> &str {
                self.0.url()
            }

            #[doc = concat!(
                "The port clients connect to: the one in [`", stringify!($ty), "::",
                stringify!($url), "`]."
            )]
            pub fn port(&self) -> u16 {
                self.0.port()
            }

            #[doc = concat!(
                "Stops a private ", stringify!($noun), " and waits until it has exited. ", $stop,
                " Refused for the shared ", stringify!($noun), " and for an external one."
            )]
            pub async fn stop(&self) -> anyhow::Result<()> {
                self.0.stop().await
            }

            #[doc = concat!(
                "Starts a private ", stringify!($noun), " again on the same port, stopping it ",
                "first if it is running, and waits until ", $ready, ". It comes back ", $back, "."
            )]
            pub async fn restart(&self) -> anyhow::Result<()> {
                self.0.restart().await
            }

            #[doc = concat!(
                "True while this ", stringify!($noun), " is running, if this process started it ",
                "(always true for an external one)."
            )]
            pub fn is_running(&self) -> bool {
                self.0.is_running()
            }
        }
    };
}

pub(crate) use launcher;
